// Checks for lesson 5, step 2: buckets: make_buckets and bucketed averaging.
// Run: bazel test //lesson5_distributed:all   (this step only: bazel test //lesson5_distributed:ddp_step2_test)
// The seeded problems and the helpers that start ranks are in ddp_test_helpers.h.
#include "lesson5_distributed/ddp_test_helpers.h"

#include <vector>

#include <torch/torch.h>

#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/ddp.h"

namespace ddp_checks {

TEST_CASE("[step2] make_buckets follows DDP: reverse order, a small first bucket, closed once the limit is reached") {
  // float32 parameters of 400, 40, 400, 40, 400, 40 bytes.
  std::vector<torch::Tensor> params;
  for (int i = 0; i < 6; ++i) params.push_back(torch::zeros({i % 2 == 0 ? 100 : 10}));
  // First limit 40, then 500: {5} reaches 40 at once; {4, 3, 2} closes at 840 (past 500: it closes only once
  // reached, with the parameter that reached it); {1, 0} is still open at the end.
  const auto three = ddp::make_buckets(params, 500, 40);
  REQUIRE(three.size() == 3);
  CHECK(three[0].params == std::vector<size_t>{5});
  CHECK(three[1].params == std::vector<size_t>{4, 3, 2});
  CHECK(three[1].bytes == 840);
  CHECK(three[2].params == std::vector<size_t>{1, 0});
  CHECK(three[2].numel == 110);
  CHECK(ddp::make_buckets(params, 500).size() == 2);      // no first limit: {5, 4, 3, 2} (880 B), {1, 0}
  CHECK(ddp::make_buckets(params, 40).size() == 6);       // every parameter reaches 40 B alone
  CHECK(ddp::make_buckets(params, 1 << 20).size() == 1);  // everything in one message
  // One accumulator per dtype: a float64 parameter opens its own bucket (with its own first limit) and does not
  // close the float32 one, which goes on collecting 4, 2, 1, 0.
  params[3] = torch::zeros({10}, torch::kDouble);
  const auto mixed = ddp::make_buckets(params, 1 << 20, 40);
  REQUIRE(mixed.size() == 3);
  CHECK(mixed[0].params == std::vector<size_t>{5});
  CHECK(mixed[1].params == std::vector<size_t>{3});
  CHECK(mixed[2].params == std::vector<size_t>{4, 2, 1, 0});
  CHECK_THROWS_WITH_AS(ddp::make_buckets(params, 0), Contains("bucket_bytes must be > 0"), c10::Error);
  CHECK_THROWS_AS(ddp::make_buckets({}, 100), c10::Error);
}

TEST_CASE("[step2] DDP's default limits: 1 MiB for the first bucket, 25 MiB for the others") {
  const ddp::ReducerOptions defaults;
  CHECK(defaults.first_bucket_bytes == 1 << 20);
  CHECK(defaults.bucket_bytes == 25 << 20);
  // 40 float32 parameters of 256 KiB: 4 reach the first 1 MiB bucket, the other 36 (9 MiB) stay in one.
  const std::vector<torch::Tensor> params(40, torch::zeros({64 << 10}));
  const auto buckets = ddp::make_buckets(params, defaults.bucket_bytes, defaults.first_bucket_bytes);
  REQUIRE(buckets.size() == 2);
  CHECK(buckets[0].bytes == 1 << 20);
  CHECK(buckets[1].bytes == 36 * (256 << 10));
}

TEST_CASE("[step2] bucketed averaging makes one all-reduce per bucket, sends the same bytes, equals the full batch") {
  const Data data(16);
  const std::vector<torch::Tensor> reference = full_batch_sgd(data);
  for (int n : {2, 4}) {
    CAPTURE(n);
    auto models = replicas(n);
    std::vector<dist::CommStats> stats(static_cast<size_t>(n));
    std::vector<size_t> buckets(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      auto& model = models[comm.rank()];
      const auto params = model->parameters();
      // First limit 300, then 1000: {b3, W3, b2} = 336 B, {W2} = 1024 B, {b1, W1} = 576 B.
      const std::vector<ddp::Bucket> plan = ddp::make_buckets(params, 1000, 300);
      buckets[comm.rank()] = plan.size();
      torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1));
      sgd.zero_grad();
      torch::mse_loss(model->forward(ddp::shard(data.x, comm.rank(), n)), ddp::shard(data.y, comm.rank(), n))
          .backward();
      ddp::average_gradients_bucketed(comm, params, plan);
      sgd.step();
      stats[comm.rank()] = comm.stats();
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      const double rel = rel_error(values_of(models[r]->parameters()), reference);
      CAPTURE(rel);
      CHECK(rel <= 1e-6);
      CHECK(buckets[r] == 3);
      CHECK(stats[r].all_reduce_calls == 3);  // calls = buckets, not parameters (6)
      CHECK(stats[r].all_reduce_bytes == kModelBytes);
      if (r == 0) {
        MESSAGE("N = " << n << ": 3 buckets (limits 300 B, then 1000 B), " << stats[r].all_reduce_bytes
                       << " B per step handed to all-reduce, ring napkin "
                       << dist::ring_allreduce_wire_bytes(static_cast<double>(kModelBytes), n)
                       << " B sent per rank; rel diff " << rel);
      }
    }
  }
}

TEST_CASE("[step2] bucketed averaging rejects a parameter without a gradient") {
  auto models = replicas(2);
  const auto outcomes = dist::run_ranks_collect(launch(2), [&](dist::Comm& comm) {
    const auto params = models[comm.rank()]->parameters();
    ddp::average_gradients_bucketed(comm, params, ddp::make_buckets(params, 1000, 300));
  });
  check_every_rank_failed_with(outcomes, "has no gradient");
}

TEST_CASE(
    "[step2] bucketed averaging with a gradient missing on one rank only: the same error on every rank, at once") {
  auto models = replicas(2);
  const Data data(8);
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        const int r = comm.rank();
        const auto params = models[r]->parameters();
        shard_loss(models[r], data, r, 2).backward();
        if (r == 0) params[5].mutable_grad() = torch::Tensor();
        ddp::average_gradients_bucketed(comm, params, ddp::make_buckets(params, 1000, 300));
      },
      "parameter 5 has no gradient on rank 0");
}

TEST_CASE("[step2] bucketed averaging of models that differ gives the shape error on every rank, not a timeout") {
  std::vector<torch::nn::Sequential> models = replicas(2);
  torch::manual_seed(1);
  models[1] = torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 5));
  const Data data(4);
  const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
    auto& model = models[comm.rank()];
    const auto params = model->parameters();
    model->forward(data.x).pow(2).mean().backward();
    ddp::average_gradients_bucketed(comm, params, ddp::make_buckets(params, 1000, 300));
  });
  check_every_rank_failed_with(outcomes, "parameter shapes differ across ranks");
}

}  // namespace ddp_checks
