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
  // TODO(lesson2, step 1): Reject bad input with TORCH_CHECK (micro_batch_size <= 0, an undefined or empty
  // batch, input and target with different item counts: say "mismatched sizes"). Then cut the batch into
  // MicroBatch{input.narrow(0, begin, length), target.narrow(...)} pieces of micro_batch_size items; the
  // last piece holds the remainder.
  TORCH_CHECK(false, "TODO(lesson2, step 1): split_batch() is not implemented yet");
}
// [split_batch]

// [accumulate_window]
at::Tensor accumulate_window(const std::vector<MicroBatch>& window, const LossFn& loss_fn,
                             Normalization normalization) {
  // TODO(lesson2, step 1): Check the whole window first (not empty; each micro-batch's input and target
  // defined, with the same size(0) — "mismatched sizes" —, and count() > 0), so that an error never leaves
  // half a window in .grad. Get the weights from loss_weights(); for each micro-batch: loss = loss_fn(mb)
  // (check it is a scalar), (loss * weight).backward() right away. Return the sum of the weighted losses,
  // detached.
  TORCH_CHECK(false, "TODO(lesson2, step 1): accumulate_window() is not implemented yet");
}
// [accumulate_window]

// [train_accumulated]
AccumulationStats train_accumulated(torch::optim::Optimizer& optimizer, const std::vector<MicroBatch>& micro_batches,
                                    const LossFn& loss_fn, const AccumulationOptions& options) {
  // TODO(lesson2, step 1): Reject K = options.accumulation_steps <= 0 and an empty micro_batches. For each
  // window of K consecutive micro-batches (the last one takes what is left): optimizer.zero_grad(),
  // accumulate_window(), optimizer.step(). Count windows, backward passes and steps; keep each window loss.
  TORCH_CHECK(false, "TODO(lesson2, step 1): train_accumulated() is not implemented yet");
}
// [train_accumulated]

// [loss_weights]
std::vector<double> loss_weights(const std::vector<int64_t>& items, Normalization normalization) {
  // TODO(lesson2, step 2): This is the naive rule (divide every micro-batch's mean by the number of
  // micro-batches), right only when all micro-batches hold the same number of items. Keep it for
  // Normalization::kMeanOfMeans; for kByItems weigh micro-batch i by items[i] / (sum of items). Reject an
  // empty window and item counts <= 0 with TORCH_CHECK.
  std::vector<double> weights;
  for (size_t i = 0; i < items.size(); ++i) weights.push_back(1.0 / static_cast<double>(items.size()));
  return weights;
}
// [loss_weights]

// [train_accumulated_amp]
AccumulationStats train_accumulated_amp(torch::optim::Optimizer& optimizer, amp::GradScaler& scaler,
                                        const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn,
                                        const AccumulationOptions& options, const amp::StepOptions& amp_options) {
  // TODO(lesson2, step 3): The loop of train_accumulated, with three changes. Run loss_fn inside an
  // amp::AutocastGuard(amp_options.device, amp_options.dtype, amp_options.autocast) scope; backward on
  // scaler.scale(loss.to(at::kFloat) * weight) for every micro-batch; after the window: unscale_ and clip
  // (amp::clip_grad_norm_, given by lesson 1) when amp_options.max_grad_norm > 0, then scaler.step() (it may skip) and scaler.update() — once per
  // window, never inside it. Count skipped windows.
  TORCH_CHECK(false, "TODO(lesson2, step 3): train_accumulated_amp() is not implemented yet");
}
// [train_accumulated_amp]

// [measure_memory]
MemoryModel measure_memory(const std::function<void(int64_t)>& run, c10::Device device, int64_t small, int64_t large) {
  // TODO(lesson2, step 4): Require 0 < small < large. Call run(small) once unmeasured (gradients and
  // optimizer state appear at the first run and then stay). Then with one workshop::MemoryMeter(device):
  // reset(), run(m), peak_bytes() for m = small and m = large. bytes_per_item is the slope between the two
  // points, fixed_bytes the rest; an error if the peak shrank.
  TORCH_CHECK(false, "TODO(lesson2, step 4): measure_memory() is not implemented yet");
}
// [measure_memory]

// [plan_micro_batch]
Plan plan_micro_batch(const MemoryModel& model, int64_t effective_batch, double budget_bytes) {
  // TODO(lesson2, step 4): Reject effective_batch <= 0, budget_bytes <= 0, and a budget that cannot hold
  // fixed_bytes + bytes_per_item (say "does not fit even one item"). The largest m that fits is
  // floor((budget - fixed) / per_item), at most effective_batch; K = ceil(effective_batch / m); then even
  // the micro-batches out: m = ceil(effective_batch / K). Fill in predicted_bytes for that m.
  TORCH_CHECK(false, "TODO(lesson2, step 4): plan_micro_batch() is not implemented yet");
}
// [plan_micro_batch]

}  // namespace accum
