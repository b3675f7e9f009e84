// Lesson 3, part 4 — your code: name the planted problems, then fix the loop. Checks: bottleneck_test.cc,
//   bazel test //lesson3_profiling:all --test_arg=--test-case='*step4*'
// Steps, hints and background: lesson3_profiling/README.md.
#include "lesson3_profiling/bottleneck.h"

#include <algorithm>
#include <map>
#include <tuple>

#include <ATen/TensorOperators.h>  // Tensor with its methods and operators (+, *, ...)

#include "lesson3_profiling/phases.h"

namespace prof {

// [diagnose]
std::vector<Finding> diagnose(const Profile& profile, int64_t steps, const DiagnoseOptions& options) {
  // TODO(lesson3, step 4): Check steps >= 1 (message with "steps") and that the profile has phase rows
  // (message with "no phase"). Take each present phase's profile.step_share(phase, clock), where clock is
  // Clock::kDevice in a profile with device time (has_device_time()) and Clock::kHost otherwise. Count per phase
  // the direct child ops (events whose parent is a phase range) and the kSyncOp calls; then add the findings
  // the header describes and sort them, largest phase_share first.
  TORCH_CHECK(false, "TODO(lesson3, step 4): diagnose() is not implemented yet");
}
// [diagnose]

// [prepare]
void Trainer::prepare() {
  // TODO(lesson3, step 4): Compute the statistics exactly as slow_step() does, normalise all of raw_ at once,
  // and keep the result and the labels on device_ in prepared_ and prepared_labels_.
  TORCH_CHECK(false, "TODO(lesson3, step 4): Trainer::prepare() is not implemented yet");
}
// [prepare]

// [fast_step]
void Trainer::fast_step() {
  // TODO(lesson3, step 4): An error (message with "prepare()") if prepare() has not run. Then the four phases
  // of slow_step(), each in a ScopedRange: data takes slices of the prepared tensors (narrow), forward adds
  // the detached loss to loss_sum_ without reading it on the host, backward and optimizer as in slow_step().
  TORCH_CHECK(false, "TODO(lesson3, step 4): Trainer::fast_step() is not implemented yet");
}
// [fast_step]

}  // namespace prof
