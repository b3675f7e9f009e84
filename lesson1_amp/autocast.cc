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
  // TODO(lesson1, step 1): Reject input that cannot be measured (autocast.h says which), cast `values` to
  // `low_precision` and return the fraction of its non-zero finite entries that became exactly 0 (about 10 lines)
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
  // TODO(lesson1, step 2): Check the arguments, save the device's autocast state (enabled flag, dtype, cache flag),
  // switch to the new state and count one more nesting level (about 20 lines)
  TORCH_CHECK(false, "TODO(lesson1, step 2): AutocastGuard is not implemented yet");
}
// [guard_enter]

// [guard_exit]
AutocastGuard::~AutocastGuard() {
  // TODO(lesson1, step 2): Leave one nesting level (clear the cast cache if it was the outermost) and restore the saved
  // enabled flag, dtype and cache flag; never throw (about 4 lines)
}
// [guard_exit]

}  // namespace amp
