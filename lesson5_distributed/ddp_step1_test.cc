// Checks for lesson 5, step 1: averaging gradients: shard, average_, average_gradients, sync_module_states.
// Run: bazel test //lesson5_distributed:all   (this step only: bazel test //lesson5_distributed:ddp_step1_test)
// The seeded problems and the helpers that start ranks are in ddp_test_helpers.h.
#include "lesson5_distributed/ddp_test_helpers.h"

#include <chrono>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/ddp.h"

namespace ddp_checks {

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

TEST_CASE("[step1] sync_module_states sends a channels_last parameter, also where only one rank has that layout") {
  // A convolution's weight in channels_last is not contiguous: it must still be sent, and a rank whose layout
  // differs from its peers' must not fail alone while they wait. Each rank keeps its own layout.
  for (bool on_both : {false, true}) {
    CAPTURE(on_both);
    std::vector<torch::Tensor> weights;
    for (int r = 0; r < 2; ++r) {
      torch::manual_seed(20 + r);  // other values on each rank
      torch::Tensor w = torch::randn({2, 3, 4, 4});
      if (on_both || r == 1) w = w.contiguous(torch::MemoryFormat::ChannelsLast);
      weights.push_back(w.requires_grad_());
    }
    const torch::Tensor expected = weights[0].detach().clone();
    const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
      ddp::sync_module_states(comm, {weights[comm.rank()]});
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      INFO(outcomes[r].error);
      REQUIRE(outcomes[r].ok);
      CHECK(torch::equal(weights[r], expected));
      CHECK(weights[r].is_contiguous(torch::MemoryFormat::ChannelsLast) == (on_both || r == 1));
    }
  }
}

// ---- GPU ----------------------------------------------------------------------------------------------------

bool two_gpus_with_nccl() {
  return workshop::testing::cuda_usable() && torch::cuda::device_count() >= 2 && dist::nccl_available();
}

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

}  // namespace ddp_checks
