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
  // TODO(lesson4, step 4): Reject bad input (planner.h); set the grads to none; per chunk of micro_batch rows a
  // checkpointed forward (bfloat16 if asked), a weighted MSE loss and backward; then step (about 30 lines)
  TORCH_CHECK(false, "TODO(lesson4, step 4): train_step() is not implemented yet");
}
// [train_step]

// [candidate_recipes]
std::vector<Recipe> candidate_recipes(int64_t batch, int64_t layers) {
  // TODO(lesson4, step 4): Reject batch < 1 and layers < 1; for micro-batches batch, ceil(batch / 2), ... 1: every
  // segment choice, float32 then 16-bit, in planner.h's order (about 20 lines)
  TORCH_CHECK(false, "TODO(lesson4, step 4): candidate_recipes() is not implemented yet");
}
// [candidate_recipes]

// [plan_for_budget]
Plan plan_for_budget(int64_t budget_bytes, int64_t batch, int64_t layers, const PeakProbe& probe) {
  // TODO(lesson4, step 4): Reject bad input (planner.h); probe the least-memory candidate first and fail if it is over
  // budget; else return the first candidate that fits (about 20 lines)
  TORCH_CHECK(false, "TODO(lesson4, step 4): plan_for_budget() is not implemented yet");
}
// [plan_for_budget]

}  // namespace mem
