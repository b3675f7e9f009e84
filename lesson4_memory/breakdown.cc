// Lesson 4, step 1 — your code. Replace each TODO with an implementation; the checks in breakdown_test.cc
// tell you when it is right:  bazel test //lesson4_memory:all --test_arg=--test-case='*step1*'
// Steps, hints and background: lesson4_memory/README.md.
#include "lesson4_memory/breakdown.h"

#include <ATen/TensorOperators.h>  // Tensor with its methods and operators (+, *, ...)
#include <ATen/core/grad_mode.h>   // at::NoGradGuard (the 2.x headers do not bring it in by accident)
#include <torch/optim/optimizer.h>

#include "common/memory_meter.h"

namespace mem {

// [bytes_of]
int64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  // TODO(lesson4, step 1): Sum numel() * element_size() over the defined tensors (undefined ones count 0).
  TORCH_CHECK(false, "TODO(lesson4, step 1): bytes_of() is not implemented yet");
}
// [bytes_of]

// [set_grads_to_none]
void set_grads_to_none(const std::vector<at::Tensor>& parameters) {
  // TODO(lesson4, step 1): Reject an undefined parameter (message containing "undefined"). For each
  // parameter drop its gradient: p.mutable_grad().reset() (const_cast: the tensor handle is shared).
  TORCH_CHECK(false, "TODO(lesson4, step 1): set_grads_to_none() is not implemented yet");
}
// [set_grads_to_none]

// [evaluate_loss]
double evaluate_loss(const std::function<at::Tensor()>& loss_fn) {
  // TODO(lesson4, step 1): Reject an empty loss_fn ("empty"). Under an at::NoGradGuard, call it; reject a
  // result that is not a one-element tensor ("one-element"); return it as a double (item<double>()).
  TORCH_CHECK(false, "TODO(lesson4, step 1): evaluate_loss() is not implemented yet");
}
// [evaluate_loss]

// [measure_breakdown]
Breakdown measure_breakdown(const std::vector<at::Tensor>& parameters, torch::optim::Optimizer& optimizer,
                            const std::function<at::Tensor()>& loss_fn, c10::Device device) {
  // TODO(lesson4, step 1): Reject empty parameters ("no parameters") and an empty loss_fn. Set the grads to
  // none; parameters = bytes_of(parameters). Start a workshop::MemoryMeter on `device`. In a scope: loss =
  // loss_fn() (reject it unless one element and requires_grad: "requires grad"); activations = the meter's
  // current bytes; backward. After the scope: gradients = bytes_of the grads; optimizer_state = what
  // optimizer.step() adds to the current bytes; peak = parameters + the meter's peak.
  TORCH_CHECK(false, "TODO(lesson4, step 1): measure_breakdown() is not implemented yet");
}
// [measure_breakdown]

}  // namespace mem
