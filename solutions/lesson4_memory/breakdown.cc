// Reference solution of lesson 4, step 1 (lesson4_memory/breakdown.h).
#include "lesson4_memory/breakdown.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard, at::AutoGradMode (ATen.h does not bring it in 2.x)
#include <torch/optim/optimizer.h>

#include "common/memory_meter.h"

namespace mem {

// [bytes_of]
int64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const at::Tensor& t : tensors) {
    if (t.defined()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  }
  return bytes;
}
// [bytes_of]

// [set_grads_to_none]
void set_grads_to_none(const std::vector<at::Tensor>& parameters) {
  for (const at::Tensor& p : parameters) {
    TORCH_CHECK(p.defined(), "set_grads_to_none: got an undefined parameter");
    // Dropping the reference frees the gradient now; zero_() would keep every byte and write zeros into it.
    const_cast<at::Tensor&>(p).mutable_grad().reset();
  }
}
// [set_grads_to_none]

// [evaluate_loss]
double evaluate_loss(const std::function<at::Tensor()>& loss_fn) {
  TORCH_CHECK(static_cast<bool>(loss_fn), "evaluate_loss: loss_fn is empty");
  at::NoGradGuard no_grad;  // no graph: each activation is freed as soon as the next op has used it
  const at::Tensor loss = loss_fn();
  TORCH_CHECK(loss.defined() && loss.numel() == 1, "evaluate_loss: loss_fn must return a one-element tensor");
  return loss.item<double>();
}
// [evaluate_loss]

// [measure_breakdown]
Breakdown measure_breakdown(const std::vector<at::Tensor>& parameters, torch::optim::Optimizer& optimizer,
                            const std::function<at::Tensor()>& loss_fn, c10::Device device) {
  TORCH_CHECK(!parameters.empty(), "measure_breakdown: no parameters");
  TORCH_CHECK(static_cast<bool>(loss_fn), "measure_breakdown: loss_fn is empty");
  set_grads_to_none(parameters);
  Breakdown b;
  b.parameters = bytes_of(parameters);
  workshop::MemoryMeter meter(device);  // baseline: parameters, batch, whatever the optimizer already holds
  {
    at::Tensor loss = loss_fn();
    TORCH_CHECK(loss.defined() && loss.numel() == 1 && loss.requires_grad(),
                "measure_breakdown: loss_fn must return a one-element loss that requires grad");
    b.activations = meter.current_bytes();  // what autograd saved for backward, plus the loss itself
    loss.backward();
  }  // the loss goes out of scope here: drop references as soon as they are not needed
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : parameters) grads.push_back(p.grad());
  b.gradients = bytes_of(grads);
  const int64_t before_step = meter.current_bytes();
  optimizer.step();
  b.optimizer_state = meter.current_bytes() - before_step;
  b.peak = b.parameters + meter.peak_bytes();
  return b;
}
// [measure_breakdown]

}  // namespace mem
