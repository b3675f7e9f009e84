// Checks for lesson 5, step 5: ZeRO-1: partition_parameters and the sharded optimizer.
// Run: bazel test //lesson5_distributed:all   (this step only: bazel test //lesson5_distributed:ddp_step5_test)
// The seeded problems and the helpers that start ranks are in ddp_test_helpers.h.
#include "lesson5_distributed/ddp_test_helpers.h"

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/memory_meter.h"
#include "lesson1_amp/grad_scaler.h"
#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/ddp.h"

namespace ddp_checks {

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

TEST_CASE("[step5] ZeRO with the sharded scaler: a rank that owns only frozen parameters agrees with no inf") {
  // Linear(4, 1) with its bias frozen, on 2 ranks: rank 0 owns the weight, rank 1 only the frozen bias, which gets
  // no gradient. As a rank without gradients in PyTorch's ShardedGradScaler, rank 1 joins the found_inf agreement
  // with 0: an inf in rank 0's shard skips the step everywhere, and the next, clean step runs everywhere.
  std::vector<torch::nn::Linear> models;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(3);
    models.push_back(torch::nn::Linear(4, 1));
    models.back()->bias.requires_grad_(false);
  }
  std::vector<int> stepped_inf(2, -1), stepped_clean(2, -1), owner_of_bias(2, -1);
  std::vector<int64_t> state(2, -1);
  std::vector<std::vector<torch::Tensor>> before(2), after_inf(2), after_clean(2);
  const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
    const int r = comm.rank();
    const auto params = models[r]->parameters();  // weight, bias
    ddp::Reducer reducer(comm, params);
    ddp::ZeroOptimizer zero(comm, params, adam);
    owner_of_bias[r] = zero.owners()[1];
    amp::GradScalerOptions options;
    options.init_scale = 1024;
    ddp::ShardedGradScaler scaler(comm, options);
    for (int iteration = 0; iteration < 2; ++iteration) {
      zero.zero_grad();
      scaler.scale(models[r]->forward(torch::ones({2, 4}) * (r + 1)).sum()).backward();
      reducer.finish();
      if (iteration == 0 && r == 0) {  // an overflow only rank 0 sees, in the weight it owns
        torch::NoGradGuard no_grad;
        params[0].grad().fill_(std::numeric_limits<float>::infinity());
      }
      if (iteration == 0) before[r] = values_of(params);
      const bool ran = zero.step(scaler);
      scaler.update();
      (iteration == 0 ? stepped_inf : stepped_clean)[r] = ran ? 1 : 0;
      (iteration == 0 ? after_inf : after_clean)[r] = values_of(params);
    }
    state[r] = zero.state_bytes();
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    INFO(outcomes[r].error);
    REQUIRE(outcomes[r].ok);
    CHECK(owner_of_bias[r] == 1);
    CHECK(stepped_inf[r] == 0);
    CHECK(rel_error(after_inf[r], before[r]) == 0);
    CHECK(stepped_clean[r] == 1);
    CHECK(rel_error(after_clean[r], after_clean[0]) == 0);
    CHECK(rel_error(after_clean[r], before[r]) > 0);
    CHECK(torch::equal(after_clean[r][1], before[r][1]));  // the frozen bias stays
  }
  CHECK(state[1] == 0);  // rank 1 holds no optimizer state
}

TEST_CASE("[step5] ZeRO broadcasts a channels_last parameter from its owner, whatever each rank's layout") {
  // w (2x3x2x2, 24 elements) goes to rank 0, b (2) to rank 1; w is channels_last on rank 1 only, or on both.
  for (bool on_both : {false, true}) {
    CAPTURE(on_both);
    std::vector<std::vector<torch::Tensor>> params(2);
    for (int r = 0; r < 2; ++r) {
      torch::Tensor w = torch::linspace(-1, 1, 24).reshape({2, 3, 2, 2});
      if (on_both || r == 1) w = w.contiguous(torch::MemoryFormat::ChannelsLast);
      params[r] = {w.requires_grad_(), torch::full({2}, 0.5).requires_grad_()};
    }
    const torch::Tensor grad_w = torch::linspace(0.5, 3, 24).reshape({2, 3, 2, 2});
    const std::vector<torch::Tensor> expected{params[0][0].detach() - grad_w * 0.1, torch::full({2}, 0.5 - 0.1)};
    std::vector<std::vector<int>> owners(2);
    const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
      const int r = comm.rank();
      ddp::ZeroOptimizer zero(comm, params[r], [](std::vector<torch::Tensor> mine) {
        return std::make_unique<torch::optim::SGD>(mine, torch::optim::SGDOptions(0.1));
      });
      owners[r] = zero.owners();
      params[r][0].mutable_grad() = grad_w.clone();  // the averaged gradients, the same on every rank
      params[r][1].mutable_grad() = torch::ones({2});
      zero.step();
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      INFO(outcomes[r].error);
      REQUIRE(outcomes[r].ok);
      CHECK(owners[r] == std::vector<int>{0, 1});
      CHECK(rel_error(values_of(params[r]), expected) <= 1e-6);
    }
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

TEST_CASE("[step5] ZeRO over mixed dtypes with the sharded scaler: a frozen float16 layer beside float32, float64") {
  // e (float16, 64, frozen), w (float32, 16), v (float64, 8) on 2 ranks: rank 0 owns only the frozen e, rank 1
  // the two others. Rank 0's zero-sized shard must be one lesson 1's unscale_ accepts (not float16), so that it
  // joins the agreement with 0: an inf in rank 1's w skips the step everywhere, and the next, clean step updates
  // w and v in their own dtypes exactly as one SGD step on the unscaled gradients, and broadcasts them.
  const std::vector<torch::Dtype> dtypes{torch::kHalf, torch::kFloat, torch::kDouble};
  const std::vector<int64_t> sizes{64, 16, 8};
  auto initial = [&](size_t i) {
    return torch::linspace(-1, 1, sizes[i], torch::TensorOptions().dtype(dtypes[i])).requires_grad_(i > 0);
  };
  auto gradient = [&](size_t i) {  // small integers: exact in every dtype, also times 1024 or 512
    return torch::arange(sizes[i], torch::TensorOptions().dtype(dtypes[i])).remainder(4).add(1);
  };
  std::vector<torch::Tensor> expected;
  {
    std::vector<torch::Tensor> trainable;
    for (size_t i = 0; i < sizes.size(); ++i) {
      expected.push_back(initial(i));
      if (i > 0) expected.back().mutable_grad() = gradient(i), trainable.push_back(expected.back());
    }
    torch::optim::SGD(trainable, torch::optim::SGDOptions(0.1)).step();
  }
  std::vector<int> stepped_inf(2, -1), stepped_clean(2, -1);
  std::vector<std::vector<int>> owners(2);
  std::vector<std::vector<torch::Tensor>> before(2), after_inf(2), after_clean(2);
  const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
    const int r = comm.rank();
    std::vector<torch::Tensor> params;
    for (size_t i = 0; i < sizes.size(); ++i) params.push_back(initial(i));
    ddp::ZeroOptimizer zero(comm, params, [](std::vector<torch::Tensor> mine) {
      return std::make_unique<torch::optim::SGD>(mine, torch::optim::SGDOptions(0.1));
    });
    owners[r] = zero.owners();
    amp::GradScalerOptions options;
    options.init_scale = 1024;
    ddp::ShardedGradScaler scaler(comm, options);
    scaler.scale(torch::ones({1}));  // makes the scale; the gradients below stand for the averaged, scaled ones
    for (int iteration = 0; iteration < 2; ++iteration) {
      zero.zero_grad();
      for (size_t i = 1; i < params.size(); ++i) params[i].mutable_grad() = gradient(i) * scaler.get_scale();
      if (iteration == 0 && r == 1) params[1].grad()[0] = std::numeric_limits<float>::infinity();
      if (iteration == 0) before[r] = values_of(params);
      const bool ran = zero.step(scaler);
      scaler.update();
      (iteration == 0 ? stepped_inf : stepped_clean)[r] = ran ? 1 : 0;
      (iteration == 0 ? after_inf : after_clean)[r] = values_of(params);
    }
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    INFO(outcomes[r].error);
    REQUIRE(outcomes[r].ok);
    CHECK(owners[r] == std::vector<int>{0, 1, 1});
    CHECK(stepped_inf[r] == 0);
    CHECK(stepped_clean[r] == 1);
    for (size_t i = 0; i < sizes.size(); ++i) {
      CAPTURE(i);
      INFO(after_clean[r][i]);
      CHECK(torch::equal(after_inf[r][i].to(torch::kDouble), before[r][i].to(torch::kDouble)));
      CHECK((after_clean[r][i].scalar_type() == dtypes[i]));
      CHECK(torch::equal(after_clean[r][i].to(torch::kDouble), expected[i].detach().to(torch::kDouble)));
    }
  }
  // A float16 parameter that requires grad: lesson 1's unscale_ refuses float16 gradients on its owner (rank 0),
  // and every other rank names that failure, at once.
  const auto refused = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
    std::vector<torch::Tensor> params{initial(0).requires_grad_(), initial(1)};
    ddp::ZeroOptimizer zero(comm, params, [](std::vector<torch::Tensor> mine) {
      return std::make_unique<torch::optim::SGD>(mine, torch::optim::SGDOptions(0.1));
    });
    ddp::ShardedGradScaler scaler(comm);
    scaler.scale(torch::ones({1}));
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = gradient(i);
    zero.step(scaler);
  });
  for (size_t r = 0; r < refused.size(); ++r) {
    CAPTURE(r);
    INFO(refused[r].error);
    CHECK_FALSE(refused[r].ok);
    CHECK(refused[r].error.find(r == 0 ? "float16" : "another rank's unscale_ failed") != std::string::npos);
    CHECK(refused[r].error.find("timed out") == std::string::npos);
  }
}

}  // namespace ddp_checks
