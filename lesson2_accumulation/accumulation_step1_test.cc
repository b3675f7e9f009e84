// Checks for lesson 2, step 1: the accumulation loop.
// Run: bazel test //lesson2_accumulation:all   (this step only: bazel test //lesson2_accumulation:accumulation_step1_test)
// The shared problems and helpers are in accumulation_test_helpers.h.
#include "lesson2_accumulation/accumulation_test_helpers.h"

namespace accumulation_checks {

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

}  // namespace accumulation_checks
