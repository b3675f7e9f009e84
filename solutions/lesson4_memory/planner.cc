// Reference solution of lesson 4, step 4 (lesson4_memory/planner.h).
#include "lesson4_memory/planner.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "lesson1_amp/autocast.h"
#include "lesson4_memory/breakdown.h"
#include "lesson4_memory/checkpoint.h"

namespace mem {

// [train_step]
double train_step(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, const at::Tensor& inputs,
                  const at::Tensor& targets, const Recipe& recipe) {
  TORCH_CHECK(recipe.micro_batch >= 0, "train_step: micro_batch must be >= 0 (0 = whole batch), got ",
              recipe.micro_batch);
  TORCH_CHECK(recipe.segments >= 1, "train_step: segments must be >= 1, got ", recipe.segments);
  TORCH_CHECK(inputs.defined() && targets.defined() && inputs.dim() >= 1 && inputs.size(0) > 0,
              "train_step: empty batch");
  TORCH_CHECK(targets.dim() >= 1 && targets.size(0) == inputs.size(0), "train_step: inputs have ", inputs.size(0),
              " rows but targets have ", targets.dim() >= 1 ? targets.size(0) : 0);
  std::vector<at::Tensor> parameters;
  for (const auto& group : optimizer.param_groups()) {
    parameters.insert(parameters.end(), group.params().begin(), group.params().end());
  }
  set_grads_to_none(parameters);  // last step's gradients are freed before this step's activations arrive

  const int64_t rows = inputs.size(0);
  const int64_t micro = recipe.micro_batch == 0 ? rows : std::min(recipe.micro_batch, rows);
  const c10::DeviceType device = inputs.device().type();
  double total = 0.0;
  for (int64_t start = 0; start < rows; start += micro) {
    const int64_t n = std::min(micro, rows - start);
    at::Tensor loss;
    {
      amp::AutocastGuard autocast(device, c10::ScalarType::BFloat16, recipe.low_precision);
      const at::Tensor out = checkpoint_sequential(model, recipe.segments, inputs.narrow(0, start, n));
      // Weight by the chunk's share of the batch: the summed gradients equal the whole batch's (lesson 2).
      loss = at::mse_loss(out.to(at::kFloat), targets.narrow(0, start, n)) * (static_cast<double>(n) / rows);
    }  // `out` dies here; only the graph holds what backward needs
    loss.backward();
    total += loss.item<double>();
  }
  optimizer.step();
  return total;
}
// [train_step]

// [candidate_recipes]
std::vector<Recipe> candidate_recipes(int64_t batch, int64_t layers) {
  TORCH_CHECK(batch >= 1, "candidate_recipes: batch must be >= 1, got ", batch);
  TORCH_CHECK(layers >= 1, "candidate_recipes: layers must be >= 1, got ", layers);
  std::vector<int64_t> segment_choices{1};
  if (layers >= 2) {
    const auto root = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(layers))));
    segment_choices.push_back(std::min(layers, std::max<int64_t>(2, root)));  // about sqrt(n) memory
  }
  std::vector<Recipe> recipes;
  for (int64_t divisor = 1;; divisor *= 2) {
    const int64_t micro = (batch + divisor - 1) / divisor;
    for (int64_t segments : segment_choices) {
      for (bool low_precision : {false, true}) {
        Recipe r;
        r.micro_batch = micro == batch ? 0 : micro;
        r.segments = segments;
        r.low_precision = low_precision;
        recipes.push_back(r);
      }
    }
    if (micro == 1) break;
  }
  return recipes;
}
// [candidate_recipes]

// [plan_for_budget]
Plan plan_for_budget(int64_t budget_bytes, int64_t batch, int64_t layers, const PeakProbe& probe) {
  TORCH_CHECK(budget_bytes > 0, "plan_for_budget: budget_bytes must be > 0, got ", budget_bytes);
  TORCH_CHECK(static_cast<bool>(probe), "plan_for_budget: the probe is empty");
  const std::vector<Recipe> recipes = candidate_recipes(batch, layers);
  Plan plan;
  // The last recipe needs the least memory: if it does not fit, nothing does, and we stop after one probe.
  const int64_t smallest = probe(recipes.back());
  plan.probes = 1;
  TORCH_CHECK(smallest <= budget_bytes, "plan_for_budget: no recipe fits the budget of ", budget_bytes,
              " bytes; the smallest peak (", describe(recipes.back()), ") is ", smallest, " bytes");
  for (size_t i = 0; i + 1 < recipes.size(); ++i) {
    const int64_t peak = probe(recipes[i]);
    ++plan.probes;
    if (peak <= budget_bytes) {
      plan.recipe = recipes[i];
      plan.peak_bytes = peak;
      return plan;
    }
  }
  plan.recipe = recipes.back();
  plan.peak_bytes = smallest;
  return plan;
}
// [plan_for_budget]

}  // namespace mem
