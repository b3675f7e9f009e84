// Lesson 4 — reduce memory use. Part A (step 1): where the bytes of a training step go, and the cheap levers.
//
// A training step holds four kinds of tensors: the parameters, their gradients, the optimizer's state (Adam:
// two tensors per parameter) and the activations autograd keeps between forward and backward. You measure
// each with the shared peak-bytes meter (common/memory_meter.h). See lesson4_memory/README.md.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <c10/core/Device.h>

namespace at {
class Tensor;
}  // namespace at

namespace torch {
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace mem {

/// Step 1. Bytes of tensor data held by `tensors`: the sum of numel × element size. Undefined tensors count 0.
int64_t bytes_of(const std::vector<at::Tensor>& tensors);

/// Step 1 (cheap lever). Drops the gradient of every tensor in `parameters` (grad becomes undefined), so its
/// memory is freed now instead of being overwritten with zeros later. Undefined tensors are an error
/// ("undefined").
void set_grads_to_none(const std::vector<at::Tensor>& parameters);

/// Step 1 (cheap lever). Runs `loss_fn` without recording the graph (torch::NoGradGuard): nothing is kept for
/// a backward pass that will never come. Returns the loss as a double. Throws if `loss_fn` is empty or
/// returns something that is not a one-element tensor.
double evaluate_loss(const std::function<at::Tensor()>& loss_fn);

/// Where the bytes of one training step go. All values are bytes.
struct Breakdown {
  int64_t parameters = 0;       ///< the model's weights (bytes_of the parameters)
  int64_t gradients = 0;        ///< the .grad tensors after backward
  int64_t optimizer_state = 0;  ///< what the optimizer's step added and kept (Adam: 2 × parameters at the first step)
  int64_t activations = 0;      ///< what the forward pass left allocated until backward (saved tensors + loss)
  int64_t peak = 0;             ///< parameters + the meter's peak over forward, backward and step

  /// parameters + gradients + optimizer_state + activations: the napkin sum that the peak is compared with.
  int64_t total() const { return parameters + gradients + optimizer_state + activations; }
};

/// Step 1. Measures one training step with `meter`-style counting on `device`: sets the gradients of
/// `parameters` to none, then loss = loss_fn() (activations = bytes left allocated), loss.backward()
/// (gradients = bytes_of the grads), optimizer.step() (optimizer_state = bytes it added). The batch that
/// `loss_fn` reads must already exist: it is not counted. Throws if `parameters` is empty ("no parameters"),
/// `loss_fn` is empty, or the loss is not a one-element tensor that "requires grad".
Breakdown measure_breakdown(const std::vector<at::Tensor>& parameters, torch::optim::Optimizer& optimizer,
                            const std::function<at::Tensor()>& loss_fn, c10::Device device);

}  // namespace mem
