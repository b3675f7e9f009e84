// Lesson 2 — your code. Replace each TODO with an implementation; the checks in accumulation_step*_test.cc tell
// you when it is right:  bazel test //lesson2_accumulation:all
// Steps, hints and background: lesson2_accumulation/README.md. Already given: MicroBatch::count().
#include "lesson2_accumulation/accumulation.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <ATen/TensorOperators.h>  // Tensor with its methods and operators (+, *, ...)
#include <torch/optim/optimizer.h>

#include "common/memory_meter.h"
#include "lesson1_amp/autocast.h"

namespace accum {

int64_t MicroBatch::count() const {
  if (items >= 0) return items;
  return input.defined() && input.dim() > 0 ? input.size(0) : 0;
}

// [split_batch]
std::vector<MicroBatch> split_batch(const at::Tensor& input, const at::Tensor& target, int64_t micro_batch_size) {
  // TODO(lesson2, step 1): Reject bad input (the errors in accumulation.h), then cut the batch into MicroBatch views of
  // micro_batch_size items (narrow); the last one holds the rest (about 10 lines)
  TORCH_CHECK(false, "TODO(lesson2, step 1): split_batch() is not implemented yet");
}
// [split_batch]

// [accumulate_window]
at::Tensor accumulate_window(const std::vector<MicroBatch>& window, const LossFn& loss_fn,
                             Normalization normalization) {
  // TODO(lesson2, step 1): Check the whole window first, take the weights from loss_weights(), then per micro-batch:
  // loss = loss_fn(mb), (loss * weight).backward() at once; return the summed losses, detached (about 25 lines)
  TORCH_CHECK(false, "TODO(lesson2, step 1): accumulate_window() is not implemented yet");
}
// [accumulate_window]

// [train_accumulated]
AccumulationStats train_accumulated(torch::optim::Optimizer& optimizer, const std::vector<MicroBatch>& micro_batches,
                                    const LossFn& loss_fn, const AccumulationOptions& options) {
  // TODO(lesson2, step 1): Reject K <= 0 and no micro-batches; per window of K micro-batches (the last takes the rest):
  // zero_grad(), accumulate_window(), step(); fill the stats (about 15 lines)
  TORCH_CHECK(false, "TODO(lesson2, step 1): train_accumulated() is not implemented yet");
}
// [train_accumulated]

// [loss_weights]
std::vector<double> loss_weights(const std::vector<int64_t>& items, Normalization normalization) {
  // TODO(lesson2, step 2): For kByItems weigh micro-batch i by items[i] / sum(items); keep the naive rule below for
  // kMeanOfMeans; reject an empty window and item counts <= 0 (about 12 lines)
  std::vector<double> weights;
  for (size_t i = 0; i < items.size(); ++i) weights.push_back(1.0 / static_cast<double>(items.size()));
  return weights;
}
// [loss_weights]

// [train_accumulated_amp]
AccumulationStats train_accumulated_amp(torch::optim::Optimizer& optimizer, amp::GradScaler& scaler,
                                        const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn,
                                        const AccumulationOptions& options, const amp::StepOptions& amp_options) {
  // TODO(lesson2, step 3): The loop of train_accumulated with loss_fn under an amp::AutocastGuard, backward on
  // scaler.scale(loss.to(at::kFloat) * weight), then unscale_/clip, step and update once per window (about 40 lines)
  TORCH_CHECK(false, "TODO(lesson2, step 3): train_accumulated_amp() is not implemented yet");
}
// [train_accumulated_amp]

// [measure_memory]
MemoryModel measure_memory(const std::function<void(int64_t)>& run, c10::Device device, int64_t small, int64_t large) {
  // TODO(lesson2, step 4): Require 0 < small < large; run(small) once unmeasured, then the peak bytes of run(small) and
  // run(large) with one workshop::MemoryMeter; fit the line through them (about 20 lines)
  TORCH_CHECK(false, "TODO(lesson2, step 4): measure_memory() is not implemented yet");
}
// [measure_memory]

// [plan_micro_batch]
Plan plan_micro_batch(const MemoryModel& model, int64_t effective_batch, double budget_bytes) {
  // TODO(lesson2, step 4): Reject bad input (accumulation.h); m = the largest micro-batch that fits (at most
  // effective_batch), K = ceil(effective_batch / m), then m = ceil(effective_batch / K) (about 15 lines)
  TORCH_CHECK(false, "TODO(lesson2, step 4): plan_micro_batch() is not implemented yet");
}
// [plan_micro_batch]

}  // namespace accum
