// Lesson 1 — mixed precision. Part A: measuring underflow and an RAII autocast guard.
//
// LibTorch's C++ API has the autocast switches (per device: on/off and the 16-bit dtype) but no scoped guard
// like Python's `with torch.autocast(...)`. You build one here. See lesson1_amp/README.md.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace at {
class Tensor;
}  // namespace at

namespace amp {

/// Step 1. The fraction of the non-zero, finite entries of `values` that become exactly zero when they are
/// cast to `low_precision` (float16 by default): the gradients a 16-bit backward pass would silently lose.
/// Throws c10::Error if `values` is not a floating-point tensor, has no non-zero finite entry, or
/// `low_precision` is not a floating-point type.
double underflow_fraction(const at::Tensor& values, c10::ScalarType low_precision = c10::ScalarType::Half);

/// Step 2. While alive, ops on `device` that autocast covers (matmul, linear, conv, ...) run in `dtype`; the
/// rest keep float32 or are promoted to it. On destruction, also when an exception leaves the scope, the
/// previous enabled flag and dtype of that device, and autocast's cache-enabled flag (whether 16-bit copies of
/// weights are cached; at::autocast::set_autocast_cache_enabled), are restored. Guards nest; when the
/// outermost guard of all exits, the cache of 16-bit copies of float32 weights is cleared (as Python's
/// autocast does).
///
/// Throws c10::Error for a device other than CPU/CUDA and, when enabled, for a dtype that is not
/// float16 or bfloat16, for a dtype the device's autocast does not support in this LibTorch (CPU autocast before
/// 2.3: bfloat16 only), and for CUDA when CUDA is not available. A disabled guard accepts any dtype.
/// All or nothing: a guard that throws leaves the device's enabled flag and dtype exactly as they were.
class AutocastGuard {
 public:
  /// Autocast on `device` with `dtype`, or a guard that turns autocast *off* when `enabled` is false.
  AutocastGuard(c10::DeviceType device, c10::ScalarType dtype, bool enabled = true);

  /// Autocast on `device` with the dtype currently set for it, as Python's `torch.autocast(device)` without a
  /// dtype: the one an enclosing guard (or the user) chose, else the device's usual one (default_dtype()).
  explicit AutocastGuard(c10::DeviceType device, bool enabled = true);

  ~AutocastGuard();

  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

  /// The usual 16-bit dtype per device: float16 on CUDA (tensor cores, needs a GradScaler), bfloat16 on CPU.
  static c10::ScalarType default_dtype(c10::DeviceType device);

 private:
  c10::DeviceType device_;
  bool previous_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::Undefined;
  bool previous_cache_enabled_ = true;
};

}  // namespace amp
