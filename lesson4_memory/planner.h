// Lesson 4 — reduce memory use. Part C (step 4): combine the levers, and pick them for a memory budget.
//
// A recipe says how one training step runs: how many rows per forward/backward (gradient accumulation, which
// lesson 2 covers in depth), how many checkpointed segments, and whether the forward runs in 16 bits
// (lesson 1's autocast). The planner picks the cheapest recipe whose measured peak fits a budget.
// See lesson4_memory/README.md.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

// Declared only: this header passes them by reference, and <torch/nn/modules/container/sequential.h> is slow
// to compile (it was about 60% of planner.cc's compile). planner.cc includes <torch/optim/optimizer.h> (cheap);
// workload.h includes the Sequential header for the code that builds models.
namespace torch {
namespace nn {
class Sequential;
}  // namespace nn
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace mem {

/// How one training step runs.
struct Recipe {
  int64_t micro_batch = 0;     ///< rows per forward/backward; 0 = the whole batch at once
  int64_t segments = 1;        ///< 1 = no checkpointing; S > 1 = checkpoint_sequential with S segments
  bool low_precision = false;  ///< forward under 16-bit autocast (bfloat16: no gradient scaler needed)
};

/// Given. "micro_batch=256 segments=6 16-bit" (micro_batch=all when 0; "float32" when not low precision).
std::string describe(const Recipe& recipe);

/// Step 4. One optimizer step over the batch (inputs [N, ...], targets [N, ...]) with mean-squared-error loss:
/// set the gradients to none, split the batch into chunks of recipe.micro_batch rows (the last may be
/// smaller), and for each chunk: forward (checkpoint_sequential with recipe.segments; under bfloat16
/// autocast if recipe.low_precision), loss = mse × (chunk rows / N), backward, drop the chunk's tensors. Then
/// step once. Returns the batch loss (the sum of the weighted chunk losses). Throws if micro_batch < 0,
/// segments < 1, or inputs and targets are empty or differ in their number of rows.
double train_step(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, const at::Tensor& inputs,
                  const at::Tensor& targets, const Recipe& recipe);

/// Step 4. The recipes the planner considers, cheapest first. For micro-batches batch, ceil(batch/2),
/// ceil(batch/4), ... down to 1; within each: no checkpointing in float32, then in 16 bits, then
/// round(sqrt(layers)) segments (at least 2; only if layers >= 2) in float32, then in 16 bits. The last
/// recipe uses the least memory. Throws if batch < 1 or layers < 1.
std::vector<Recipe> candidate_recipes(int64_t batch, int64_t layers);

/// Measures the peak bytes of training with a recipe (a real run, see workload.h).
using PeakProbe = std::function<int64_t(const Recipe&)>;

/// What the planner chose.
struct Plan {
  Recipe recipe;
  int64_t peak_bytes = 0;  ///< what the probe measured for that recipe
  int probes = 0;          ///< how many recipes were measured
};

/// Step 4. Picks the first of candidate_recipes(batch, layers) whose probed peak is <= budget_bytes. Probes
/// the least-memory recipe first: if even it does not fit, throws "no recipe fits the budget of
/// <budget_bytes>" and names the smallest peak. Throws if budget_bytes <= 0, and when the `probe` is empty
/// ("probe is empty").
Plan plan_for_budget(int64_t budget_bytes, int64_t batch, int64_t layers, const PeakProbe& probe);

}  // namespace mem
