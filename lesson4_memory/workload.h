// Lesson 4 — given code: the deep MLP the lesson measures, its data, and an honest measurement of a training
// step (peak bytes and time in one run). Nothing to write here.
#pragma once

#include <cstdint>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "lesson4_memory/planner.h"

namespace mem {

/// One layer of the deep MLP: [rows, width] -> Linear -> GELU -> dropout(p) -> [rows, width].
/// Linear keeps its input for backward and GELU keeps its input too: two activations per layer.
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(int64_t width, double dropout);
  at::Tensor forward(const at::Tensor& x);

 private:
  torch::nn::Linear linear_{nullptr};
  double dropout_;
};
TORCH_MODULE(Block);

/// The workload: a deep, narrow MLP and one batch. The memory ratios come from depth.
struct MlpSpec {
  int64_t layers = 32;
  int64_t width = 64;
  int64_t batch = 1024;
  double dropout = 0.0;
  uint64_t seed = 0;
};

/// spec.layers Blocks in a Sequential, initialised from spec.seed, on `device`.
torch::nn::Sequential make_deep_mlp(const MlpSpec& spec, c10::Device device);

/// (inputs, targets), both [spec.batch, spec.width] float32 on `device`, from spec.seed + 1.
std::pair<at::Tensor, at::Tensor> make_batch(const MlpSpec& spec, c10::Device device);

/// Peak bytes and time of training with a recipe.
struct StepMemory {
  int64_t resident_bytes = 0;    ///< between steps: parameters + batch + Adam state (gradients set to none)
  int64_t step_peak_bytes = 0;   ///< the most a step allocated on top of resident_bytes
  int64_t total_peak_bytes = 0;  ///< the most allocated at any moment, model creation included
  double median_step_ms = 0.0;   ///< median of the timed steps (synchronised)
};

/// Builds the model, an Adam optimizer and the batch on `device` (all counted), runs one warm-up train_step
/// (it creates Adam's state), sets the gradients to none, then times `timed_steps` train_steps while the
/// meter watches. Throws if timed_steps < 1.
StepMemory measure_training(const MlpSpec& spec, const Recipe& recipe, c10::Device device, int timed_steps = 1);

}  // namespace mem
