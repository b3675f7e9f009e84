// Checks for lesson 2, step 2: normalise by the window's items.
// Run: bazel test //lesson2_accumulation:all   (this step only: bazel test //lesson2_accumulation:accumulation_step2_test)
// The shared problems and helpers are in accumulation_test_helpers.h.
#include "lesson2_accumulation/accumulation_test_helpers.h"

namespace accumulation_checks {

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

}  // namespace accumulation_checks
