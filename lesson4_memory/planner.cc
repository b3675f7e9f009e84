// Lesson 4, step 4 — your code. Replace each TODO with an implementation; the checks in planner_test.cc
// tell you when it is right:  bazel test //lesson4_memory:all --test_arg=--test-case='*step4*'
// Steps, hints and background: lesson4_memory/README.md.
#include "lesson4_memory/planner.h"

#include <algorithm>
#include <cmath>

#include <ATen/TensorOperators.h>  // Tensor with its methods and operators (+, *, ...)
#include <ATen/ops/mse_loss.h>     // at:: functions come one header each; add <ATen/ops/NAME.h> for others
#include <torch/optim/optimizer.h>

#include "lesson1_amp/autocast.h"
#include "lesson4_memory/breakdown.h"
#include "lesson4_memory/checkpoint.h"

namespace mem {

// [train_step]
double train_step(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, const at::Tensor& inputs,
                  const at::Tensor& targets, const Recipe& recipe) {
  // TODO(lesson4, step 4): Reject micro_batch < 0 ("micro_batch"), segments < 1 ("segments"), an empty
  // batch, and targets whose row count differs ("rows"). Set the gradients of every parameter of
  // optimizer.param_groups() to none. For each chunk of micro_batch rows (0 = all; inputs.narrow): forward
  // with checkpoint_sequential(model, recipe.segments, chunk) under amp::AutocastGuard(device type,
  // bfloat16, recipe.low_precision); loss = mse_loss(out in float32, target chunk) * chunk rows / all rows;
  // let `out` die before backward; backward; add loss.item<double>() to the total. Then optimizer.step().
  TORCH_CHECK(false, "TODO(lesson4, step 4): train_step() is not implemented yet");
}
// [train_step]

// [candidate_recipes]
std::vector<Recipe> candidate_recipes(int64_t batch, int64_t layers) {
  // TODO(lesson4, step 4): Reject batch < 1 ("batch") and layers < 1 ("layers"). Segment choices: 1, and if
  // layers >= 2 also clamp(round(sqrt(layers)), 2, layers). For divisor = 1, 2, 4, ...: micro =
  // ceil(batch / divisor) (store 0 when it is the whole batch); for each segment choice, float32 then
  // 16-bit. Stop after micro == 1.
  TORCH_CHECK(false, "TODO(lesson4, step 4): candidate_recipes() is not implemented yet");
}
// [candidate_recipes]

// [plan_for_budget]
Plan plan_for_budget(int64_t budget_bytes, int64_t batch, int64_t layers, const PeakProbe& probe) {
  // TODO(lesson4, step 4): Reject budget_bytes <= 0 ("budget_bytes") and an empty probe ("probe is empty").
  // Probe the last (least-memory) candidate first; if it is over budget, fail with "no recipe fits the
  // budget of <budget> bytes" and the smallest peak. Otherwise probe the others in order and return the
  // first that fits (with its peak and the number of probes); the last one if none before it does.
  TORCH_CHECK(false, "TODO(lesson4, step 4): plan_for_budget() is not implemented yet");
}
// [plan_for_budget]

}  // namespace mem
