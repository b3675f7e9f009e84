// Lesson 1, part A — your code. Replace each TODO with an implementation; the checks in
// autocast_test.cc tell you when it is right:  bazel test //lesson1_amp:all
// Steps, hints and background: lesson1_amp/README.md.
#include "lesson1_amp/autocast.h"

#include <ATen/TensorOperators.h>  // Tensor with its methods and operators (+, *, &, ...)
#include <torch/cuda.h>

#include "common/compat/compat.h"

namespace amp {

// [underflow_fraction]
double underflow_fraction(const at::Tensor& values, c10::ScalarType low_precision) {
  // TODO(lesson1, step 1): Reject bad input with TORCH_CHECK (undefined or non-floating `values`, a
  // non-floating `low_precision`, no non-zero finite entry). Then cast `values` to `low_precision` and return
  // the fraction of the non-zero finite entries that became exactly 0.
  TORCH_CHECK(false, "TODO(lesson1, step 1): underflow_fraction() is not implemented yet");
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
  // TODO(lesson1, step 2): Check the arguments (CPU or CUDA; when enabled: float16 or bfloat16, on CPU a
  // dtype that workshop::compat::cpu_autocast_supports(), CUDA only if torch::cuda::is_available()).
  // Save the device's current autocast state in previous_enabled_ / previous_dtype_ (workshop::compat::
  // autocast_enabled / autocast_dtype) and the cache flag in previous_cache_enabled_
  // (at::autocast::is_autocast_cache_enabled()), switch to the new state (the dtype first, then the enabled flag,
  // so that a failure never leaves autocast on with the wrong dtype), and count one more nesting level
  // (at::autocast::increment_nesting()).
  TORCH_CHECK(false, "TODO(lesson1, step 2): AutocastGuard is not implemented yet");
}
// [guard_enter]

// [guard_exit]
AutocastGuard::~AutocastGuard() {
  // TODO(lesson1, step 2): Leave one nesting level (at::autocast::decrement_nesting()); if it was the
  // outermost, clear the cast cache (at::autocast::clear_cache()). Restore the saved enabled flag, dtype and
  // cache flag (at::autocast::set_autocast_cache_enabled).
  // A destructor must not throw.
}
// [guard_exit]

}  // namespace amp
