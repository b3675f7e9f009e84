// Checks for lesson 2: gradient accumulation (steps 1-4).
// Run: bazel test //lesson2_accumulation:all   (one step: --test_arg=--test-case='*step2*')
// Gradients are compared with rel_error(a, b) = max|a - b| / max|b| over all parameters, in float32; the
// full-batch gradients of the same model, from the same seed, are the reference. No BatchNorm or dropout in
// these models: both make a micro-batch's gradients depend on more than its own items.
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

using doctest::Contains;

namespace {

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

std::vector<torch::Tensor> minus(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < a.size(); ++i) out.push_back(a[i] - b[i]);
  return out;
}

std::vector<int64_t> sizes_of(const std::vector<accum::MicroBatch>& micro_batches) {
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

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Opt which, torch::nn::Sequential& model) {
  if (which == Opt::kSgd)
    return std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
  return std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.01));
}

// Parameters after one accumulated step over `micro_batch` splits vs after one step on the whole batch,
// as rel_error of the parameters. (Not of the updates: Adam's first update is about lr * sign(g) whatever the
// gradient's size, so p_after - p_before carries the float32 rounding of p, ~3e-8, against an update of 0.01.)
double accumulated_vs_large_step(Opt which, int64_t n, int64_t micro_batch) {
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
double mean_loss(Problem& problem, int64_t begin, int64_t length) {
  torch::NoGradGuard no_grad;
  return torch::mse_loss(problem.model->forward(problem.x.narrow(0, begin, length)), problem.y.narrow(0, begin, length))
      .item<double>();
}

// Checks that stats.window_losses are the mean losses over each window's items (parameters unchanged: lr 0).
void check_window_losses(Problem& problem, const accum::AccumulationStats& stats,
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

}  // namespace

// ---- step 1: the accumulation loop -----------------------------------------------------------------------

TEST_CASE("[step1] split_batch cuts a batch into views of m items, the last one holding the remainder") {
  const auto x = torch::arange(20, torch::kFloat).reshape({10, 2});
  const auto y = torch::arange(10, torch::kFloat);
  const auto micro_batches = accum::split_batch(x, y, 4);
  CHECK(sizes_of(micro_batches) == std::vector<int64_t>{4, 4, 2});
  REQUIRE(micro_batches.size() == 3);
  CHECK(torch::equal(micro_batches[2].input, x.narrow(0, 8, 2)));
  CHECK(torch::equal(micro_batches[1].target, y.narrow(0, 4, 4)));
  CHECK(micro_batches[1].input.is_alias_of(x));  // a view, not a copy
  CHECK(micro_batches[2].count() == 2);
  CHECK(sizes_of(accum::split_batch(x, y, 10)) == std::vector<int64_t>{10});
  CHECK(sizes_of(accum::split_batch(x, y, 64)) == std::vector<int64_t>{10});
}

TEST_CASE("[step1] accumulated gradients of equal micro-batches equal the full-batch gradients") {
  Problem problem(32);
  const auto full = problem.full_batch_grads();
  for (int64_t m : {1, 2, 4, 8, 16, 32}) {
    for (auto& p : problem.model->parameters()) p.mutable_grad() = torch::Tensor();
    const auto window = accum::split_batch(problem.x, problem.y, m);
    const auto loss = accum::accumulate_window(window, problem.loss_fn());
    const double error = rel_error(problem.grads(), full);
    CAPTURE(m);
    CAPTURE(error);
    CHECK(error <= 1e-6);
    torch::NoGradGuard no_grad;
    CHECK(loss.item<double>() ==
          doctest::Approx(torch::mse_loss(problem.model->forward(problem.x), problem.y).item<double>()).epsilon(1e-6));
  }
}

TEST_CASE("[step1] the optimizer steps exactly ceil(N/K) times and zeroes only at window boundaries") {
  // lr = 0: the parameters never move, so after the pass .grad must hold exactly the LAST window's gradient.
  struct Case {
    int64_t micro_batches, k;
  };
  for (Case c : {Case{8, 4}, Case{9, 4}, Case{7, 3}, Case{5, 1}, Case{3, 8}}) {
    CAPTURE(c.micro_batches);
    CAPTURE(c.k);
    Problem problem(4 * c.micro_batches);
    CountingSGD sgd(problem.model->parameters(), torch::optim::SGDOptions(0.0));
    accum::AccumulationOptions options;
    options.accumulation_steps = c.k;
    const auto micro_batches = accum::split_batch(problem.x, problem.y, 4);
    const auto stats = accum::train_accumulated(sgd, micro_batches, problem.loss_fn(), options);
    const int64_t windows = (c.micro_batches + c.k - 1) / c.k;
    CHECK(sgd.steps == windows);
    CHECK(stats.optimizer_steps == windows);
    CHECK(stats.windows == windows);
    CHECK(stats.backward_passes == c.micro_batches);
    CHECK(stats.skipped_windows == 0);
    CHECK(static_cast<int64_t>(stats.window_losses.size()) == windows);
    const auto accumulated = problem.grads();
    const int64_t last_begin = (windows - 1) * c.k * 4;  // first item of the last (maybe partial) window
    const double error = rel_error(accumulated, problem.full_batch_grads(last_begin));
    CAPTURE(error);
    CHECK(error <= 1e-6);
  }
}

TEST_CASE("[step1] the window losses are each window's mean loss") {
  Problem problem(40);  // 10 micro-batches of 4, K = 3: windows of 12, 12, 12 and 4 items
  torch::optim::SGD sgd(problem.model->parameters(), torch::optim::SGDOptions(0.0));
  accum::AccumulationOptions options;
  options.accumulation_steps = 3;
  const auto stats =
      accum::train_accumulated(sgd, accum::split_batch(problem.x, problem.y, 4), problem.loss_fn(), options);
  check_window_losses(problem, stats, {12, 12, 12, 4});
}

TEST_CASE("[step1] parameters after one accumulated step equal one large-batch step (SGD and Adam)") {
  for (Opt which : {Opt::kSgd, Opt::kAdam}) {
    for (int64_t m : {4, 8}) {
      const double error = accumulated_vs_large_step(which, 32, m);
      const std::string optimizer = which == Opt::kSgd ? "SGD" : "Adam";
      CAPTURE(optimizer);
      CAPTURE(m);
      CAPTURE(error);
      CHECK(error <= 1e-6);
    }
  }
}

TEST_CASE("[step1] three accumulated windows train exactly like three large-batch steps") {
  Problem large(48);
  torch::optim::Adam large_opt(large.model->parameters(), torch::optim::AdamOptions(0.01));
  for (int64_t begin = 0; begin < 48; begin += 16) {
    large_opt.zero_grad();
    torch::mse_loss(large.model->forward(large.x.narrow(0, begin, 16)), large.y.narrow(0, begin, 16)).backward();
    large_opt.step();
  }
  Problem small(48);
  torch::optim::Adam small_opt(small.model->parameters(), torch::optim::AdamOptions(0.01));
  accum::AccumulationOptions options;
  options.accumulation_steps = 4;  // 4 micro-batches of 4 items = 16 per step
  accum::train_accumulated(small_opt, accum::split_batch(small.x, small.y, 4), small.loss_fn(), options);
  const double error = rel_error(small.params(), large.params());
  CAPTURE(error);
  CHECK(error <= 1e-6);
}

TEST_CASE("[step1] peak bytes while accumulating K micro-batches of m stay near one batch of m, far below K*m") {
  // Summing the K losses and calling backward once would keep K graphs (K micro-batches of activations)
  // alive; backward per micro-batch frees each graph before the next forward.
  const int64_t m = 32, k = 32;
  WideProblem problem(m * k);
  torch::optim::SGD sgd(problem.model->parameters(), torch::optim::SGDOptions(0.01));
  problem.peak_bytes(sgd, m, 1);                                  // warm-up: gradients exist from here on
  const int64_t one_micro_batch = problem.peak_bytes(sgd, m, 1);  // a step per micro-batch of m: no accumulation
  const int64_t window_of_two = problem.peak_bytes(sgd, m, 2);    // windows of 2 micro-batches of m
  const int64_t accumulated = problem.peak_bytes(sgd, m, k);      // K micro-batches of m, one step per window
  const int64_t full_batch = problem.peak_bytes(sgd, m * k, 1);   // one batch of K*m
  // Adding a micro-batch's gradient into .grad needs that gradient first: at most one set of gradient-sized
  // temporaries on top of one micro-batch's activations. Whether the single micro-batch already pays for them
  // depends on zero_grad(): LibTorch 1.13 zeroes the gradients in place (every backward then adds into them:
  // ~362 KB here), 2.x sets them to none (backward hands its result over without a copy: ~68 KB).
  int64_t gradient_bytes = 0;
  for (const auto& p : problem.model->parameters())
    gradient_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  CAPTURE(one_micro_batch);
  CAPTURE(window_of_two);
  CAPTURE(accumulated);
  CAPTURE(full_batch);
  CAPTURE(gradient_bytes);
  REQUIRE(one_micro_batch > 0);
  CHECK(accumulated <= one_micro_batch + gradient_bytes);
  // The peak does not grow with K: a window of 32 holds what a window of 2 holds (give or take the scalar
  // losses the window sums up).
  CHECK(accumulated <= window_of_two + 1024);
  CHECK(accumulated * 4 < full_batch);
}

TEST_CASE("[step1] bad input gets a clear error") {
  Problem problem(8);
  torch::optim::SGD sgd(problem.model->parameters(), torch::optim::SGDOptions(0.1));
  const auto micro_batches = accum::split_batch(problem.x, problem.y, 4);
  accum::AccumulationOptions options;
  SUBCASE("K <= 0") {
    options.accumulation_steps = 0;
    CHECK_THROWS_WITH_AS(accum::train_accumulated(sgd, micro_batches, problem.loss_fn(), options),
                         Contains("accumulation_steps"), c10::Error);
    options.accumulation_steps = -2;
    CHECK_THROWS_WITH_AS(accum::train_accumulated(sgd, micro_batches, problem.loss_fn(), options),
                         Contains("accumulation_steps"), c10::Error);
  }
  SUBCASE("empty batch") {
    CHECK_THROWS_WITH_AS(accum::train_accumulated(sgd, {}, problem.loss_fn(), options), Contains("empty batch"),
                         c10::Error);
    CHECK_THROWS_WITH_AS(accum::split_batch(torch::zeros({0, 6}), torch::zeros({0, 3}), 4), Contains("empty batch"),
                         c10::Error);
    CHECK_THROWS_WITH_AS(accum::accumulate_window({}, problem.loss_fn()), Contains("empty window"), c10::Error);
    const accum::MicroBatch no_items{torch::zeros({0, 6}), torch::zeros({0, 3})};
    CHECK_THROWS_WITH_AS(accum::accumulate_window({micro_batches[0], no_items}, problem.loss_fn()),
                         Contains("is empty"), c10::Error);
  }
  SUBCASE("mismatched sizes") {
    CHECK_THROWS_WITH_AS(accum::split_batch(problem.x, problem.y.narrow(0, 0, 7), 4), Contains("mismatched sizes"),
                         c10::Error);
    const accum::MicroBatch mismatched{problem.x.narrow(0, 0, 4), problem.y.narrow(0, 0, 3)};
    CHECK_THROWS_WITH_AS(accum::train_accumulated(sgd, {micro_batches[0], mismatched}, problem.loss_fn(), options),
                         Contains("mismatched sizes"), c10::Error);
  }
  SUBCASE("micro-batch size <= 0") {
    CHECK_THROWS_WITH_AS(accum::split_batch(problem.x, problem.y, 0), Contains("micro_batch_size"), c10::Error);
  }
  SUBCASE("a loss that is not a scalar") {
    const accum::LossFn per_item = [&](const accum::MicroBatch& mb) {
      return torch::mse_loss(problem.model->forward(mb.input), mb.target, torch::Reduction::None);
    };
    CHECK_THROWS_WITH_AS(accum::accumulate_window(micro_batches, per_item), Contains("scalar"), c10::Error);
  }
}

GPU_TEST_CASE("[step1] on CUDA, accumulated gradients equal the full-batch gradients") {
  Problem problem(32, torch::kCUDA);
  const auto full = problem.full_batch_grads();
  for (auto& p : problem.model->parameters()) p.mutable_grad() = torch::Tensor();
  accum::accumulate_window(accum::split_batch(problem.x, problem.y, 4), problem.loss_fn());
  const double error = rel_error(problem.grads(), full);
  CAPTURE(error);
  CHECK(error <= 1e-5);  // cuBLAS may pick different reduction orders for different shapes
}

// ---- step 2: normalise by the window's items ---------------------------------------------------------------

TEST_CASE("[step2] loss weights: items over the window's total, or one over the micro-batch count (mean of means)") {
  const auto by_items = accum::loss_weights({7, 1}, accum::Normalization::kByItems);
  REQUIRE(by_items.size() == 2);
  CHECK(by_items[0] == doctest::Approx(7.0 / 8.0));
  CHECK(by_items[1] == doctest::Approx(1.0 / 8.0));
  const auto naive = accum::loss_weights({7, 1}, accum::Normalization::kMeanOfMeans);
  REQUIRE(naive.size() == 2);
  CHECK(naive[0] == doctest::Approx(0.5));
  CHECK(naive[1] == doctest::Approx(0.5));
  const auto equal = accum::loss_weights({4, 4, 4, 4}, accum::Normalization::kByItems);
  for (double w : equal) CHECK(w == doctest::Approx(0.25));
}

TEST_CASE("[step2] uneven micro-batches: weighting by items matches the full batch, the mean of means does not") {
  Problem problem(23);
  const auto full = problem.full_batch_grads();
  const auto window = accum::split_batch(problem.x, problem.y, 10);  // 10 + 10 + 3 items
  REQUIRE(sizes_of(window) == std::vector<int64_t>{10, 10, 3});
  auto accumulated_error = [&](accum::Normalization normalization) {
    for (auto& p : problem.model->parameters()) p.mutable_grad() = torch::Tensor();
    accum::accumulate_window(window, problem.loss_fn(), normalization);
    return rel_error(problem.grads(), full);
  };
  const double by_items = accumulated_error(accum::Normalization::kByItems);
  const double mean_of_means = accumulated_error(accum::Normalization::kMeanOfMeans);
  CAPTURE(by_items);
  CAPTURE(mean_of_means);
  CHECK(by_items <= 1e-6);
  CHECK(mean_of_means >= 1e-2);  // the 3-item micro-batch weighs as much as a 10-item one
}

TEST_CASE("[step2] parameters after one step over uneven micro-batches equal one large-batch step (SGD and Adam)") {
  for (Opt which : {Opt::kSgd, Opt::kAdam}) {
    for (int64_t m : {5, 7, 10}) {  // 23 items: 5+5+5+5+3, 7+7+7+2, 10+10+3
      const double error = accumulated_vs_large_step(which, 23, m);
      const std::string optimizer = which == Opt::kSgd ? "SGD" : "Adam";
      CAPTURE(optimizer);
      CAPTURE(m);
      CAPTURE(error);
      CHECK(error <= 1e-6);
    }
  }
}

TEST_CASE("[step2] every item weighs the same, in a last partial window and in a window of unequal micro-batches") {
  // K = 2 over micro-batches of 4, 4, 4, 4, 2 items: windows of 8, 8 and 2 items. lr = 0, so .grad ends with
  // the last window's gradient, which must be the mean over ITS items whatever K was.
  Problem problem(18);
  torch::optim::SGD sgd(problem.model->parameters(), torch::optim::SGDOptions(0.0));
  accum::AccumulationOptions options;
  options.accumulation_steps = 2;
  const auto micro_batches = accum::split_batch(problem.x, problem.y, 4);
  REQUIRE(sizes_of(micro_batches) == std::vector<int64_t>{4, 4, 4, 4, 2});
  const auto stats = accum::train_accumulated(sgd, micro_batches, problem.loss_fn(), options);
  CHECK(stats.windows == 3);
  const double error = rel_error(problem.grads(), problem.full_batch_grads(16));
  CAPTURE(error);
  CHECK(error <= 1e-6);
  // And with the middle window made uneven (4 + 2 items), the weights still follow the items.
  Problem uneven(10);
  torch::optim::SGD sgd2(uneven.model->parameters(), torch::optim::SGDOptions(0.0));
  const accum::MicroBatch four{uneven.x.narrow(0, 0, 4), uneven.y.narrow(0, 0, 4)};
  const accum::MicroBatch two{uneven.x.narrow(0, 8, 2), uneven.y.narrow(0, 8, 2)};
  accum::train_accumulated(sgd2, {four, two}, uneven.loss_fn(), options);  // one window of 4 + 2 items
  std::vector<torch::Tensor> accumulated = uneven.grads();
  Problem reference(10);
  for (auto& p : reference.model->parameters()) p.mutable_grad() = torch::Tensor();
  torch::mse_loss(reference.model->forward(torch::cat({reference.x.narrow(0, 0, 4), reference.x.narrow(0, 8, 2)})),
                  torch::cat({reference.y.narrow(0, 0, 4), reference.y.narrow(0, 8, 2)}))
      .backward();
  const double uneven_error = rel_error(accumulated, reference.grads());
  CAPTURE(uneven_error);
  CHECK(uneven_error <= 1e-6);
}

TEST_CASE("[step2] per-token losses: weighting by MicroBatch::items equals the mean over all the window's tokens") {
  // The 2024 bug's setting: sequences padded to one length, the loss averaged over real (unmasked) tokens.
  // target[..., 0] is the value, target[..., 1] the mask (1 = a real token).
  torch::manual_seed(3);
  torch::nn::Linear model(4, 1);
  const auto x = torch::randn({6, 5, 4});                  // [sequences, tokens, features]
  const auto lengths = torch::tensor({5, 1, 2, 5, 4, 1});  // real tokens per sequence
  const auto mask = (torch::arange(5).unsqueeze(0) < lengths.unsqueeze(1)).to(torch::kFloat);  // [6, 5]
  const auto target = torch::stack({torch::randn({6, 5}), mask}, 2);                           // [6, 5, 2]
  auto token_sum = [&](const torch::Tensor& input, const torch::Tensor& t) {
    const auto err = model->forward(input).squeeze(2) - t.select(2, 0);
    return (err * err * t.select(2, 1)).sum();
  };
  const accum::LossFn mean_over_tokens = [&](const accum::MicroBatch& mb) {
    return token_sum(mb.input, mb.target) / mb.target.select(2, 1).sum();
  };
  model->zero_grad();
  (token_sum(x, target) / mask.sum()).backward();
  std::vector<torch::Tensor> full{model->weight.grad().clone(), model->bias.grad().clone()};

  auto window = accum::split_batch(x, target, 2);  // 3 micro-batches of 2 sequences: 6, 7 and 5 tokens
  for (auto& mb : window) mb.items = mb.target.select(2, 1).sum().item<int64_t>();
  REQUIRE(window[0].count() == 6);
  model->zero_grad();
  accum::accumulate_window(window, mean_over_tokens, accum::Normalization::kByItems);
  const double by_tokens = rel_error({model->weight.grad().clone(), model->bias.grad().clone()}, full);
  model->zero_grad();
  accum::accumulate_window(window, mean_over_tokens, accum::Normalization::kMeanOfMeans);
  const double mean_of_means = rel_error({model->weight.grad().clone(), model->bias.grad().clone()}, full);
  CAPTURE(by_tokens);
  CAPTURE(mean_of_means);
  CHECK(by_tokens <= 1e-6);
  CHECK(mean_of_means >= 1e-2);
}

TEST_CASE("[step2] the window losses of uneven windows are the means over their items") {
  Problem problem(23);  // micro-batches 5+5+5 | 5+3
  torch::optim::SGD sgd(problem.model->parameters(), torch::optim::SGDOptions(0.0));
  accum::AccumulationOptions options;
  options.accumulation_steps = 3;
  const auto stats =
      accum::train_accumulated(sgd, accum::split_batch(problem.x, problem.y, 5), problem.loss_fn(), options);
  check_window_losses(problem, stats, {15, 8});
}

TEST_CASE("[step2] bad input to loss_weights gets a clear error") {
  CHECK_THROWS_WITH_AS(accum::loss_weights({}, accum::Normalization::kByItems), Contains("at least one micro-batch"),
                       c10::Error);
  CHECK_THROWS_WITH_AS(accum::loss_weights({3, 0}, accum::Normalization::kByItems), Contains("at least one item"),
                       c10::Error);
  CHECK_THROWS_WITH_AS(accum::loss_weights({-1}, accum::Normalization::kMeanOfMeans), Contains("at least one item"),
                       c10::Error);
}

// ---- step 3: accumulation with a gradient scaler ------------------------------------------------------------

namespace {

amp::GradScaler make_scaler(double init_scale, int64_t growth_interval) {
  amp::GradScalerOptions options;
  options.init_scale = init_scale;
  options.growth_factor = 2.0;
  options.backoff_factor = 0.5;
  options.growth_interval = growth_interval;
  return amp::GradScaler(options);
}

amp::StepOptions no_autocast() {
  amp::StepOptions options;
  options.autocast = false;  // float32 forward: these checks are about the scaler's bookkeeping
  return options;
}

}  // namespace

TEST_CASE("[step3] the scale stays fixed inside a window and is updated once per window") {
  Problem problem(24);
  torch::optim::SGD sgd(problem.model->parameters(), torch::optim::SGDOptions(0.1));
  amp::GradScaler scaler = make_scaler(1024.0, /*growth_interval=*/1);  // grows at every clean update
  std::vector<double> seen;                                             // the scale each micro-batch saw
  const accum::LossFn loss_fn = [&](const accum::MicroBatch& mb) {
    seen.push_back(scaler.get_scale());
    return torch::mse_loss(problem.model->forward(mb.input), mb.target);
  };
  accum::AccumulationOptions options;
  options.accumulation_steps = 3;
  const auto stats = accum::train_accumulated_amp(sgd, scaler, accum::split_batch(problem.x, problem.y, 3), loss_fn,
                                                  options, no_autocast());  // 8 micro-batches: 3 + 3 + 2
  CHECK(seen == std::vector<double>{1024, 1024, 1024, 2048, 2048, 2048, 4096, 4096});
  CHECK(scaler.get_scale() == 8192.0);  // three windows, three updates
  CHECK(stats.windows == 3);
  CHECK(stats.optimizer_steps == 3);
  CHECK(stats.skipped_windows == 0);
  CHECK(stats.backward_passes == 8);
}

TEST_CASE("[step3] an inf in one micro-batch skips its whole window and backs the scale off once") {
  Problem problem(24);
  amp::GradScaler scaler = make_scaler(1024.0, /*growth_interval=*/1000);  // no growth in this test
  const auto micro_batches = accum::split_batch(problem.x, problem.y, 4);  // 6 micro-batches of 4
  int calls = 0;
  const accum::LossFn loss_fn = [&](const accum::MicroBatch& mb) {
    const auto loss = torch::mse_loss(problem.model->forward(mb.input), mb.target);
    ++calls;
    // The 4th micro-batch (in the middle window) overflows; the others in its window are clean.
    return calls == 4 ? loss * std::numeric_limits<float>::infinity() : loss;
  };
  accum::AccumulationOptions options;
  options.accumulation_steps = 2;  // windows {0,1}, {2,3}, {4,5}
  CountingSGD counting(problem.model->parameters(), torch::optim::SGDOptions(0.1));
  const auto stats = accum::train_accumulated_amp(counting, scaler, micro_batches, loss_fn, options, no_autocast());
  CHECK(stats.windows == 3);
  CHECK(stats.skipped_windows == 1);
  CHECK(stats.optimizer_steps == 2);
  CHECK(counting.steps == 2);
  CHECK(scaler.get_scale() == 512.0);  // one back-off for the window, not one per micro-batch

  // The result equals plain accumulation over the two clean windows only.
  Problem reference(24);
  torch::optim::SGD reference_sgd(reference.model->parameters(), torch::optim::SGDOptions(0.1));
  const auto all = accum::split_batch(reference.x, reference.y, 4);
  accum::train_accumulated(reference_sgd, {all[0], all[1], all[4], all[5]}, reference.loss_fn(), options);
  const double error = rel_error(problem.params(), reference.params());
  CAPTURE(error);
  CHECK(error <= 1e-6);
}

TEST_CASE("[step3] without overflow, scaled accumulation over uneven micro-batches equals plain accumulation") {
  Problem scaled(23);
  torch::optim::Adam scaled_adam(scaled.model->parameters(), torch::optim::AdamOptions(0.01));
  amp::GradScaler scaler = make_scaler(65536.0, 2);
  accum::AccumulationOptions options;
  options.accumulation_steps = 3;  // micro-batches 5+5+5 | 5+3
  const auto stats = accum::train_accumulated_amp(scaled_adam, scaler, accum::split_batch(scaled.x, scaled.y, 5),
                                                  scaled.loss_fn(), options, no_autocast());
  CHECK(stats.optimizer_steps == 2);

  Problem plain(23);
  torch::optim::Adam plain_adam(plain.model->parameters(), torch::optim::AdamOptions(0.01));
  accum::train_accumulated(plain_adam, accum::split_batch(plain.x, plain.y, 5), plain.loss_fn(), options);
  const double error = rel_error(scaled.params(), plain.params());
  CAPTURE(error);
  CHECK(error <= 1e-6);  // power-of-two scales: scaling and unscaling are exact in float32
}

TEST_CASE("[step3] the window losses with a scaler are the unscaled means over each window's items") {
  Problem problem(23);  // micro-batches 5+5+5 | 5+3
  torch::optim::SGD sgd(problem.model->parameters(), torch::optim::SGDOptions(0.0));
  amp::GradScaler scaler = make_scaler(1024.0, 1000);
  accum::AccumulationOptions options;
  options.accumulation_steps = 3;
  const auto stats = accum::train_accumulated_amp(sgd, scaler, accum::split_batch(problem.x, problem.y, 5),
                                                  problem.loss_fn(), options, no_autocast());
  CHECK(stats.optimizer_steps == 2);
  check_window_losses(problem, stats, {15, 8});
}

TEST_CASE("[step3] with a scaler and max_grad_norm, each window's unscaled accumulated gradients are clipped") {
  const double max_norm = 0.02;
  accum::AccumulationOptions options;
  options.accumulation_steps = 2;  // micro-batches of 4: windows {0,1}, {2,3}, {4,5}
  Problem reference(24);
  torch::optim::SGD ref_sgd(reference.model->parameters(), torch::optim::SGDOptions(0.1));
  const auto ref_batches = accum::split_batch(reference.x, reference.y, 4);
  for (size_t begin = 0; begin < ref_batches.size(); begin += 2) {
    ref_sgd.zero_grad();
    accum::accumulate_window({ref_batches[begin], ref_batches[begin + 1]}, reference.loss_fn());
    const double norm = torch::nn::utils::clip_grad_norm_(reference.model->parameters(), max_norm);
    CAPTURE(norm);
    REQUIRE(norm > max_norm);  // the clip really acts
    ref_sgd.step();
  }
  Problem clipped(24);
  torch::optim::SGD sgd(clipped.model->parameters(), torch::optim::SGDOptions(0.1));
  amp::GradScaler scaler = make_scaler(65536.0, 1000);
  amp::StepOptions amp_options = no_autocast();
  amp_options.max_grad_norm = max_norm;
  const auto stats = accum::train_accumulated_amp(sgd, scaler, accum::split_batch(clipped.x, clipped.y, 4),
                                                  clipped.loss_fn(), options, amp_options);
  CHECK(stats.optimizer_steps == 3);
  const double error = rel_error(clipped.params(), reference.params());
  CAPTURE(error);
  CHECK(error <= 1e-6);
}

TEST_CASE("[step3] with a scaler, every micro-batch's backward runs with autocast off") {
  Problem problem(12);
  torch::optim::SGD sgd(problem.model->parameters(), torch::optim::SGDOptions(0.1));
  amp::GradScaler scaler = make_scaler(1024.0, 1000);
  std::vector<bool> forward_autocast, backward_autocast;
  const accum::LossFn loss_fn = [&](const accum::MicroBatch& mb) {
    forward_autocast.push_back(workshop::compat::autocast_enabled(torch::kCPU));
    auto loss = torch::mse_loss(problem.model->forward(mb.input).to(torch::kFloat), mb.target);
    loss.register_hook([&](const torch::Tensor& grad) {  // runs when backward reaches this micro-batch's loss
      backward_autocast.push_back(workshop::compat::autocast_enabled(torch::kCPU));
      return grad;
    });
    return loss;
  };
  accum::AccumulationOptions options;
  options.accumulation_steps = 3;
  accum::train_accumulated_amp(sgd, scaler, accum::split_batch(problem.x, problem.y, 4), loss_fn, options,
                               amp::StepOptions{});  // CPU, bfloat16 autocast for the forward
  CHECK(forward_autocast == std::vector<bool>{true, true, true});
  CHECK(backward_autocast == std::vector<bool>{false, false, false});
}

TEST_CASE("[step3] with bfloat16 autocast on CPU, accumulated AMP training tracks float32 accumulation") {
  Problem amp_run(32), fp32_run(32);
  torch::optim::SGD amp_sgd(amp_run.model->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD fp32_sgd(fp32_run.model->parameters(), torch::optim::SGDOptions(0.1));
  amp::GradScaler scaler = make_scaler(256.0, 1000);
  accum::AccumulationOptions options;
  options.accumulation_steps = 4;
  amp::StepOptions bf16;  // CPU, bfloat16, autocast on
  const auto before = amp_run.params();
  accum::train_accumulated_amp(amp_sgd, scaler, accum::split_batch(amp_run.x, amp_run.y, 4), amp_run.loss_fn(), options,
                               bf16);
  accum::train_accumulated(fp32_sgd, accum::split_batch(fp32_run.x, fp32_run.y, 4), fp32_run.loss_fn(), options);
  const double error = rel_error(minus(amp_run.params(), before), minus(fp32_run.params(), before));
  CAPTURE(error);
  CHECK(error <= 2e-2);  // bfloat16 keeps 8 significant bits: ~4e-3 relative per rounding
  for (const auto& p : amp_run.model->parameters()) CHECK(dtype_name(p.scalar_type()) == "Float");
}

TEST_CASE("[step3] bad input gets a clear error") {
  Problem problem(8);
  torch::optim::SGD sgd(problem.model->parameters(), torch::optim::SGDOptions(0.1));
  amp::GradScaler scaler = make_scaler(1024.0, 2);
  accum::AccumulationOptions options;
  options.accumulation_steps = 0;
  const auto micro_batches = accum::split_batch(problem.x, problem.y, 4);
  CHECK_THROWS_WITH_AS(accum::train_accumulated_amp(sgd, scaler, micro_batches, problem.loss_fn(), options),
                       Contains("accumulation_steps"), c10::Error);
  options.accumulation_steps = 2;
  CHECK_THROWS_WITH_AS(accum::train_accumulated_amp(sgd, scaler, {}, problem.loss_fn(), options),
                       Contains("empty batch"), c10::Error);
  const accum::MicroBatch mismatched{problem.x.narrow(0, 0, 4), problem.y.narrow(0, 0, 2)};
  CHECK_THROWS_WITH_AS(accum::train_accumulated_amp(sgd, scaler, {mismatched}, problem.loss_fn(), options),
                       Contains("mismatched sizes"), c10::Error);
}

GPU_TEST_CASE("[step3] on CUDA with float16 autocast, accumulated AMP training tracks float32 accumulation") {
  Problem amp_run(64, torch::kCUDA), fp32_run(64, torch::kCUDA);
  torch::optim::SGD amp_sgd(amp_run.model->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD fp32_sgd(fp32_run.model->parameters(), torch::optim::SGDOptions(0.1));
  amp::GradScaler scaler = make_scaler(65536.0, 1000);
  accum::AccumulationOptions options;
  options.accumulation_steps = 4;
  amp::StepOptions fp16;
  fp16.device = c10::DeviceType::CUDA;
  fp16.dtype = c10::ScalarType::Half;
  const auto before = amp_run.params();
  const auto stats = accum::train_accumulated_amp(amp_sgd, scaler, accum::split_batch(amp_run.x, amp_run.y, 8),
                                                  amp_run.loss_fn(), options, fp16);
  accum::train_accumulated(fp32_sgd, accum::split_batch(fp32_run.x, fp32_run.y, 8), fp32_run.loss_fn(), options);
  CHECK(stats.optimizer_steps == 2);
  const double error = rel_error(minus(amp_run.params(), before), minus(fp32_run.params(), before));
  CAPTURE(error);
  CHECK(error <= 1e-2);  // float16 keeps 11 bits of mantissa
}

// ---- step 4: choose the micro-batch for a memory budget -----------------------------------------------------

TEST_CASE("[step4] measure_memory recovers the bytes of a known workload") {
  torch::Tensor keep;  // something that persists once created, like gradients: must not count as per-item
  const auto run = [&](int64_t m) {
    if (!keep.defined()) keep = torch::empty({1000});
    const auto fixed = torch::empty({5000});           // 20000 bytes whatever m is
    const auto activations = torch::empty({m, 1000});  // 4000 bytes per item
    (void)fixed;
    (void)activations;
  };
  const auto model = accum::measure_memory(run, torch::kCPU, 4, 16);
  CHECK(model.bytes_per_item == doctest::Approx(4000.0));
  CHECK(model.fixed_bytes == doctest::Approx(20000.0));
}

TEST_CASE("[step4] plan_micro_batch picks the largest micro-batch that fits and keeps the effective batch") {
  const accum::MemoryModel model{1000.0, 100.0};
  const auto tight = accum::plan_micro_batch(model, 64, 1000.0 + 100.0 * 20);  // room for 20 items
  CHECK(tight.accumulation_steps == 4);                                        // ceil(64 / 20)
  CHECK(tight.micro_batch == 16);                                              // evened out: 4 x 16
  CHECK(tight.predicted_bytes == doctest::Approx(1000.0 + 100.0 * 16));
  const auto roomy = accum::plan_micro_batch(model, 64, 1e9);
  CHECK(roomy.micro_batch == 64);
  CHECK(roomy.accumulation_steps == 1);
  const auto one = accum::plan_micro_batch(model, 64, 1100.0);  // exactly one item fits
  CHECK(one.micro_batch == 1);
  CHECK(one.accumulation_steps == 64);
  for (double budget : {1500.0, 2345.0, 4000.0, 7000.0}) {
    const auto plan = accum::plan_micro_batch(model, 100, budget);
    CAPTURE(budget);
    CHECK(plan.predicted_bytes <= budget);
    CHECK(plan.micro_batch * plan.accumulation_steps >= 100);
    CHECK((plan.micro_batch - 1) * plan.accumulation_steps < 100);  // no micro-batch wasted
  }
}

TEST_CASE("[step4] a planned micro-batch keeps a real accumulated pass under the budget the full batch exceeds") {
  const int64_t effective = 256;
  WideProblem problem(effective);
  torch::optim::SGD sgd(problem.model->parameters(), torch::optim::SGDOptions(0.01));
  // Measure what will run: one window of two micro-batches of m (the second adds into existing gradients).
  const auto run = [&](int64_t m) {
    accum::AccumulationOptions options;
    options.accumulation_steps = 2;
    accum::train_accumulated(sgd, accum::split_batch(problem.x.narrow(0, 0, 2 * m), problem.y.narrow(0, 0, 2 * m), m),
                             problem.loss_fn(), options);
  };
  const auto model = accum::measure_memory(run, torch::kCPU, 8, 64);
  CAPTURE(model.fixed_bytes);
  CAPTURE(model.bytes_per_item);
  REQUIRE(model.bytes_per_item > 0);
  const double budget = model.fixed_bytes + model.bytes_per_item * effective / 5.0;  // a fifth of the batch fits
  const auto plan = accum::plan_micro_batch(model, effective, budget);
  CAPTURE(plan.micro_batch);
  CAPTURE(plan.accumulation_steps);
  CHECK(plan.accumulation_steps == 6);  // ceil(256 / floor(256 / 5)) = ceil(256 / 51)
  CHECK(plan.micro_batch * plan.accumulation_steps >= effective);
  const int64_t planned_peak = problem.peak_bytes(sgd, plan.micro_batch, plan.accumulation_steps);
  const int64_t full_peak = problem.peak_bytes(sgd, effective, 1);
  CAPTURE(budget);
  CAPTURE(planned_peak);
  CAPTURE(full_peak);
  CHECK(planned_peak <= budget);
  CHECK(full_peak > budget);
}

TEST_CASE("[step4] bad input gets a clear error") {
  const accum::MemoryModel model{1000.0, 100.0};
  CHECK_THROWS_WITH_AS(accum::plan_micro_batch(model, 0, 1e6), Contains("effective_batch"), c10::Error);
  CHECK_THROWS_WITH_AS(accum::plan_micro_batch(model, 64, 0.0), Contains("budget_bytes"), c10::Error);
  CHECK_THROWS_WITH_AS(accum::plan_micro_batch(model, 64, 1050.0), Contains("does not fit even one item"), c10::Error);
  const auto run = [](int64_t) {};
  CHECK_THROWS_WITH_AS(accum::measure_memory(run, torch::kCPU, 8, 8), Contains("small < large"), c10::Error);
  CHECK_THROWS_WITH_AS(accum::measure_memory(run, torch::kCPU, 0, 8), Contains("small < large"), c10::Error);
}
