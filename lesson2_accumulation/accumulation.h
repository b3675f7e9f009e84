// Lesson 2 — gradient accumulation for large batches.
//
// Train with an effective batch of B items while only ever holding one micro-batch of m items in memory:
// run K = ceil(B / m) forward+backward passes, let the gradients add up in the parameters' .grad, and step
// the optimizer once per window of K micro-batches. Done right, the gradients equal the full batch's to
// float32 rounding. See lesson2_accumulation/README.md for the steps.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "lesson1_amp/grad_scaler.h"

namespace torch {
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace accum {

/// One micro-batch: `input` and `target` share their first dimension, the items.
struct MicroBatch {
  at::Tensor input;   ///< [items, ...]
  at::Tensor target;  ///< [items, ...]
  /// How many items the loss averages over; -1 (the default) means input.size(0). Set it when the loss
  /// averages over something else, e.g. the non-padding tokens of a language-model batch.
  int64_t items = -1;

  /// The item count the loss averages over (`items`, or input.size(0) when items is -1).
  int64_t count() const;
};

/// Computes the MEAN loss over one micro-batch's items (a scalar tensor), as `mse_loss(model(input), target)`
/// does by default. The accumulation code decides how much each micro-batch's mean weighs in its window.
using LossFn = std::function<at::Tensor(const MicroBatch&)>;

/// Step 1. Splits a batch into micro-batches of `micro_batch_size` items, in order; the last one holds the
/// remainder when the batch does not divide evenly. The micro-batches are views (no copy). Errors: an empty
/// or undefined batch ("empty batch"), input and target with different item counts ("mismatched sizes"),
/// micro_batch_size <= 0.
std::vector<MicroBatch> split_batch(const at::Tensor& input, const at::Tensor& target, int64_t micro_batch_size);

/// How the micro-batches' mean losses are combined into the window's loss.
enum class Normalization {
  kByItems,      ///< weight n_i / (items in the window): the window loss is the mean over all its items
  kMeanOfMeans,  ///< weight 1 / (micro-batches in the window): the naive rule, wrong for uneven micro-batches
};

/// Step 2. The weight of each micro-batch's mean loss, given the item count of every micro-batch of one window.
/// kByItems: items[i] / sum(items). kMeanOfMeans: 1 / items.size(). Errors: no micro-batch
/// ("at least one micro-batch"), an item count <= 0 ("at least one item").
std::vector<double> loss_weights(const std::vector<int64_t>& items, Normalization normalization);

/// How train_accumulated groups micro-batches.
struct AccumulationOptions {
  int64_t accumulation_steps = 1;  ///< K: micro-batches per optimizer step; must be > 0
  Normalization normalization = Normalization::kByItems;
};

/// What a pass over the micro-batches did.
struct AccumulationStats {
  int64_t windows = 0;                    ///< windows of (at most) K micro-batches: ceil(N / K)
  int64_t backward_passes = 0;            ///< micro-batches run forward and backward: N
  int64_t optimizer_steps = 0;            ///< optimizer.step() calls: windows minus skipped_windows
  int64_t skipped_windows = 0;            ///< windows whose step the gradient scaler skipped (inf/NaN gradients)
  std::vector<at::Tensor> window_losses;  ///< each window's loss, detached (weighted sum of the micro-losses)
};

/// Step 1. Runs forward and backward on every micro-batch of one window, each mean loss multiplied by its
/// loss_weights() weight, so that the gradients ADD UP in .grad to those of the whole window. Neither zeroes
/// nor steps. Returns the window's loss, detached. Errors: an empty window ("empty window"), a micro-batch
/// whose input and target differ in items ("mismatched sizes") or that has no item (micro-batch i "is empty"),
/// a loss that is not a scalar.
at::Tensor accumulate_window(const std::vector<MicroBatch>& window, const LossFn& loss_fn,
                             Normalization normalization = Normalization::kByItems);

/// Step 1. One pass over `micro_batches` in windows of K = options.accumulation_steps consecutive
/// micro-batches (the last window holds what is left): per window zero the gradients, accumulate_window(),
/// then step the optimizer once. After it returns, .grad holds the last window's accumulated gradients.
/// Errors: K <= 0 (naming "accumulation_steps"), no micro-batch at all ("empty batch").
AccumulationStats train_accumulated(torch::optim::Optimizer& optimizer, const std::vector<MicroBatch>& micro_batches,
                                    const LossFn& loss_fn, const AccumulationOptions& options = {});

/// Step 3. train_accumulated with mixed precision and a gradient scaler (lesson 1's amp::GradScaler): every
/// micro-loss runs under autocast (amp_options.device/dtype/autocast) and is scaled before its backward;
/// the scale stays fixed inside a window; once per window: unscale (and clip if amp_options.max_grad_norm
/// > 0), scaler.step, scaler.update. An inf/NaN in any micro-batch skips the whole window and backs the scale
/// off once.
/// Errors: those of train_accumulated ("accumulation_steps", "empty batch").
AccumulationStats train_accumulated_amp(torch::optim::Optimizer& optimizer, amp::GradScaler& scaler,
                                        const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn,
                                        const AccumulationOptions& options = {},
                                        const amp::StepOptions& amp_options = {});

/// A linear memory model of one training step: peak bytes ≈ fixed_bytes + bytes_per_item × micro-batch.
struct MemoryModel {
  double fixed_bytes = 0;     ///< what does not depend on the micro-batch (gradients, optimizer state, ...)
  double bytes_per_item = 0;  ///< activations and inputs per item
};

/// Step 4. Measures the peak bytes of `run(m)` (one forward+backward of a micro-batch of m items) on `device`
/// with workshop::MemoryMeter for m = small and m = large, and fits the line through the two points.
/// Errors: 0 < small < large does not hold; a peak that shrinks as the micro-batch grows.
MemoryModel measure_memory(const std::function<void(int64_t)>& run, c10::Device device, int64_t small, int64_t large);

/// What plan_micro_batch chose.
struct Plan {
  int64_t micro_batch = 0;         ///< m: items per forward/backward
  int64_t accumulation_steps = 0;  ///< K = ceil(effective_batch / m)
  double predicted_bytes = 0;      ///< the model's peak for m
};

/// Step 4. The largest micro-batch m <= effective_batch whose predicted peak (model) fits `budget_bytes`,
/// and K = ceil(effective_batch / m): the effective batch stays, the micro-batch shrinks to fit. Errors:
/// effective_batch <= 0, budget_bytes <= 0, a budget that "does not fit even one item".
Plan plan_micro_batch(const MemoryModel& model, int64_t effective_batch, double budget_bytes);

}  // namespace accum
