// Checks for lesson 5, step 2: buckets: make_buckets and bucketed averaging.
// Run: bazel test //lesson5_distributed:all   (this step only: bazel test //lesson5_distributed:ddp_step2_test)
// The seeded problems and the helpers that start ranks are in ddp_test_helpers.h.
#include "lesson5_distributed/ddp_test_helpers.h"

#include <string>
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
    std::vector<std::vector<std::string>> logs(static_cast<size_t>(n));
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
      logs[comm.rank()] = comm.log();
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      const double rel = rel_error(values_of(models[r]->parameters()), reference);
      CAPTURE(rel);
      CHECK(rel <= 1e-6);
      CHECK(buckets[r] == 3);
      CHECK(stats[r].all_reduce_calls == 3);  // calls = buckets, not parameters (6)
      CHECK(stats[r].all_reduce_bytes == kModelBytes);
      // The ring napkin from what the counting communicator logged: each all-reduce of B bytes sends 2 (N - 1) / N
      // x B from each rank, 1936 B per step for N = 2 and 2904 B for N = 4.
      std::vector<int64_t> logged;
      double napkin = 0;
      for (const std::string& entry : logs[r]) {
        if (entry.rfind("all_reduce ", 0) != 0) continue;
        logged.push_back(std::stoll(entry.substr(11)));
        napkin += dist::ring_allreduce_wire_bytes(static_cast<double>(logged.back()), n);
      }
      CHECK(logged == std::vector<int64_t>{336, 1024, 576});  // {b3, W3, b2}, {W2}, {b1, W1}
      CHECK(napkin == (n == 2 ? 1936.0 : 2904.0));
      if (r == 0) {
        MESSAGE("N = " << n << ": 3 buckets (limits 300 B, then 1000 B), " << stats[r].all_reduce_bytes
                       << " B per step handed to all-reduce, ring napkin " << napkin << " B sent per rank; rel diff "
                       << rel);
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

TEST_CASE("[step2] bucketed averaging keeps each gradient's dtype, layout and tensor (mixed dtypes, strided grads)") {
  // float32 [3, 4] whose gradient is a transpose (strided), float64 [5], bfloat16 [6], float32 [2, 3, 2, 2]
  // channels_last. Rank r's gradients are (r + 1) x a pattern; the average is computed in each gradient's own
  // dtype, so it must equal g0 / 2 + g1 / 2 in that dtype exactly (a float64 value of 0.1 x k is not a float32).
  auto pattern = [](int64_t i, int r) {
    const double scale = r + 1;
    switch (i) {
      case 0:
        return (torch::arange(12, torch::kFloat).reshape({4, 3}) * scale).t();
      case 1:
        return torch::arange(1, 6, torch::kDouble) * 0.1 * scale;
      case 2:
        return torch::arange(6, torch::kBFloat16) * scale;
      default:
        return (torch::arange(24, torch::kFloat).reshape({2, 3, 2, 2}) * scale)
            .contiguous(torch::MemoryFormat::ChannelsLast);
    }
  };
  const std::vector<std::vector<int64_t>> shapes{{3, 4}, {5}, {6}, {2, 3, 2, 2}};
  const std::vector<torch::Dtype> dtypes{torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kFloat};
  // 0: make_buckets' plan (one bucket per dtype) without the bfloat16 parameter; 1: with it, which this Gloo
  // either averages or refuses on every rank; 2: one bucket that mixes all four (it travels as float64).
  for (int variant : {0, 1, 2}) {
    CAPTURE(variant);
    const std::vector<size_t> which = variant == 0 ? std::vector<size_t>{0, 1, 3} : std::vector<size_t>{0, 1, 2, 3};
    std::vector<std::vector<torch::Tensor>> grads(2);
    std::vector<std::vector<int>> same_tensor(2), same_strides(2);
    std::vector<int64_t> bytes(2, -1);
    const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
      const int r = comm.rank();
      std::vector<torch::Tensor> params;
      for (size_t i : which) {
        params.push_back(torch::zeros(shapes[i], torch::TensorOptions().dtype(dtypes[i])).requires_grad_());
        params.back().mutable_grad() = pattern(static_cast<int64_t>(i), r);
      }
      std::vector<ddp::Bucket> plan = ddp::make_buckets(params, 1 << 20);
      if (variant == 2) {
        plan.assign(1, ddp::Bucket());
        plan[0].params = {0, 1, 2, 3};
      }
      std::vector<const void*> before;
      std::vector<std::vector<int64_t>> strides;
      for (const auto& p : params) {
        before.push_back(p.grad().unsafeGetTensorImpl());
        strides.push_back(p.grad().strides().vec());
      }
      comm.reset_stats();
      ddp::average_gradients_bucketed(comm, params, plan);
      bytes[r] = comm.stats().all_reduce_bytes;
      for (size_t k = 0; k < params.size(); ++k) {
        grads[r].push_back(params[k].grad().clone());
        same_tensor[r].push_back(params[k].grad().unsafeGetTensorImpl() == before[k] ? 1 : 0);
        same_strides[r].push_back(params[k].grad().strides().vec() == strides[k] ? 1 : 0);
      }
    });
    if (variant == 1 && !gloo_takes_bfloat16()) {
      check_every_rank_failed_with(outcomes, "Invalid scalar type");  // LibTorch 1.13's Gloo, on every rank alike
      continue;
    }
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      INFO(outcomes[r].error);
      REQUIRE(outcomes[r].ok);
      // One bucket per dtype sends each gradient in its own dtype: 48 + 40 (+ 12) + 96 B.
      if (variant < 2) CHECK(bytes[r] == (variant == 0 ? 184 : 196));
      for (size_t k = 0; k < which.size(); ++k) {
        const size_t i = which[k];
        CAPTURE(i);
        const torch::Tensor expected =
            pattern(static_cast<int64_t>(i), 0) / 2 + pattern(static_cast<int64_t>(i), 1) / 2;
        INFO(grads[r][k]);
        CHECK((grads[r][k].scalar_type() == dtypes[i]));
        CHECK(torch::equal(grads[r][k], expected));
        CHECK(same_tensor[r][k] == 1);   // the same .grad tensor, averaged in place
        CHECK(same_strides[r][k] == 1);  // its layout kept (transposed, channels_last)
      }
    }
  }
}

}  // namespace ddp_checks
