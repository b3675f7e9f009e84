// Reference solution of lesson 2 (lesson2_accumulation/accumulation.h).
#include "lesson2_accumulation/accumulation.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <ATen/ATen.h>
#include <torch/types.h>  // clip_grad.h needs torch::Tensor declared first
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>

#include "common/memory_meter.h"
#include "lesson1_amp/autocast.h"

namespace accum {
namespace {

void check_micro_batch(const MicroBatch& micro_batch, size_t index) {
  TORCH_CHECK(micro_batch.input.defined() && micro_batch.target.defined(), "micro-batch ", index,
              ": input and target must be defined tensors");
  TORCH_CHECK(micro_batch.input.dim() > 0 && micro_batch.target.dim() > 0, "micro-batch ", index,
              ": input and target need an item dimension (dim 0)");
  TORCH_CHECK(micro_batch.input.size(0) == micro_batch.target.size(0), "micro-batch ", index,
              ": mismatched sizes, the input has ", micro_batch.input.size(0), " items but the target has ",
              micro_batch.target.size(0));
  TORCH_CHECK(micro_batch.count() > 0, "micro-batch ", index, " is empty (no items)");
}

void check_options(const AccumulationOptions& options, const std::vector<MicroBatch>& micro_batches) {
  TORCH_CHECK(options.accumulation_steps > 0, "accumulation_steps (K) must be > 0, got ", options.accumulation_steps);
  TORCH_CHECK(!micro_batches.empty(), "no micro-batches to train on (empty batch)");
}

// Micro-batches [begin, end) of `all` as their own vector (MicroBatch holds tensors: copies are cheap handles).
std::vector<MicroBatch> slice(const std::vector<MicroBatch>& all, size_t begin, size_t end) {
  return std::vector<MicroBatch>(all.begin() + static_cast<std::ptrdiff_t>(begin),
                                 all.begin() + static_cast<std::ptrdiff_t>(end));
}

}  // namespace

int64_t MicroBatch::count() const {
  if (items >= 0) return items;
  return input.defined() && input.dim() > 0 ? input.size(0) : 0;
}

// [split_batch]
std::vector<MicroBatch> split_batch(const at::Tensor& input, const at::Tensor& target, int64_t micro_batch_size) {
  TORCH_CHECK(micro_batch_size > 0, "split_batch: micro_batch_size must be > 0, got ", micro_batch_size);
  TORCH_CHECK(input.defined() && target.defined(), "split_batch: input and target must be defined tensors");
  TORCH_CHECK(input.dim() > 0 && input.size(0) > 0, "split_batch: empty batch (no items)");
  TORCH_CHECK(target.dim() > 0 && input.size(0) == target.size(0), "split_batch: mismatched sizes, the input has ",
              input.size(0), " items but the target has ", target.dim() > 0 ? target.size(0) : 0);
  std::vector<MicroBatch> out;
  for (int64_t begin = 0; begin < input.size(0); begin += micro_batch_size) {
    const int64_t length = std::min(micro_batch_size, input.size(0) - begin);  // the last one may be short
    out.push_back(MicroBatch{input.narrow(0, begin, length), target.narrow(0, begin, length)});
  }
  return out;
}
// [split_batch]

// [accumulate_window]
at::Tensor accumulate_window(const std::vector<MicroBatch>& window, const LossFn& loss_fn,
                             Normalization normalization) {
  TORCH_CHECK(loss_fn, "accumulate_window: loss_fn is empty");
  TORCH_CHECK(!window.empty(), "accumulate_window: empty window (no micro-batches)");
  std::vector<int64_t> items;
  for (size_t i = 0; i < window.size(); ++i) {
    check_micro_batch(window[i], i);  // all before the first backward: no half-accumulated window on error
    items.push_back(window[i].count());
  }
  const std::vector<double> weights = loss_weights(items, normalization);
  at::Tensor window_loss;
  for (size_t i = 0; i < window.size(); ++i) {
    const at::Tensor loss = loss_fn(window[i]);
    TORCH_CHECK(loss.defined() && loss.numel() == 1, "accumulate_window: loss_fn must return a scalar loss");
    const at::Tensor weighted = loss * weights[i];
    // backward() here, per micro-batch, frees this micro-batch's graph (its activations) before the next
    // forward: memory stays at one micro-batch. The gradients add up in .grad.
    weighted.backward();
    window_loss = window_loss.defined() ? window_loss + weighted.detach() : weighted.detach();
  }
  return window_loss;
}
// [accumulate_window]

// [train_accumulated]
AccumulationStats train_accumulated(torch::optim::Optimizer& optimizer, const std::vector<MicroBatch>& micro_batches,
                                    const LossFn& loss_fn, const AccumulationOptions& options) {
  check_options(options, micro_batches);
  AccumulationStats stats;
  const size_t k = static_cast<size_t>(options.accumulation_steps);
  for (size_t begin = 0; begin < micro_batches.size(); begin += k) {
    const size_t end = std::min(begin + k, micro_batches.size());  // the last window may be partial
    optimizer.zero_grad();                                         // only at a window boundary
    stats.window_losses.push_back(accumulate_window(slice(micro_batches, begin, end), loss_fn, options.normalization));
    optimizer.step();  // once per window
    stats.windows += 1;
    stats.optimizer_steps += 1;
    stats.backward_passes += static_cast<int64_t>(end - begin);
  }
  return stats;
}
// [train_accumulated]

// [loss_weights]
std::vector<double> loss_weights(const std::vector<int64_t>& items, Normalization normalization) {
  TORCH_CHECK(!items.empty(), "loss_weights: a window needs at least one micro-batch");
  int64_t total = 0;
  for (int64_t n : items) {
    TORCH_CHECK(n > 0, "loss_weights: every micro-batch needs at least one item, got ", n);
    total += n;
  }
  std::vector<double> weights;
  for (int64_t n : items) {
    // mean_i * n_i / total summed over i is the mean over all the window's items: the full-batch loss.
    weights.push_back(normalization == Normalization::kByItems ? static_cast<double>(n) / static_cast<double>(total)
                                                               : 1.0 / static_cast<double>(items.size()));
  }
  return weights;
}
// [loss_weights]

// [train_accumulated_amp]
AccumulationStats train_accumulated_amp(torch::optim::Optimizer& optimizer, amp::GradScaler& scaler,
                                        const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn,
                                        const AccumulationOptions& options, const amp::StepOptions& amp_options) {
  check_options(options, micro_batches);
  TORCH_CHECK(loss_fn, "train_accumulated_amp: loss_fn is empty");
  AccumulationStats stats;
  const size_t k = static_cast<size_t>(options.accumulation_steps);
  for (size_t begin = 0; begin < micro_batches.size(); begin += k) {
    const size_t end = std::min(begin + k, micro_batches.size());
    std::vector<int64_t> items;
    for (size_t i = begin; i < end; ++i) {
      check_micro_batch(micro_batches[i], i);
      items.push_back(micro_batches[i].count());
    }
    const std::vector<double> weights = loss_weights(items, options.normalization);
    optimizer.zero_grad();
    at::Tensor window_loss;
    for (size_t i = begin; i < end; ++i) {
      at::Tensor loss;
      {
        amp::AutocastGuard autocast(amp_options.device, amp_options.dtype, amp_options.autocast);
        loss = loss_fn(micro_batches[i]);
      }
      TORCH_CHECK(loss.defined() && loss.numel() == 1, "train_accumulated_amp: loss_fn must return a scalar loss");
      const at::Tensor weighted = loss.to(at::kFloat) * weights[i - begin];
      // Every micro-loss is scaled by the same scale: update() runs only after the window, so the scaled
      // gradients of the window add up consistently and one unscale divides them all.
      scaler.scale(weighted).backward();
      window_loss = window_loss.defined() ? window_loss + weighted.detach() : weighted.detach();
    }
    if (amp_options.max_grad_norm > 0) {
      scaler.unscale_(optimizer);  // clip the true gradients of the whole window
      std::vector<at::Tensor> params;
      for (auto& group : optimizer.param_groups()) {
        for (auto& param : group.params()) params.push_back(param);
      }
      torch::nn::utils::clip_grad_norm_(params, amp_options.max_grad_norm);
    }
    // An inf/NaN from any micro-batch is still in the summed gradients: step() sees it and skips the window.
    const bool stepped = scaler.step(optimizer);
    scaler.update();  // once per window: one back-off for an overflowing window, however many micro-batches
    stats.windows += 1;
    stats.backward_passes += static_cast<int64_t>(end - begin);
    stats.optimizer_steps += stepped ? 1 : 0;
    stats.skipped_windows += stepped ? 0 : 1;
    stats.window_losses.push_back(window_loss);
  }
  return stats;
}
// [train_accumulated_amp]

// [measure_memory]
MemoryModel measure_memory(const std::function<void(int64_t)>& run, c10::Device device, int64_t small, int64_t large) {
  TORCH_CHECK(run, "measure_memory: run is empty");
  TORCH_CHECK(small > 0 && small < large, "measure_memory: need 0 < small < large, got small = ", small,
              ", large = ", large);
  // One untimed, unmeasured run first: gradients and optimizer state are allocated once and then persist,
  // which would otherwise count only in the first measured point.
  run(small);
  workshop::MemoryMeter meter(device);
  auto peak_of = [&](int64_t m) {
    meter.reset();
    run(m);
    return static_cast<double>(meter.peak_bytes());
  };
  const double peak_small = peak_of(small);
  const double peak_large = peak_of(large);
  TORCH_CHECK(peak_large >= peak_small, "measure_memory: the peak shrank from ", peak_small, " bytes (m = ", small,
              ") to ", peak_large, " bytes (m = ", large, "); does run(m) really use m items?");
  MemoryModel model;
  model.bytes_per_item = (peak_large - peak_small) / static_cast<double>(large - small);
  model.fixed_bytes = peak_small - model.bytes_per_item * static_cast<double>(small);
  return model;
}
// [measure_memory]

// [plan_micro_batch]
Plan plan_micro_batch(const MemoryModel& model, int64_t effective_batch, double budget_bytes) {
  TORCH_CHECK(effective_batch > 0, "plan_micro_batch: effective_batch must be > 0, got ", effective_batch);
  TORCH_CHECK(budget_bytes > 0, "plan_micro_batch: budget_bytes must be > 0, got ", budget_bytes);
  TORCH_CHECK(model.bytes_per_item >= 0, "plan_micro_batch: bytes_per_item must be >= 0, got ", model.bytes_per_item);
  const double one_item = model.fixed_bytes + model.bytes_per_item;
  TORCH_CHECK(one_item <= budget_bytes, "plan_micro_batch: the budget of ", budget_bytes,
              " bytes does not fit even one item (", model.fixed_bytes, " fixed + ", model.bytes_per_item,
              " per item)");
  int64_t fits = effective_batch;
  if (model.bytes_per_item > 0) {
    const double most = std::floor((budget_bytes - model.fixed_bytes) / model.bytes_per_item);
    fits = static_cast<int64_t>(std::min(most, static_cast<double>(effective_batch)));
  }
  Plan plan;
  plan.accumulation_steps = (effective_batch + fits - 1) / fits;
  // Same K, evener micro-batches: 100 items with room for 40 become 34+34+32, not 40+40+20.
  plan.micro_batch = (effective_batch + plan.accumulation_steps - 1) / plan.accumulation_steps;
  plan.predicted_bytes = model.fixed_bytes + model.bytes_per_item * static_cast<double>(plan.micro_batch);
  return plan;
}
// [plan_micro_batch]

}  // namespace accum
