// Lesson 2's checks share these: the seeded models, batches and full-batch oracles. One check file per step includes
// it (accumulation_step1_test.cc ... accumulation_step4_test.cc); run them all with bazel test //lesson2_accumulation:all.
// Gradients are compared with rel_error(a, b) = max|a - b| / max|b| over all parameters, in float32; the
// full-batch gradients of the same model, from the same seed, are the reference. No BatchNorm or dropout in
// these models: both make a micro-batch's gradients depend on more than its own items.
#pragma once

#include "tests/torch_doctest.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/memory_meter.h"
#include "lesson1_amp/grad_scaler.h"
#include "common/compat/compat.h"
#include "lesson2_accumulation/accumulation.h"
#include "tests/check_helpers.h"

namespace accumulation_checks {

using doctest::Contains;

using workshop::test::rel_error;

// [problem]
// A small MLP regression problem; the same seed gives the same weights and data.
struct Problem {
  torch::nn::Sequential model{nullptr};
  torch::Tensor x;  // [n, 6]
  torch::Tensor y;  // [n, 3]

  explicit Problem(int64_t n, torch::Device device = torch::kCPU, uint64_t seed = 11) {
    torch::manual_seed(seed);
    model = torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3));
    model->to(device);
    x = torch::randn({n, 6}).to(device);
    y = torch::randn({n, 3}).to(device);
  }
  accum::LossFn loss_fn() {
    return [this](const accum::MicroBatch& mb) { return torch::mse_loss(model->forward(mb.input), mb.target); };
  }
  // The reference: one backward over all items [begin, begin + length).
  std::vector<torch::Tensor> full_batch_grads(int64_t begin = 0, int64_t length = -1) {
    if (length < 0) length = x.size(0) - begin;
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    torch::mse_loss(model->forward(x.narrow(0, begin, length)), y.narrow(0, begin, length)).backward();
    return grads();
  }
  std::vector<torch::Tensor> grads() { return workshop::test::grads_of(model->parameters()); }
  std::vector<torch::Tensor> params() { return workshop::test::values_of(model->parameters()); }
};
// [problem]

inline std::vector<torch::Tensor> minus(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < a.size(); ++i) out.push_back(a[i] - b[i]);
  return out;
}

inline std::vector<int64_t> sizes_of(const std::vector<accum::MicroBatch>& micro_batches) {
  std::vector<int64_t> out;
  for (const auto& mb : micro_batches) out.push_back(mb.input.size(0));
  return out;
}

// SGD that counts its steps.
class CountingSGD : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override {
    ++steps;
    return torch::optim::SGD::step(closure);
  }
  int64_t steps = 0;
};

enum class Opt { kSgd, kAdam };

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(Opt which, torch::nn::Sequential& model) {
  if (which == Opt::kSgd)
    return std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
  return std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.01));
}

// Parameters after one accumulated step over `micro_batch` splits vs after one step on the whole batch,
// as rel_error of the parameters. (Not of the updates: Adam's first update is about lr * sign(g) whatever the
// gradient's size, so p_after - p_before carries the float32 rounding of p, ~3e-8, against an update of 0.01.)
inline double accumulated_vs_large_step(Opt which, int64_t n, int64_t micro_batch) {
  Problem large(n);
  auto large_opt = make_optimizer(which, large.model);
  large_opt->zero_grad();
  torch::mse_loss(large.model->forward(large.x), large.y).backward();
  large_opt->step();

  Problem small(n);
  auto small_opt = make_optimizer(which, small.model);
  const auto micro_batches = accum::split_batch(small.x, small.y, micro_batch);
  accum::AccumulationOptions options;
  options.accumulation_steps = static_cast<int64_t>(micro_batches.size());  // one window
  const auto stats = accum::train_accumulated(*small_opt, micro_batches, small.loss_fn(), options);
  CHECK(stats.optimizer_steps == 1);
  return rel_error(small.params(), large.params());
}

// The mean loss over the items [begin, begin + length) at the current parameters (no graph).
inline double mean_loss(Problem& problem, int64_t begin, int64_t length) {
  torch::NoGradGuard no_grad;
  return torch::mse_loss(problem.model->forward(problem.x.narrow(0, begin, length)), problem.y.narrow(0, begin, length))
      .item<double>();
}

// Checks that stats.window_losses are the mean losses over each window's items (parameters unchanged: lr 0).
inline void check_window_losses(Problem& problem, const accum::AccumulationStats& stats,
                                const std::vector<int64_t>& window_items) {
  REQUIRE(stats.window_losses.size() == window_items.size());
  int64_t begin = 0;
  for (size_t w = 0; w < window_items.size(); ++w) {
    CAPTURE(w);
    REQUIRE(stats.window_losses[w].numel() == 1);
    CHECK_FALSE(stats.window_losses[w].requires_grad());
    CHECK(stats.window_losses[w].item<double>() ==
          doctest::Approx(mean_loss(problem, begin, window_items[w])).epsilon(1e-6));
    begin += window_items[w];
  }
}

// A deeper MLP whose activations dominate its memory, for the memory checks.
struct WideProblem {
  torch::nn::Sequential model{nullptr};
  torch::Tensor x;  // [n, 64]
  torch::Tensor y;  // [n, 8]

  explicit WideProblem(int64_t n) {
    torch::manual_seed(5);
    model = torch::nn::Sequential(torch::nn::Linear(64, 256), torch::nn::ReLU(), torch::nn::Linear(256, 256),
                                  torch::nn::ReLU(), torch::nn::Linear(256, 8));
    x = torch::randn({n, 64});
    y = torch::randn({n, 8});
  }
  accum::LossFn loss_fn() {
    return [this](const accum::MicroBatch& mb) { return torch::mse_loss(model->forward(mb.input), mb.target); };
  }
  // Peak bytes of one pass over the batch in micro-batches of m, K micro-batches per window.
  int64_t peak_bytes(torch::optim::Optimizer& optimizer, int64_t m, int64_t k) {
    const auto micro_batches = accum::split_batch(x, y, m);
    accum::AccumulationOptions options;
    options.accumulation_steps = k;
    workshop::MemoryMeter meter;
    accum::train_accumulated(optimizer, micro_batches, loss_fn(), options);
    return meter.peak_bytes();
  }
};

inline amp::GradScaler make_scaler(double init_scale, int64_t growth_interval) {
  amp::GradScalerOptions options;
  options.init_scale = init_scale;
  options.growth_factor = 2.0;
  options.backoff_factor = 0.5;
  options.growth_interval = growth_interval;
  return amp::GradScaler(options);
}

inline amp::StepOptions no_autocast() {
  amp::StepOptions options;
  options.autocast = false;  // float32 forward: these checks are about the scaler's bookkeeping
  return options;
}

}  // namespace accumulation_checks
