// Checks for lesson 5: data-parallel training on c10d (steps 1-5).
// Run: bazel test //lesson5_distributed:all   (one step: --test_arg=--test-case='*step2*')
//
// How the ranks start: dist::run_ranks runs N threads in this test process, each with its OWN
// ProcessGroupGloo; the groups meet in one FileStore and then talk over Gloo's TCP transport on 127.0.0.1,
// exactly as N processes would (the demo starts real processes). Every rank's model is built here from the
// same seed before the threads start, so every run is deterministic. The reference is one process doing one
// full-batch step on the same model; parameters are compared with rel_error = max|a - b| / max|b| (float32).
#include "tests/torch_doctest.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/memory_meter.h"
#include "lesson1_amp/grad_scaler.h"
#include "lesson2_accumulation/accumulation.h"
#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/ddp.h"
#include "tests/check_helpers.h"

using doctest::Contains;

namespace {

// [problem]
// A small MLP regression problem: 8 -> 16 -> 16 -> 4, six parameters, 484 float32 elements (1936 bytes).
torch::nn::Sequential make_model(uint64_t seed = 5) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16),
                               torch::nn::Tanh(), torch::nn::Linear(16, 4));
}
constexpr int64_t kModelBytes = 1936;

struct Data {
  torch::Tensor x, y;  // [items, 8], [items, 4]
  explicit Data(int64_t items, uint64_t seed = 7) {
    torch::manual_seed(seed);
    x = torch::randn({items, 8});
    y = torch::randn({items, 4});
  }
};
// [problem]

using workshop::test::rel_error;
using workshop::test::values_of;

// Rank r's loss on its shard of `data` (of n ranks): the mean over its items.
torch::Tensor shard_loss(torch::nn::Sequential& model, const Data& data, int r, int n) {
  return torch::mse_loss(model->forward(ddp::shard(data.x, r, n)), ddp::shard(data.y, r, n));
}

dist::LaunchOptions launch(int world_size, int timeout_ms = 10000);

// Every rank failed, each with an error naming `expected` (and none of them a timeout: the ranks agreed on the
// error instead of waiting for each other).
void check_every_rank_failed_with(const std::vector<dist::RankOutcome>& outcomes, const std::string& expected) {
  REQUIRE_FALSE(outcomes.empty());
  for (size_t r = 0; r < outcomes.size(); ++r) {
    CAPTURE(r);
    INFO(outcomes[r].error);
    CHECK_FALSE(outcomes[r].ok);
    CHECK(outcomes[r].error.find(expected) != std::string::npos);
    CHECK(outcomes[r].error.find("timed out") == std::string::npos);
  }
}

// Runs `fn` on `n` ranks with a 5 s timeout and checks that every rank failed with `expected` at once: found
// by the ranks agreeing on the fault, not after the timeout (a rank that throws alone leaves its peers waiting).
void check_fails_on_every_rank(int n, const std::function<void(dist::Comm&)>& fn, const std::string& expected) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<dist::RankOutcome> outcomes = dist::run_ranks_collect(launch(n, 5000), fn);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check_every_rank_failed_with(outcomes, expected);
  CAPTURE(seconds);
  CHECK(seconds < 5.0);
}

// N identical copies of the model, one per rank, built before the ranks start.
std::vector<torch::nn::Sequential> replicas(int n, uint64_t seed = 5) {
  std::vector<torch::nn::Sequential> out;
  for (int r = 0; r < n; ++r) out.push_back(make_model(seed));
  return out;
}

// The oracle: `steps` full-batch steps of one process.
std::vector<torch::Tensor> full_batch_sgd(const Data& data, int steps = 1, double lr = 0.1) {
  auto model = make_model();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(lr));
  for (int s = 0; s < steps; ++s) {
    sgd.zero_grad();
    torch::mse_loss(model->forward(data.x), data.y).backward();
    sgd.step();
  }
  return values_of(model->parameters());
}

dist::LaunchOptions launch(int world_size, int timeout_ms) {
  dist::LaunchOptions options;
  options.world_size = world_size;
  options.timeout = std::chrono::milliseconds(timeout_ms);
  return options;
}

int leftover_store_folders() {
  const char* base = std::getenv("TEST_TMPDIR");
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(base && *base ? base : "/tmp")) {
    if (entry.path().filename().string().rfind("workshop_ranks_", 0) == 0) ++count;
  }
  return count;
}

}  // namespace

// ---- step 1 -------------------------------------------------------------------------------------------------

TEST_CASE("[step1] shard gives each rank an equal, contiguous share of the batch") {
  const torch::Tensor batch = torch::arange(12).reshape({6, 2});
  const torch::Tensor s = ddp::shard(batch, 1, 3);
  CHECK(s.size(0) == 2);
  CHECK(torch::equal(s, batch.narrow(0, 2, 2)));
  CHECK(s.data_ptr() == batch.narrow(0, 2, 2).data_ptr());  // a view, no copy
  CHECK_THROWS_WITH_AS(ddp::shard(batch, 0, 4), Contains("does not divide evenly"), c10::Error);
  CHECK_THROWS_AS(ddp::shard(batch, 3, 3), c10::Error);
  CHECK_THROWS_AS(ddp::shard(torch::Tensor(), 0, 2), c10::Error);
}

TEST_CASE("[step1] average_ gives every rank the mean of all ranks' tensors, in one all-reduce") {
  std::vector<torch::Tensor> results(4);
  std::vector<dist::CommStats> stats(4);
  dist::run_ranks(launch(4), [&](dist::Comm& comm) {
    torch::Tensor t = torch::full({3}, static_cast<float>(comm.rank() + 1));  // 1, 2, 3, 4
    ddp::average_(comm, t);
    results[comm.rank()] = t;
    stats[comm.rank()] = comm.stats();
  });
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(torch::allclose(results[r], torch::full({3}, 2.5f)));
    CHECK(stats[r].all_reduce_calls == 1);
    CHECK(stats[r].all_reduce_bytes == 12);
  }
}

TEST_CASE("[step1] per-parameter averaging after backward equals one full-batch step (N = 2 and N = 4)") {
  const Data data(16);
  const std::vector<torch::Tensor> reference = full_batch_sgd(data);
  for (int n : {2, 4}) {
    CAPTURE(n);
    auto models = replicas(n);
    std::vector<dist::CommStats> stats(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      auto& model = models[comm.rank()];
      torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
      sgd.zero_grad();
      const torch::Tensor x = ddp::shard(data.x, comm.rank(), n), y = ddp::shard(data.y, comm.rank(), n);
      torch::mse_loss(model->forward(x), y).backward();   // the mean over this rank's items
      ddp::average_gradients(comm, model->parameters());  // the mean of the means = the full-batch mean
      sgd.step();
      stats[comm.rank()] = comm.stats();
    });
    for (int r = 0; r < n; ++r) {
      const double rel = rel_error(values_of(models[r]->parameters()), reference);
      CAPTURE(r);
      CAPTURE(rel);
      CHECK(rel <= 1e-6);
      CHECK(stats[r].all_reduce_calls == 6);  // one per parameter
      CHECK(stats[r].all_reduce_bytes == kModelBytes);
      if (r == 0) MESSAGE("N = " << n << ": max rel diff to the full-batch step " << rel);
    }
  }
}

TEST_CASE("[step1] parameter shapes that differ across ranks give a clear error on every rank, not a hang") {
  std::vector<torch::nn::Sequential> models = replicas(3);
  torch::manual_seed(1);
  models[1] = torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 5));
  check_fails_on_every_rank(
      3, [&](dist::Comm& comm) { ddp::check_same_shapes(comm, models[comm.rank()]->parameters()); },
      "parameter shapes differ across ranks");
  // And the same models pass the check.
  auto same = replicas(3);
  CHECK_NOTHROW(dist::run_ranks(launch(3), [&](dist::Comm& comm) {
    ddp::check_same_shapes(comm, same[comm.rank()]->parameters());
  }));
}

TEST_CASE(
    "[step1] check_same_shapes tells a transposed layer from the original (same counts of parameters and elements)") {
  const std::vector<std::vector<torch::Tensor>> lists = {{torch::zeros({16, 8}), torch::zeros({16})},
                                                         {torch::zeros({8, 16}), torch::zeros({16})}};
  check_fails_on_every_rank(
      2, [&](dist::Comm& comm) { ddp::check_same_shapes(comm, lists[comm.rank()]); },
      "parameter shapes differ across ranks");
}

TEST_CASE("[step1] average_gradients agrees first: a missing gradient or another model fails on every rank, unsent") {
  const Data data(8);
  auto models = replicas(2);
  std::vector<int64_t> sent(2, -1);
  // Rank 1 dropped one gradient (a branch it did not take, a zero_grad at the wrong place).
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        const int r = comm.rank();
        const auto params = models[r]->parameters();
        shard_loss(models[r], data, r, 2).backward();
        if (r == 1) params[3].mutable_grad() = torch::Tensor();
        try {
          ddp::average_gradients(comm, params);
        } catch (...) {
          sent[r] = comm.stats().all_reduce_calls;
          throw;
        }
      },
      "parameter 3 has no gradient on rank 1");
  CHECK(sent == std::vector<int64_t>{0, 0});  // found before any gradient was sent
  // Models that differ: the shape error on every rank, not mismatched all-reduces.
  std::vector<torch::nn::Sequential> other = replicas(2);
  torch::manual_seed(1);
  other[1] = torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 5));
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        auto& model = other[comm.rank()];
        model->forward(data.x).pow(2).mean().backward();
        ddp::average_gradients(comm, model->parameters());
      },
      "parameter shapes differ across ranks");
}

TEST_CASE("[step1] average_gradients gives a non-contiguous gradient the average back, in its own .grad") {
  std::vector<torch::Tensor> grads(2);
  std::vector<int> same_tensor(2, -1);
  dist::run_ranks(launch(2), [&](dist::Comm& comm) {
    const int r = comm.rank();
    torch::Tensor p = torch::zeros({3, 4}, torch::requires_grad());
    // [3, 4] as the transpose of a [4, 3]: not contiguous (a gradient can be, e.g. after a user's hook).
    p.mutable_grad() = (torch::arange(12, torch::kFloat).reshape({4, 3}) * (r + 1)).t();
    const void* before = p.grad().data_ptr();
    ddp::average_gradients(comm, {p});
    grads[r] = p.grad().clone();
    same_tensor[r] = p.grad().data_ptr() == before ? 1 : 0;
  });
  const torch::Tensor mean = (torch::arange(12, torch::kFloat).reshape({4, 3}) * 1.5).t();  // (1 + 2) / 2
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    INFO(grads[r]);
    CHECK(torch::equal(grads[r], mean));
    CHECK(same_tensor[r] == 1);  // in place: a .grad another holder shares sees the average too
  }
}

TEST_CASE("[step1] a rank that stops early makes the others fail with a clear timeout error, bounded in time") {
  const Data data(12);
  auto models = replicas(3);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<dist::RankOutcome> outcomes = dist::run_ranks_collect(launch(3, 1500), [&](dist::Comm& comm) {
    if (comm.rank() == 2) return;  // leaves before the first collective
    auto& model = models[comm.rank()];
    torch::mse_loss(model->forward(ddp::shard(data.x, comm.rank(), 3)), ddp::shard(data.y, comm.rank(), 3)).backward();
    ddp::average_gradients(comm, model->parameters());
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(outcomes[2].ok);
  for (int r : {0, 1}) {
    CAPTURE(r);
    INFO(outcomes[r].error);
    CHECK_FALSE(outcomes[r].ok);
    CHECK(outcomes[r].error.find("timed out after 1500 ms") != std::string::npos);
    CHECK(outcomes[r].error.find("all_gather") != std::string::npos);  // check_gradients_ready's, the first
  }
  CAPTURE(seconds);
  CHECK(seconds < 30.0);                 // bounded: the timeout, plus rendezvous, never a hang
  CHECK(leftover_store_folders() == 0);  // the store's folder is gone
}

TEST_CASE("[step1] average_ divides before the sum: float16 values whose sum overflows average to a finite mean") {
  std::vector<torch::Tensor> results(2);
  dist::run_ranks(launch(2), [&](dist::Comm& comm) {
    torch::Tensor t = torch::full({4}, 40000.0, torch::kHalf);  // 40000 + 40000 > 65504, float16's largest
    ddp::average_(comm, t);
    results[comm.rank()] = t;
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    INFO(results[r]);
    CHECK(torch::equal(results[r], torch::full({4}, 40000.0, torch::kHalf)));  // summed first, it would be inf
  }
}

TEST_CASE("[step1] sync_module_states gives every rank rank 0's parameters and buffers, whatever its seed") {
  const int n = 3;
  std::vector<torch::nn::Sequential> models;
  std::vector<torch::Tensor> buffers;
  for (int r = 0; r < n; ++r) {
    models.push_back(make_model(100 + r));  // a different seed on every rank
    buffers.push_back(torch::full({2}, static_cast<float>(r)));
  }
  const auto rank0 = values_of(models[0]->parameters());
  REQUIRE(rel_error(values_of(models[1]->parameters()), rank0) > 0);
  std::vector<dist::CommStats> stats(n);
  dist::run_ranks(launch(n), [&](dist::Comm& comm) {
    ddp::sync_module_states(comm, models[comm.rank()]->parameters(), {buffers[comm.rank()]});
    stats[comm.rank()] = comm.stats();
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(rel_error(values_of(models[r]->parameters()), rank0) == 0);
    CHECK(torch::equal(buffers[r], torch::zeros({2})));
    CHECK(stats[r].all_gather_calls == 1);  // the shape check, before anything is sent
    CHECK(stats[r].broadcast_calls == 7);   // 6 parameters + 1 buffer
    CHECK(stats[r].broadcast_bytes == kModelBytes + 8);
  }
  // A buffer that differs in shape on one rank: the shape error on every rank, before any broadcast.
  auto same = replicas(2);
  const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
    ddp::sync_module_states(comm, same[comm.rank()]->parameters(), {torch::zeros({2 + comm.rank()})});
  });
  check_every_rank_failed_with(outcomes, "parameter shapes differ across ranks");
}

// ---- step 2 -------------------------------------------------------------------------------------------------

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

// ---- step 3 -------------------------------------------------------------------------------------------------

TEST_CASE("[step3] with overlap, the first bucket's all-reduce starts before backward has finished") {
  const Data data(16);
  for (bool overlap : {true, false}) {
    CAPTURE(overlap);
    auto models = replicas(2);
    std::vector<int64_t> calls_when_first_layer_ready(2, -1), in_backward(2, -1), calls(2, -1);
    dist::run_ranks(launch(2), [&](dist::Comm& comm) {
      const auto params = models[comm.rank()]->parameters();
      // Our hook on the first layer's weight, whose gradient backward computes last; registered before the
      // reducer's, so it runs first: how many all-reduces had started by then?
      params[0].register_hook([&, r = comm.rank()](const torch::Tensor&) {
        calls_when_first_layer_ready[r] = comm.stats().all_reduce_calls;
      });
      ddp::ReducerOptions options;
      options.bucket_bytes = 1000;
      options.first_bucket_bytes = 300;
      options.overlap = overlap;
      ddp::Reducer reducer(comm, params, options);
      comm.reset_stats();
      torch::mse_loss(models[comm.rank()]->forward(ddp::shard(data.x, comm.rank(), 2)),
                      ddp::shard(data.y, comm.rank(), 2))
          .backward();
      reducer.finish();
      in_backward[comm.rank()] = reducer.launched_in_backward();
      calls[comm.rank()] = comm.stats().all_reduce_calls;
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(calls[r] == 4);  // 3 buckets + the "no gradient" map
      if (overlap) {
        CHECK(calls_when_first_layer_ready[r] >= 1);  // launched while backward was still running
        CHECK(in_backward[r] == 3);
      } else {
        CHECK(calls_when_first_layer_ready[r] == 0);
        CHECK(in_backward[r] == 0);
      }
    }
  }
}

TEST_CASE("[step3] the reducer's averaged gradients give the full-batch steps (N = 2 and 4, overlap on and off)") {
  const Data data(16);
  const std::vector<torch::Tensor> reference = full_batch_sgd(data, 3);
  for (int n : {2, 4}) {
    for (bool overlap : {true, false}) {
      CAPTURE(n);
      CAPTURE(overlap);
      auto models = replicas(n);
      std::vector<int64_t> calls(static_cast<size_t>(n));
      dist::run_ranks(launch(n), [&](dist::Comm& comm) {
        auto& model = models[comm.rank()];
        ddp::ReducerOptions options;
        options.bucket_bytes = 1000;
        options.first_bucket_bytes = 300;
        options.overlap = overlap;
        ddp::Reducer reducer(comm, model->parameters(), options);
        torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
        comm.reset_stats();
        for (int step = 0; step < 3; ++step) {
          sgd.zero_grad();
          torch::mse_loss(model->forward(ddp::shard(data.x, comm.rank(), n)), ddp::shard(data.y, comm.rank(), n))
              .backward();
          reducer.finish();
          sgd.step();
        }
        calls[comm.rank()] = comm.stats().all_reduce_calls;
      });
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        const double rel = rel_error(values_of(models[r]->parameters()), reference);
        CAPTURE(rel);
        CHECK(rel <= 1e-6);
        CHECK(calls[r] == 12);  // (3 buckets + the "no gradient" map) x 3 steps
      }
    }
  }
}

TEST_CASE("[step3] a parameter that gets no gradient in a backward gives a clear error") {
  auto models = replicas(2);
  std::vector<torch::Tensor> extra;
  for (int r = 0; r < 2; ++r) extra.push_back(torch::zeros({3}, torch::requires_grad()));
  const Data data(4);
  const auto outcomes = dist::run_ranks_collect(launch(2), [&](dist::Comm& comm) {
    auto params = models[comm.rank()]->parameters();
    params.push_back(extra[comm.rank()]);  // never used by the loss
    ddp::Reducer reducer(comm, params);
    torch::mse_loss(models[comm.rank()]->forward(data.x), data.y).backward();
    reducer.finish();
  });
  check_every_rank_failed_with(outcomes, "got no gradient");
}

TEST_CASE("[step3] constructing the reducer gives every rank rank 0's parameters, as DDP's constructor does") {
  const int n = 3;
  for (bool frozen_first_layer : {false, true}) {
    CAPTURE(frozen_first_layer);
    std::vector<torch::nn::Sequential> models;
    for (int r = 0; r < n; ++r) {
      models.push_back(make_model(100 + r));  // a different seed on every rank
      // Frozen layers too: DDP broadcasts every parameter, not only those it reduces.
      if (frozen_first_layer) {
        for (int i : {0, 1}) models.back()->parameters()[i].requires_grad_(false);
      }
    }
    const auto rank0 = values_of(models[0]->parameters());
    REQUIRE(rel_error(values_of(models[2]->parameters()), rank0) > 0);
    dist::run_ranks(launch(n),
                    [&](dist::Comm& comm) { ddp::Reducer reducer(comm, models[comm.rank()]->parameters()); });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(rel_error(values_of(models[r]->parameters()), rank0) == 0);
    }
  }
}

TEST_CASE("[step3] ranks that freeze or tie differently get a clear error at construction, as in DDP") {
  const Data data(8);
  for (bool tie : {false, true}) {
    CAPTURE(tie);
    auto models = replicas(2);
    const torch::Tensor separate = torch::zeros({4, 16}, torch::requires_grad());  // the last weight's shape
    // The whole lists agree (7 tensors of the same shapes, or the same 6): only the lists the reducers keep differ.
    check_fails_on_every_rank(
        2,
        [&](dist::Comm& comm) {
          const int r = comm.rank();
          auto params = models[r]->parameters();
          if (tie) {
            params.push_back(r == 0 ? params[4] : separate);  // rank 0 ties its last weight, rank 1 does not
          } else if (r == 1) {
            for (int i : {0, 1}) params[i].requires_grad_(false);  // only rank 1 freezes the first layer
          }
          ddp::Reducer reducer(comm, params);
          shard_loss(models[r], data, r, 2).backward();
          reducer.finish();
        },
        tie ? "rank 0 has 6 parameters with 484 elements, rank 1 has 7 parameters with 548 elements"
            : "rank 0 has 6 parameters with 484 elements, rank 1 has 4 parameters with 340 elements");
  }
}

TEST_CASE("[step3] frozen parameters are skipped and a tensor listed twice is reduced once (fine-tuning works)") {
  const Data data(16);
  auto freeze = [](torch::nn::Sequential& model) {
    const auto params = model->parameters();
    params[0].requires_grad_(false);  // the first layer is frozen
    params[1].requires_grad_(false);
  };
  auto reference_model = make_model();
  freeze(reference_model);
  {
    torch::optim::SGD sgd(reference_model->parameters(), torch::optim::SGDOptions(0.1));
    torch::mse_loss(reference_model->forward(data.x), data.y).backward();
    sgd.step();
  }
  const auto reference = values_of(reference_model->parameters());
  const int n = 2;
  auto models = replicas(n);
  std::vector<size_t> kept(n);
  std::vector<int64_t> bucket_bytes(n), reduced_bytes(n);
  dist::run_ranks(launch(n), [&](dist::Comm& comm) {
    auto& model = models[comm.rank()];
    freeze(model);
    std::vector<torch::Tensor> params = model->parameters();
    params.push_back(params[4]);  // the last layer's weight twice, as tied weights would list it
    ddp::Reducer reducer(comm, params);
    kept[comm.rank()] = reducer.params().size();
    for (const auto& bucket : reducer.buckets()) bucket_bytes[comm.rank()] += bucket.bytes;
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    comm.reset_stats();
    torch::mse_loss(model->forward(ddp::shard(data.x, comm.rank(), n)), ddp::shard(data.y, comm.rank(), n)).backward();
    reducer.finish();
    sgd.step();
    reduced_bytes[comm.rank()] = comm.stats().all_reduce_bytes;
  });
  const int64_t trainable = kModelBytes - (16 * 8 + 16) * 4;  // 1360 B: the first layer is frozen
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(kept[r] == 4);  // W2, b2, W3, b3: the frozen two skipped, W3 once
    CHECK(bucket_bytes[r] == trainable);
    CHECK(reduced_bytes[r] == trainable + 4 * 4);  // the gradients once, plus the 4-entry "no gradient" map
    const double rel = rel_error(values_of(models[r]->parameters()), reference);
    CAPTURE(rel);
    CHECK(rel <= 1e-6);
    CHECK_FALSE(models[r]->parameters()[0].grad().defined());
  }
}

TEST_CASE("[step3] a parameter unused on one rank only gives the error on every rank, not a timeout") {
  auto models = replicas(2);
  std::vector<torch::Tensor> extra;
  for (int r = 0; r < 2; ++r) extra.push_back(torch::zeros({3}, torch::requires_grad()));
  const Data data(8);
  const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
    const int r = comm.rank();
    auto params = models[r]->parameters();
    params.push_back(extra[r]);
    ddp::Reducer reducer(comm, params);
    torch::Tensor loss = shard_loss(models[r], data, r, 2);
    if (r == 0) loss = loss + extra[r].sum() * 0;  // rank 0 uses it, rank 1 does not
    loss.backward();
    reducer.finish();
  });
  for (const auto& outcome : outcomes) {
    INFO(outcome.error);
    CHECK_FALSE(outcome.ok);
    CHECK(outcome.error.find("parameter 6 got no gradient") != std::string::npos);
    CHECK(outcome.error.find("on 1 of 2 ranks") != std::string::npos);
    CHECK(outcome.error.find("timed out") == std::string::npos);
  }
}

TEST_CASE(
    "[step3] the reducer divides before the sum: float16 gradients whose sum overflows average to a finite mean") {
  std::vector<torch::Tensor> grads(2);
  dist::run_ranks(launch(2), [&](dist::Comm& comm) {
    torch::Tensor p = torch::zeros({4}, torch::kHalf).requires_grad_();
    ddp::Reducer reducer(comm, {p});
    (p * torch::full({4}, 40000.0, torch::kHalf)).sum().backward();  // the gradient: 40000 on both ranks
    reducer.finish();
    grads[comm.rank()] = p.grad().clone();
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    INFO(grads[r]);
    CHECK(torch::equal(grads[r], torch::full({4}, 40000.0, torch::kHalf)));  // summed first: 80000, inf
  }
}

TEST_CASE("[step3] a forgotten finish() gives a clear error on every rank") {
  auto models = replicas(2);
  const Data data(8);
  const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
    const int r = comm.rank();
    ddp::Reducer reducer(comm, models[r]->parameters());
    for (int step = 0; step < 2; ++step) {  // no finish() after the first backward
      shard_loss(models[r], data, r, 2).backward();
    }
    reducer.finish();
  });
  check_every_rank_failed_with(outcomes, "finish() was not called");
}

TEST_CASE("[step3] finish() forgotten on one rank only gives a clear error on every rank, not a timeout") {
  auto models = replicas(2);
  const Data data(8);
  for (bool overlap : {true, false}) {
    CAPTURE(overlap);
    const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
      const int r = comm.rank();
      ddp::ReducerOptions options;
      options.overlap = overlap;
      ddp::Reducer reducer(comm, models[r]->parameters(), options);
      for (int step = 0; step < 2; ++step) {
        shard_loss(models[r], data, r, 2).backward();
        if (r == 0) reducer.finish();  // rank 1 forgets it
      }
    });
    check_every_rank_failed_with(outcomes, "finish() was not called");
  }
}

TEST_CASE("[step3] gradients ready out of bucket order, in another order on each rank: buckets still go in order") {
  // a and b, 4 floats each, one bucket each (limits of 16 bytes): bucket 0 holds b (make_buckets walks backwards),
  // bucket 1 holds a. Rank 0's loss uses b last (its gradient is ready first: in bucket order); rank 1's uses a
  // last (bucket 1 is ready first). Launched as they become ready, rank 0 would send b where rank 1 sends a.
  auto loss_of = [](const torch::Tensor& a, const torch::Tensor& b, int r) {
    const torch::Tensor x = torch::linspace(0.1, 0.4, 4) * (r + 1);
    return r == 0 ? (b * (a * x).tanh()).sum() : (a * (b * x).tanh()).sum();
  };
  auto leaves = [] {
    return std::vector<torch::Tensor>{torch::full({4}, 0.5).requires_grad_(), torch::full({4}, -0.3).requires_grad_()};
  };
  std::vector<std::vector<torch::Tensor>> local(2);
  for (int r = 0; r < 2; ++r) {
    auto ab = leaves();
    loss_of(ab[0], ab[1], r).backward();
    local[r] = {ab[0].grad(), ab[1].grad()};
  }
  std::vector<std::vector<torch::Tensor>> averaged(2);
  std::vector<std::vector<size_t>> order(2);
  dist::run_ranks(launch(2), [&](dist::Comm& comm) {
    const int r = comm.rank();
    auto ab = leaves();
    for (size_t i = 0; i < 2; ++i) ab[i].register_hook([&order, r, i](const torch::Tensor&) { order[r].push_back(i); });
    ddp::ReducerOptions options;
    options.bucket_bytes = 16;
    options.first_bucket_bytes = 16;
    ddp::Reducer reducer(comm, ab, options);
    loss_of(ab[0], ab[1], r).backward();
    reducer.finish();
    averaged[r] = {ab[0].grad().clone(), ab[1].grad().clone()};
  });
  REQUIRE(order[0] == std::vector<size_t>{1, 0});  // the premise: b first on rank 0, a first on rank 1
  REQUIRE(order[1] == std::vector<size_t>{0, 1});
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < 2; ++i) {
      CAPTURE(r);
      CAPTURE(i);
      CHECK(torch::allclose(averaged[r][i], (local[0][i] + local[1][i]) / 2, 1e-6, 1e-7));
    }
  }
  // The same with a third parameter that rank 1 does not use, and sizes that differ: a named error on every
  // rank, not a mismatch of bucket sizes or a timeout.
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        const int r = comm.rank();
        const torch::Tensor a = torch::full({4}, 0.5).requires_grad_(), b = torch::full({6}, -0.3).requires_grad_(),
                            c = torch::ones({2}).requires_grad_();
        ddp::ReducerOptions options;
        options.bucket_bytes = 8;
        options.first_bucket_bytes = 8;
        ddp::Reducer reducer(comm, {a, b, c}, options);  // buckets {c}, {b}, {a}
        torch::Tensor loss =
            r == 0 ? (b * (a * 0.5).sum().tanh()).sum() + c.pow(2).sum() : (a * (b * 0.5).sum().tanh()).sum();
        loss.backward();
        reducer.finish();
      },
      "parameter 2 got no gradient in this backward on 1 of 2 ranks");
}

TEST_CASE("[step3] after zero_grad() left defined zero gradients, an unused parameter is still found") {
  // LibTorch 1.13's Optimizer::zero_grad() zeroes the gradients and keeps them (2.x sets them to none): in the
  // second iteration every parameter already has a defined .grad. A reducer that took "has a .grad" for "got a
  // gradient in this backward" would send the unused parameter's slot: last step's average.
  auto models = replicas(2);
  std::vector<torch::Tensor> extra;
  for (int r = 0; r < 2; ++r) extra.push_back(torch::ones({3}, torch::requires_grad()));
  const Data data(8);
  std::vector<int> first_ok(2, 0);
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        const int r = comm.rank();
        auto params = models[r]->parameters();
        params.push_back(extra[r]);
        ddp::Reducer reducer(comm, params);
        torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1));
        for (int iteration = 0; iteration < 2; ++iteration) {
          for (auto& p : params) {
            if (p.grad().defined()) p.mutable_grad().zero_();  // as 1.13's zero_grad(), on both stacks
          }
          torch::Tensor loss = shard_loss(models[r], data, r, 2);
          if (iteration == 0 || r == 0) loss = loss + extra[r].pow(2).sum();  // rank 1 drops it in iteration 2
          loss.backward();
          reducer.finish();
          sgd.step();
          if (iteration == 0) first_ok[r] = 1;
        }
      },
      "parameter 6 got no gradient in this backward on 1 of 2 ranks");
  CHECK(first_ok == std::vector<int>{1, 1});
}

TEST_CASE("[step3] the lesson's buckets are the ones DDP rebuilds from the order gradients arrived in") {
  // DDP records the order its hooks fire in during the first backward and rebuilds its buckets in that order
  // (rebuild_buckets). make_buckets assumes reverse parameter order; for this model it is exactly that order.
  auto models = replicas(1);
  const Data data(4);
  std::vector<size_t> order;
  std::vector<ddp::Bucket> buckets;
  dist::run_ranks(launch(1), [&](dist::Comm& comm) {
    const auto params = models[0]->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      params[i].register_hook([&order, i](const torch::Tensor&) { order.push_back(i); });
    ddp::ReducerOptions options;
    options.bucket_bytes = 1000;
    options.first_bucket_bytes = 300;
    ddp::Reducer reducer(comm, params, options);
    torch::mse_loss(models[0]->forward(data.x), data.y).backward();
    reducer.finish();
    buckets = reducer.buckets();
  });
  CHECK(order == std::vector<size_t>{5, 4, 3, 2, 1, 0});
  // DDP's rebuild walks the ready order; make_buckets walks its list backwards: give it the ready order reversed.
  const auto params = models[0]->parameters();
  std::vector<torch::Tensor> reversed_ready;
  for (size_t k = order.size(); k-- > 0;) reversed_ready.push_back(params[order[k]]);
  const auto rebuilt = ddp::make_buckets(reversed_ready, 1000, 300);
  REQUIRE(rebuilt.size() == buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    std::vector<size_t> mapped;
    for (size_t j : rebuilt[b].params) mapped.push_back(order[order.size() - 1 - j]);
    CAPTURE(b);
    CHECK(mapped == buckets[b].params);
  }
}

// ---- step 4 -------------------------------------------------------------------------------------------------

TEST_CASE("[step4] no_sync: one all-reduce per bucket per window, and the accumulated step equals the full batch") {
  const Data data(32);
  const std::vector<torch::Tensor> reference = full_batch_sgd(data, 2);
  for (int n : {2, 4}) {
    CAPTURE(n);
    auto models = replicas(n);
    std::vector<int64_t> calls(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      auto& model = models[comm.rank()];
      ddp::ReducerOptions options;
      options.bucket_bytes = 1000;
      options.first_bucket_bytes = 300;
      ddp::Reducer reducer(comm, model->parameters(), options);
      torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
      const auto micro = accum::split_batch(ddp::shard(data.x, comm.rank(), n), ddp::shard(data.y, comm.rank(), n), 2);
      const accum::LossFn loss_fn = [&](const accum::MicroBatch& mb) {
        return torch::mse_loss(model->forward(mb.input), mb.target);
      };
      comm.reset_stats();
      for (int step = 0; step < 2; ++step) CHECK(ddp::train_step(reducer, sgd, micro, loss_fn));
      calls[comm.rank()] = comm.stats().all_reduce_calls;
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      const double rel = rel_error(values_of(models[r]->parameters()), reference);
      CAPTURE(rel);
      CHECK(rel <= 1e-6);
      CHECK(calls[r] == 2 * 4);  // 2 windows x (3 buckets + 1 map), whatever the number of micro-batches (32 / n / 2)
      if (r == 0) MESSAGE("N = " << n << ", " << 32 / n / 2 << " micro-batches per rank: rel diff " << rel);
    }
  }
}

TEST_CASE("[step4] train_step weighs a ragged last micro-batch by its items, not by 1/K") {
  const Data data(10);  // 5 items per rank on 2 ranks: micro-batches of 2, 2 and 1
  const std::vector<torch::Tensor> reference = full_batch_sgd(data);
  auto models = replicas(2);
  std::vector<size_t> micro_batches(2);
  dist::run_ranks(launch(2), [&](dist::Comm& comm) {
    const int r = comm.rank();
    auto& model = models[r];
    ddp::Reducer reducer(comm, model->parameters());
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    const auto micro = accum::split_batch(ddp::shard(data.x, r, 2), ddp::shard(data.y, r, 2), 2);
    micro_batches[r] = micro.size();
    const accum::LossFn loss_fn = [&](const accum::MicroBatch& mb) {
      return torch::mse_loss(model->forward(mb.input), mb.target);
    };
    ddp::train_step(reducer, sgd, micro, loss_fn);
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(micro_batches[r] == 3);
    const double rel = rel_error(values_of(models[r]->parameters()), reference);
    CAPTURE(rel);
    CHECK(rel <= 1e-6);
  }
}

TEST_CASE("[step4] a forward inside NoSync without Reducer::forward on one rank: a named error on every rank") {
  auto models = replicas(2);
  const Data data(8);
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        const int r = comm.rank();
        auto& model = models[r];
        ddp::Reducer reducer(comm, model->parameters());
        const torch::Tensor x = ddp::shard(data.x, r, 2), y = ddp::shard(data.y, r, 2);
        torch::Tensor loss;
        {
          ddp::NoSync quiet(reducer);
          // Rank 0 runs it through the reducer (its backward does not sync, as in DDP); rank 1 calls the model
          // directly, so its hooks read sync() at backward time, outside NoSync, and it syncs.
          loss = r == 0 ? reducer.forward([&] { return torch::mse_loss(model->forward(x), y); })
                        : torch::mse_loss(model->forward(x), y);
        }
        loss.backward();
        reducer.finish();
      },
      "did not sync (its forward ran inside NoSync)");
}

TEST_CASE("[step4] all_ranks_found_inf is true on every rank when any one rank found an inf") {
  std::vector<int> with_one(4, -1), with_none(4, -1);
  dist::run_ranks(launch(4), [&](dist::Comm& comm) {
    with_one[comm.rank()] = ddp::all_ranks_found_inf(comm, comm.rank() == 2) ? 1 : 0;
    with_none[comm.rank()] = ddp::all_ranks_found_inf(comm, false) ? 1 : 0;
  });
  CHECK(with_one == std::vector<int>{1, 1, 1, 1});
  CHECK(with_none == std::vector<int>{0, 0, 0, 0});
}

TEST_CASE(
    "[step4] with the scaler, clean steps equal the full batch and an inf on one rank skips the step on every rank") {
  const Data data(16);
  const std::vector<torch::Tensor> reference = full_batch_sgd(data, 1);
  const int n = 4;
  auto models = replicas(n);
  std::vector<int> stepped_clean(n, -1), stepped_inf(n, -1);
  std::vector<double> scales(n, 0);
  std::vector<std::vector<torch::Tensor>> after_clean(n), after_inf(n);
  dist::run_ranks(launch(n), [&](dist::Comm& comm) {
    const int r = comm.rank();
    auto& model = models[r];
    ddp::ReducerOptions options;
    options.bucket_bytes = 1000;
    options.first_bucket_bytes = 300;
    ddp::Reducer reducer(comm, model->parameters(), options);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    amp::GradScalerOptions scaler_options;
    scaler_options.init_scale = 1024;  // a power of two: scaling and unscaling are exact
    scaler_options.growth_interval = 1000;
    amp::GradScaler scaler(scaler_options);
    const torch::Tensor x = ddp::shard(data.x, r, n), y = ddp::shard(data.y, r, n);
    const accum::LossFn loss_fn = [&](const accum::MicroBatch& mb) {
      return torch::mse_loss(model->forward(mb.input), mb.target);
    };
    stepped_clean[r] = ddp::train_step(reducer, sgd, accum::split_batch(x, y, 2), loss_fn, &scaler);
    after_clean[r] = values_of(model->parameters());
    torch::Tensor bad = x.clone();
    if (r == 1) bad[0][0] = std::numeric_limits<float>::infinity();  // only rank 1's data overflows
    stepped_inf[r] = ddp::train_step(reducer, sgd, accum::split_batch(bad, y, 2), loss_fn, &scaler);
    after_inf[r] = values_of(model->parameters());
    scales[r] = scaler.get_scale();
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(stepped_clean[r] == 1);
    CHECK(rel_error(after_clean[r], reference) <= 1e-6);
    CHECK(stepped_inf[r] == 0);  // every rank skipped, not only rank 1
    CHECK(rel_error(after_inf[r], after_clean[r]) == 0);
    CHECK(scales[r] == 512.0);  // backed off once, the same on every rank
  }
}

TEST_CASE("[step4] no_sync is decided when the forward runs, as in DDP") {
  auto models = replicas(2);
  const Data data(8);
  std::vector<int64_t> quiet_calls(2, -1), synced_calls(2, -1);
  std::vector<int> forgotten(2, 0);
  std::vector<std::vector<torch::Tensor>> grads(2);
  dist::run_ranks(launch(2), [&](dist::Comm& comm) {
    const int r = comm.rank();
    auto& model = models[r];
    const auto params = model->parameters();
    ddp::Reducer reducer(comm, params);
    const torch::Tensor x = ddp::shard(data.x, r, 2), y = ddp::shard(data.y, r, 2);
    auto forward = [&] { return reducer.forward([&] { return torch::mse_loss(model->forward(x), y); }); };
    torch::Tensor loss;
    {
      ddp::NoSync quiet(reducer);
      loss = forward();
    }
    comm.reset_stats();
    loss.backward();  // outside NoSync, but its forward ran inside: no communication
    quiet_calls[r] = comm.stats().all_reduce_calls;
    for (const auto& p : params) p.mutable_grad() = torch::Tensor();
    loss = forward();
    {
      ddp::NoSync quiet(reducer);
      loss.backward();  // inside NoSync, but its forward ran outside: it communicates
    }
    reducer.finish();
    synced_calls[r] = comm.stats().all_reduce_calls;
    for (const auto& p : params) grads[r].push_back(p.grad().clone());
    forward().backward();
    try {
      forward();  // the previous backward synced and finish() was not called
    } catch (const c10::Error& e) {
      forgotten[r] = std::string(e.what()).find("finish() was not called") != std::string::npos ? 1 : -1;
    }
    reducer.finish();
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(quiet_calls[r] == 0);
    CHECK(synced_calls[r] == 2);  // the default limits (1 MiB, 25 MiB) make one bucket; plus the map
    CHECK(rel_error(grads[r], grads[0]) == 0);
    CHECK(forgotten[r] == 1);
  }
}

TEST_CASE(
    "[step4] ShardedGradScaler agrees on found_inf inside unscale_: an inf on one rank skips the step on every rank") {
  const int n = 3;
  std::vector<int> finite_after_unscale(n, -1), stepped(n, -1);
  std::vector<double> scales(n, 0);
  std::vector<torch::Tensor> after(n);
  std::vector<dist::CommStats> stats(n);
  dist::run_ranks(launch(n), [&](dist::Comm& comm) {
    const int r = comm.rank();
    torch::Tensor p = torch::zeros({4}, torch::requires_grad());
    torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1));
    amp::GradScalerOptions options;
    options.init_scale = 1024;
    ddp::ShardedGradScaler scaler(comm, options);
    scaler.scale(p.sum()).backward();  // gradient 1024 everywhere
    if (r == 1) {
      torch::NoGradGuard no_grad;
      p.grad()[0] = std::numeric_limits<float>::infinity();
    }
    comm.reset_stats();
    scaler.unscale_(sgd);  // explicit, as before clipping: the agreement happens here, not in step()
    finite_after_unscale[r] = torch::isfinite(p.grad()).all().item<bool>() ? 1 : 0;
    stepped[r] = scaler.step(sgd) ? 1 : 0;
    scaler.update();
    scales[r] = scaler.get_scale();
    after[r] = p.detach().clone();
    stats[r] = comm.stats();
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(finite_after_unscale[r] == (r == 1 ? 0 : 1));  // only rank 1's own gradient holds the inf
    CHECK(stepped[r] == 0);
    CHECK(scales[r] == 512.0);
    CHECK(torch::equal(after[r], torch::zeros({4})));
    CHECK(stats[r].all_reduce_calls == 1);  // one agreement, in unscale_, none again in step()
    CHECK(stats[r].all_reduce_bytes == 8);
  }
}

TEST_CASE("[step4] ShardedGradScaler: an unscale_ that fails on one rank fails on every rank, not a timeout") {
  const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
    torch::Tensor p = torch::zeros({4}, torch::requires_grad());
    torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1));
    ddp::ShardedGradScaler scaler(comm);
    torch::Tensor loss = scaler.scale(p.sum());
    if (comm.rank() == 0) loss.backward();  // rank 1's optimizer has no gradient to unscale
    scaler.unscale_(sgd);
  });
  for (size_t r = 0; r < outcomes.size(); ++r) {
    CAPTURE(r);
    INFO(outcomes[r].error);
    CHECK_FALSE(outcomes[r].ok);
    CHECK(outcomes[r].error.find(r == 1 ? "no parameter" : "another rank's unscale_ failed") != std::string::npos);
    CHECK(outcomes[r].error.find("timed out") == std::string::npos);
  }
}

// ---- step 5 -------------------------------------------------------------------------------------------------

TEST_CASE("[step5] partition_parameters gives the largest parameters first to the least-loaded rank") {
  std::vector<torch::Tensor> params;
  for (int64_t numel : {10, 40, 30, 20, 40}) params.push_back(torch::zeros({numel}));
  // By size: 1 (40) -> rank 0, 4 (40) -> 1, 2 (30) -> 0 (a tie goes to the lower rank), 3 (20) -> 1, 0 (10) -> 1.
  CHECK(ddp::partition_parameters(params, 2) == std::vector<int>{1, 0, 0, 1, 1});
  CHECK(ddp::partition_parameters(params, 1) == std::vector<int>{0, 0, 0, 0, 0});
  CHECK(ddp::partition_parameters(params, 5) == std::vector<int>{4, 0, 2, 3, 1});
  // Sizes are elements, as ZeroRedundancyOptimizer counts (not bytes): a float32 of 15 elements (60 B) is larger
  // than a float64 of 10 (80 B). By numel: 1 (15) -> rank 0, 2 (12) -> 1, 0 (10) -> 1.
  const std::vector<torch::Tensor> mixed{torch::zeros({10}, torch::kDouble), torch::zeros({15}), torch::zeros({12})};
  CHECK(ddp::partition_parameters(mixed, 2) == std::vector<int>{1, 0, 1});
  CHECK_THROWS_AS(ddp::partition_parameters(params, 0), c10::Error);
  CHECK_THROWS_AS(ddp::partition_parameters({}, 2), c10::Error);
}

namespace {

// [deep_model]
// Eight equal layers (32 x 32 + 32 = 1056 floats each): the state splits evenly for N = 1, 2, 4, 8.
torch::nn::Sequential deep_model(uint64_t seed = 3) {
  torch::manual_seed(seed);
  torch::nn::Sequential model;
  for (int i = 0; i < 8; ++i) {
    model->push_back(torch::nn::Linear(32, 32));
    model->push_back(torch::nn::Tanh());
  }
  return model;
}
// [deep_model]

std::unique_ptr<torch::optim::Optimizer> adam(std::vector<torch::Tensor> params) {
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
}

}  // namespace

TEST_CASE("[step5] ZeRO-1 gives the same parameters as plain data parallel, with Adam (N = 2 and 4)") {
  torch::manual_seed(9);
  const torch::Tensor x = torch::randn({16, 32}), y = torch::randn({16, 32});
  for (int n : {2, 4}) {
    CAPTURE(n);
    std::vector<torch::nn::Sequential> plain_models, zero_models;
    for (int r = 0; r < n; ++r) plain_models.push_back(deep_model()), zero_models.push_back(deep_model());
    std::vector<int64_t> state(static_cast<size_t>(n)), plain_state(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const int r = comm.rank();
      const torch::Tensor xs = ddp::shard(x, r, n), ys = ddp::shard(y, r, n);
      {  // plain data parallel: every rank keeps the whole Adam state
        auto& model = plain_models[r];
        ddp::Reducer reducer(comm, model->parameters());
        torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
        for (int step = 0; step < 3; ++step) {
          opt.zero_grad();
          torch::mse_loss(model->forward(xs), ys).backward();
          reducer.finish();
          opt.step();
        }
        plain_state[r] = ddp::optimizer_state_bytes(opt);
      }
      auto& model = zero_models[r];
      ddp::Reducer reducer(comm, model->parameters());
      ddp::ZeroOptimizer zero(comm, model->parameters(), adam);
      for (int step = 0; step < 3; ++step) {
        zero.zero_grad();
        torch::mse_loss(model->forward(xs), ys).backward();
        reducer.finish();
        zero.step();
      }
      state[r] = zero.state_bytes();
    });
    const auto reference = values_of(plain_models[0]->parameters());
    int64_t total = 0;
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      const double rel = rel_error(values_of(zero_models[r]->parameters()), reference);
      CAPTURE(rel);
      CHECK(rel <= 1e-6);
      CHECK(rel_error(values_of(plain_models[r]->parameters()), reference) == 0);
      CHECK(plain_state[r] == 2 * 8 * 1056 * 4);  // exp_avg + exp_avg_sq of every parameter
      CHECK(state[r] == plain_state[r] / n);      // this rank's share only
      total += state[r];
    }
    CHECK(total == 2 * 8 * 1056 * 4);
    MESSAGE("ZeRO-1, N = " << n << ": optimizer state " << state[0] << " B per rank of " << total << " B");
  }
}

TEST_CASE("[step5] ZeRO with a tensor listed twice (tied weights): stepped once per step, its state held once") {
  torch::manual_seed(9);
  const torch::Tensor x = torch::randn({8, 32}), y = torch::randn({8, 32});
  const int n = 2;
  // Listed twice: the first weight (owned by rank 0, whose greedy partition would get the copy too) and the
  // second (owned by rank 1; the copy would go to rank 0).
  for (size_t tied : {0, 2}) {
    CAPTURE(tied);
    std::vector<torch::nn::Sequential> plain_models, zero_models;
    for (int r = 0; r < n; ++r) plain_models.push_back(deep_model()), zero_models.push_back(deep_model());
    std::vector<int64_t> state(n, -1);
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const int r = comm.rank();
      const torch::Tensor xs = ddp::shard(x, r, n), ys = ddp::shard(y, r, n);
      for (int zero_run = 0; zero_run < 2; ++zero_run) {
        auto& model = zero_run ? zero_models[r] : plain_models[r];
        std::vector<torch::Tensor> params = model->parameters();
        params.push_back(params[tied]);
        ddp::Reducer reducer(comm, params);
        torch::optim::Adam plain(model->parameters(), torch::optim::AdamOptions(1e-2));
        std::unique_ptr<ddp::ZeroOptimizer> zero;
        if (zero_run) zero = std::make_unique<ddp::ZeroOptimizer>(comm, params, adam);
        for (int step = 0; step < 3; ++step) {
          for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
          torch::mse_loss(model->forward(xs), ys).backward();
          reducer.finish();
          if (zero) {
            zero->step();
          } else {
            plain.step();
          }
        }
        if (zero) state[r] = zero->state_bytes();
      }
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      const double rel = rel_error(values_of(zero_models[r]->parameters()), values_of(plain_models[0]->parameters()));
      CAPTURE(rel);
      CHECK(rel <= 1e-6);
    }
    CHECK(state[0] + state[1] == 2 * 8 * 1056 * 4);  // Adam's two moments of every parameter, once
  }
}

TEST_CASE("[step5] optimizer-state bytes per rank fall as 1/N, measured with lesson 4's meter") {
  torch::manual_seed(9);
  const torch::Tensor x = torch::randn({8, 32}), y = torch::randn({8, 32});
  const int64_t total = 2 * 8 * 1056 * 4;
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    std::vector<torch::nn::Sequential> models;
    for (int r = 0; r < n; ++r) models.push_back(deep_model());
    std::vector<int64_t> measured(static_cast<size_t>(n), -1);
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const int r = comm.rank();
      auto& model = models[r];
      ddp::Reducer reducer(comm, model->parameters());
      ddp::ZeroOptimizer zero(comm, model->parameters(), adam);
      torch::mse_loss(model->forward(ddp::shard(x, r, n)), ddp::shard(y, r, n)).backward();
      reducer.finish();
      // The step runs on a fresh thread of its own, measured by a meter of that thread (cpu_bytes_kept_by). The
      // ranks are threads of one process, and a per-thread meter charges a free to the thread that ALLOCATED the
      // tensor, whichever thread frees it: measured on the rank's own thread, the figure once came out 64 bytes
      // short (33728 for 33792), because Gloo's worker dropped its reference to finish()'s map of 16 floats,
      // allocated by this rank before the step, during the step. No barrier or wait can rule that out (Gloo
      // releases its work after wait() returns). A fresh thread owns nothing allocated before the meter started,
      // so what it counts is exactly what the step allocated and kept: the new state, on every run.
      measured[r] = workshop::cpu_bytes_kept_by([&] { zero.step_local(); });
      zero.sync_parameters();
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(measured[r] == total / n);
    }
    MESSAGE("ZeRO-1 measured by the meter, N = " << n << ": " << measured[0] << " B of optimizer state per rank");
  }
}

TEST_CASE("[step5] with the scaler, an inf in one rank's shard skips the ZeRO step on every rank") {
  const int n = 2;
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < n; ++r) models.push_back(deep_model());
  torch::manual_seed(9);
  const torch::Tensor x = torch::randn({8, 32}), y = torch::randn({8, 32});
  std::vector<int> stepped(n, -1), owner_of_planted(n, -1);
  std::vector<double> scales(n, 0);
  std::vector<std::vector<torch::Tensor>> before(n), after(n);
  dist::run_ranks(launch(n), [&](dist::Comm& comm) {
    const int r = comm.rank();
    auto& model = models[r];
    const auto params = model->parameters();
    ddp::Reducer reducer(comm, params);
    ddp::ZeroOptimizer zero(comm, params, adam);
    amp::GradScalerOptions options;
    options.init_scale = 1024;
    ddp::ShardedGradScaler scaler(comm, options);
    zero.zero_grad();
    scaler.scale(torch::mse_loss(model->forward(ddp::shard(x, r, n)), ddp::shard(y, r, n))).backward();
    reducer.finish();
    // An overflow in the (averaged, so identical on every rank) gradient of one parameter owned by rank 1:
    // only rank 1's optimizer holds it.
    size_t planted = 0;
    while (zero.owners()[planted] != 1) ++planted;
    owner_of_planted[r] = zero.owners()[planted];
    params[planted].grad()[0][0] = std::numeric_limits<float>::infinity();
    before[r] = values_of(params);
    stepped[r] = zero.step(scaler);
    scaler.update();
    after[r] = values_of(params);
    scales[r] = scaler.get_scale();
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(owner_of_planted[r] == 1);
    CHECK(stepped[r] == 0);  // rank 0 skips too, though its own shard was clean
    CHECK(rel_error(after[r], before[r]) == 0);
    CHECK(scales[r] == 512.0);
  }
}

TEST_CASE("[step5] ZeRO with the sharded scaler: unscale_, clip, step with an inf on one rank skips on every rank") {
  const int n = 2;
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < n; ++r) models.push_back(deep_model());
  torch::manual_seed(9);
  const torch::Tensor x = torch::randn({8, 32}), y = torch::randn({8, 32});
  std::vector<int> stepped(n, -1), stepped_clean(n, -1), nan_params(n, -1);
  std::vector<double> scales(n, 0);
  std::vector<std::vector<torch::Tensor>> before(n), after(n), after_clean(n);
  dist::run_ranks(launch(n, 5000), [&](dist::Comm& comm) {
    const int r = comm.rank();
    auto& model = models[r];
    const auto params = model->parameters();
    ddp::Reducer reducer(comm, params);
    ddp::ZeroOptimizer zero(comm, params, adam);
    amp::GradScalerOptions options;
    options.init_scale = 1024;
    ddp::ShardedGradScaler scaler(comm, options);
    for (int iteration = 0; iteration < 2; ++iteration) {
      zero.zero_grad();
      scaler.scale(torch::mse_loss(model->forward(ddp::shard(x, r, n)), ddp::shard(y, r, n))).backward();
      reducer.finish();
      if (iteration == 0 && r == 1) {  // an overflow that only rank 1 sees, in a parameter it owns
        size_t planted = 0;
        while (zero.owners()[planted] != 1) ++planted;
        torch::NoGradGuard no_grad;
        params[planted].grad()[0][0] = std::numeric_limits<float>::infinity();
      }
      if (iteration == 0) before[r] = values_of(params);
      scaler.unscale_(zero.local_optimizer());  // lesson 2's order: unscale, clip, step
      amp::clip_grad_norm_(zero.local_optimizer(), 1.0);
      const bool ran = zero.step(scaler);
      scaler.update();
      if (iteration == 0) {
        stepped[r] = ran;
        scales[r] = scaler.get_scale();
        after[r] = values_of(params);
      } else {
        stepped_clean[r] = ran;
        after_clean[r] = values_of(params);
      }
    }
    int nans = 0;
    for (const auto& p : params) nans += p.isnan().any().item<bool>() ? 1 : 0;
    nan_params[r] = nans;
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(stepped[r] == 0);  // rank 0 skips too, though its own shard was clean and it had unscaled already
    CHECK(scales[r] == 512.0);
    CHECK(rel_error(after[r], before[r]) == 0);
    CHECK(nan_params[r] == 0);
    CHECK(stepped_clean[r] == 1);  // the next, clean iteration steps on every rank
    CHECK(rel_error(after_clean[r], after_clean[0]) == 0);
  }
}

TEST_CASE(
    "[step5] ZeRO with the sharded scaler on more ranks than parameters: the rank without a shard agrees with 0") {
  // 2 parameters on 3 ranks: rank 2 owns none. As PyTorch's ShardedGradScaler, it joins the found_inf agreement
  // with 0 (its zero-sized shard has nothing to unscale): an inf in rank 1's shard skips the step everywhere, and
  // the next, clean step runs everywhere. Also with an explicit unscale_ first (to clip).
  for (bool unscale_first : {false, true}) {
    CAPTURE(unscale_first);
    std::vector<torch::nn::Linear> models;
    for (int r = 0; r < 3; ++r) {
      torch::manual_seed(3);
      models.push_back(torch::nn::Linear(4, 1));
    }
    std::vector<int> stepped_inf(3, -1), stepped_clean(3, -1), owned(3, -1);
    std::vector<double> scales(3, 0);
    std::vector<int64_t> state(3, -1);
    std::vector<std::vector<torch::Tensor>> before(3), after_inf(3), after_clean(3);
    const auto outcomes = dist::run_ranks_collect(launch(3, 5000), [&](dist::Comm& comm) {
      const int r = comm.rank();
      const auto params = models[r]->parameters();
      ddp::Reducer reducer(comm, params);
      ddp::ZeroOptimizer zero(comm, params, adam);
      owned[r] = static_cast<int>(std::count(zero.owners().begin(), zero.owners().end(), r));
      amp::GradScalerOptions options;
      options.init_scale = 1024;
      ddp::ShardedGradScaler scaler(comm, options);
      for (int iteration = 0; iteration < 2; ++iteration) {
        zero.zero_grad();
        scaler.scale(models[r]->forward(torch::ones({2, 4}) * (r + 1)).sum()).backward();
        reducer.finish();
        if (iteration == 0 && r == 1) {  // an overflow only rank 1 sees, in the parameter it owns
          torch::NoGradGuard no_grad;
          params[static_cast<size_t>(zero.owners()[0] == 1 ? 0 : 1)].grad().fill_(
              std::numeric_limits<float>::infinity());
        }
        if (iteration == 0) before[r] = values_of(params);
        if (unscale_first) scaler.unscale_(zero.local_optimizer());
        const bool ran = zero.step(scaler);
        scaler.update();
        (iteration == 0 ? stepped_inf : stepped_clean)[r] = ran ? 1 : 0;
        (iteration == 0 ? after_inf : after_clean)[r] = values_of(params);
        if (iteration == 0) scales[r] = scaler.get_scale();
      }
      state[r] = zero.state_bytes();
    });
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      INFO(outcomes[r].error);
      REQUIRE(outcomes[r].ok);
      CHECK(owned[r] == (r == 2 ? 0 : 1));
      CHECK(stepped_inf[r] == 0);  // rank 2 too: it agreed with the others instead of failing or waiting
      CHECK(scales[r] == 512.0);
      CHECK(rel_error(after_inf[r], before[r]) == 0);
      CHECK(stepped_clean[r] == 1);
      CHECK(rel_error(after_clean[r], after_clean[0]) == 0);
      CHECK(rel_error(after_clean[r], before[r]) > 0);
    }
    CHECK(state[2] == 0);  // the empty shard holds no optimizer state
  }
}

TEST_CASE("[step5] ZeRO with models that differ gives the shape error on every rank, not a timeout") {
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < 2; ++r) models.push_back(deep_model());
  models[1]->push_back(torch::nn::Linear(32, 2));
  const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
    ddp::ZeroOptimizer zero(comm, models[comm.rank()]->parameters(), adam);
  });
  check_every_rank_failed_with(outcomes, "parameter shapes differ across ranks");
}

// ---- GPU ----------------------------------------------------------------------------------------------------

namespace {
bool two_gpus_with_nccl() {
  return workshop::testing::cuda_usable() && torch::cuda::device_count() >= 2 && dist::nccl_available();
}
}  // namespace

// Suite "multi_gpu": NCCL needs one device per rank, so one GPU is not enough; tests/main.cc lists the skip
// and its reason (a one-GPU machine still runs every "gpu" case).
TEST_CASE("[step1] NCCL: per-parameter averaging on two GPUs equals one full-batch step" *
          doctest::test_suite("multi_gpu") * doctest::skip(!two_gpus_with_nccl())) {
  const Data data(16);
  const std::vector<torch::Tensor> reference = full_batch_sgd(data);
  auto models = replicas(2);
  std::vector<std::vector<torch::Tensor>> results(2);
  dist::LaunchOptions options = launch(2);
  options.backend = "nccl";
  dist::run_ranks(options, [&](dist::Comm& comm) {
    auto& model = models[comm.rank()];
    model->to(comm.device());
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    sgd.zero_grad();
    torch::mse_loss(model->forward(ddp::shard(data.x, comm.rank(), 2).to(comm.device())),
                    ddp::shard(data.y, comm.rank(), 2).to(comm.device()))
        .backward();
    ddp::average_gradients(comm, model->parameters());
    sgd.step();
    for (const auto& p : model->parameters()) results[comm.rank()].push_back(p.detach().cpu());
  });
  for (int r = 0; r < 2; ++r) CHECK(rel_error(results[r], reference) <= 1e-5);
}
