// Reference solution of lesson 1, part A (lesson1_amp/autocast.h).
#include "lesson1_amp/autocast.h"

#include <ATen/TensorOperators.h>  // Tensor with its methods and operators (+, *, &, ...)
#include <torch/cuda.h>

#include "common/compat/compat.h"

namespace amp {

// [underflow_fraction]
double underflow_fraction(const at::Tensor& values, c10::ScalarType low_precision) {
  TORCH_CHECK(values.defined(), "underflow_fraction: values is an undefined tensor");
  TORCH_CHECK(values.is_floating_point(), "underflow_fraction: values must be floating point, got ",
              values.scalar_type());
  TORCH_CHECK(c10::isFloatingType(low_precision), "underflow_fraction: low_precision must be a floating type, got ",
              low_precision);
  const at::Tensor candidates = values.isfinite() & values.ne(0);  // [N] bool: what could be lost
  const int64_t count = candidates.sum().item<int64_t>();
  TORCH_CHECK(count > 0, "underflow_fraction: values has no non-zero finite entry to measure");
  // The cast is where float16 rounds tiny magnitudes (below 2^-25) to exactly zero.
  const at::Tensor lost = candidates & values.to(low_precision).eq(0);
  return static_cast<double>(lost.sum().item<int64_t>()) / static_cast<double>(count);
}
// [underflow_fraction]

c10::ScalarType AutocastGuard::default_dtype(c10::DeviceType device) {
  return device == c10::DeviceType::CUDA ? c10::ScalarType::Half : c10::ScalarType::BFloat16;
}

// No dtype: the one set for the device now (an outer guard's), as Python's torch.autocast(device) does. Before
// any guard that is the device's usual dtype.
AutocastGuard::AutocastGuard(c10::DeviceType device, bool enabled)
    : AutocastGuard(device, workshop::compat::autocast_dtype(device), enabled) {}

// [guard_enter]
AutocastGuard::AutocastGuard(c10::DeviceType device, c10::ScalarType dtype, bool enabled) : device_(device) {
  TORCH_CHECK(device == c10::DeviceType::CPU || device == c10::DeviceType::CUDA,
              "AutocastGuard: autocast is for CPU or CUDA, got ", device);
  TORCH_CHECK(!enabled || dtype == c10::ScalarType::Half || dtype == c10::ScalarType::BFloat16,
              "AutocastGuard: dtype must be float16 or bfloat16, got ", dtype);
  TORCH_CHECK(device != c10::DeviceType::CPU || !enabled || workshop::compat::cpu_autocast_supports(dtype),
              "AutocastGuard: CPU autocast in this LibTorch supports bfloat16 only, got ", dtype);
  TORCH_CHECK(device != c10::DeviceType::CUDA || !enabled || torch::cuda::is_available(),
              "AutocastGuard: CUDA autocast requested, but CUDA is not available");
  // Remember what was there, so that the destructor can put it back exactly (this is what makes nesting work).
  previous_enabled_ = workshop::compat::autocast_enabled(device);
  previous_dtype_ = workshop::compat::autocast_dtype(device);
  previous_cache_enabled_ = at::autocast::is_autocast_cache_enabled();  // code inside may switch caching off
  // All or nothing: the dtype goes in before autocast is switched on, and if LibTorch refuses either, the saved
  // state goes back before the error leaves (a constructor that throws gets no destructor call).
  try {
    if (enabled) workshop::compat::set_autocast_dtype(device, dtype);
    workshop::compat::set_autocast_enabled(device, enabled);
  } catch (...) {
    workshop::compat::set_autocast_dtype(device, previous_dtype_);
    workshop::compat::set_autocast_enabled(device, previous_enabled_);
    throw;
  }
  at::autocast::increment_nesting();
}
// [guard_enter]

// [guard_exit]
AutocastGuard::~AutocastGuard() {
  // The outermost guard drops the cached 16-bit copies of the weights: they would go stale after the step.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  workshop::compat::set_autocast_enabled(device_, previous_enabled_);
  workshop::compat::set_autocast_dtype(device_, previous_dtype_);
  at::autocast::set_autocast_cache_enabled(previous_cache_enabled_);
}
// [guard_exit]

}  // namespace amp
