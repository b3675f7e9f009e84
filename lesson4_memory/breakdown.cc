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
  // TODO(lesson4, step 1): Sum numel() * element_size() over the defined tensors (about 5 lines)
  TORCH_CHECK(false, "TODO(lesson4, step 1): bytes_of() is not implemented yet");
}
// [bytes_of]

// [set_grads_to_none]
void set_grads_to_none(const std::vector<at::Tensor>& parameters) {
  // TODO(lesson4, step 1): Reject an undefined parameter; drop each gradient: p.mutable_grad().reset() (const_cast: the
  // handle is shared) (about 4 lines)
  TORCH_CHECK(false, "TODO(lesson4, step 1): set_grads_to_none() is not implemented yet");
}
// [set_grads_to_none]

// [evaluate_loss]
double evaluate_loss(const std::function<at::Tensor()>& loss_fn) {
  // TODO(lesson4, step 1): Reject an empty loss_fn; call it under an at::NoGradGuard, reject a result that is not one
  // element, return it as a double (about 5 lines)
  TORCH_CHECK(false, "TODO(lesson4, step 1): evaluate_loss() is not implemented yet");
}
// [evaluate_loss]

// [measure_breakdown]
Breakdown measure_breakdown(const std::vector<at::Tensor>& parameters, torch::optim::Optimizer& optimizer,
                            const std::function<at::Tensor()>& loss_fn, c10::Device device) {
  // TODO(lesson4, step 1): Reject bad input (breakdown.h), set the grads to none, then with a workshop::MemoryMeter
  // take the activations after the loss, the optimizer state around step(), the peak at the end (about 20 lines)
  TORCH_CHECK(false, "TODO(lesson4, step 1): measure_breakdown() is not implemented yet");
}
// [measure_breakdown]

}  // namespace mem
