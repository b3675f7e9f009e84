// Checks for lesson 5, step 4: accumulation with no_sync and the sharded gradient scaler.
// Run: bazel test //lesson5_distributed:all   (this step only: bazel test //lesson5_distributed:ddp_step4_test)
// The seeded problems and the helpers that start ranks are in ddp_test_helpers.h.
#include "lesson5_distributed/ddp_test_helpers.h"

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "lesson1_amp/grad_scaler.h"
#include "lesson2_accumulation/accumulation.h"
#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/ddp.h"

namespace ddp_checks {

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

namespace {

// One step of lesson 5's ShardedGradScaler (init scale 1024) with SGD on `n` ranks: each rank's parameter is 4
// zeros and its scaled gradient 1024 everywhere, then `spoil(r, grad)` plants this rank's infs (under no_grad).
// With `explicit_unscale`, unscale_ is called before step(), as before clipping. Per rank: whether the gradient
// was finite after the unscale (-1 without `explicit_unscale`), whether it stepped, the scale after update(), the
// parameter after the step, and the communicator's counters from the unscale on.
struct ShardedStep {
  std::vector<int> finite_after_unscale, stepped;
  std::vector<double> scales;
  std::vector<torch::Tensor> after;
  std::vector<dist::CommStats> stats;
};

ShardedStep sharded_step(int n, const std::function<void(int, torch::Tensor&)>& spoil, bool explicit_unscale) {
  ShardedStep out{std::vector<int>(n, -1), std::vector<int>(n, -1), std::vector<double>(n, 0),
                  std::vector<torch::Tensor>(n), std::vector<dist::CommStats>(n)};
  dist::run_ranks(launch(n), [&](dist::Comm& comm) {
    const int r = comm.rank();
    torch::Tensor p = torch::zeros({4}, torch::requires_grad());
    torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1));
    amp::GradScalerOptions options;
    options.init_scale = 1024;
    ddp::ShardedGradScaler scaler(comm, options);
    scaler.scale(p.sum()).backward();  // gradient 1024 everywhere
    {
      torch::NoGradGuard no_grad;
      spoil(r, p.mutable_grad());
    }
    comm.reset_stats();
    if (explicit_unscale) {
      scaler.unscale_(sgd);  // the agreement happens here, not in step()
      out.finite_after_unscale[r] = torch::isfinite(p.grad()).all().item<bool>() ? 1 : 0;
    }
    out.stepped[r] = scaler.step(sgd) ? 1 : 0;
    scaler.update();
    out.scales[r] = scaler.get_scale();
    out.after[r] = p.detach().clone();
    out.stats[r] = comm.stats();
  });
  return out;
}

}  // namespace

TEST_CASE(
    "[step4] ShardedGradScaler agrees on found_inf inside unscale_: an inf on one rank skips the step on every rank") {
  const int n = 3;
  const ShardedStep run = sharded_step(
      n,
      [](int r, torch::Tensor& grad) {
        if (r == 1) grad[0] = std::numeric_limits<float>::infinity();
      },
      true);
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(run.finite_after_unscale[r] == (r == 1 ? 0 : 1));  // only rank 1's own gradient holds the inf
    CHECK(run.stepped[r] == 0);
    CHECK(run.scales[r] == 512.0);
    CHECK(torch::equal(run.after[r], torch::zeros({4})));
    CHECK(run.stats[r].all_reduce_calls == 1);  // one agreement, in unscale_, none again in step()
    CHECK(run.stats[r].all_reduce_bytes == 8);
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

TEST_CASE("[step4] a backward without forward() after iterations with it reads sync() at backward time again") {
  // Iteration 1 through train_step (Reducer::forward); iteration 2 calls the model directly, so each hook reads
  // sync() as it is during backward: the first micro-batch's backward inside NoSync stays local, the second one
  // carries the window's sum. finish() must have forgotten iteration 1's forward. Equal to 2 full-batch steps.
  const Data data(16);
  const std::vector<torch::Tensor> reference = full_batch_sgd(data, 2);
  auto models = replicas(2);
  std::vector<int64_t> quiet_calls(2, -1);
  const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
    const int r = comm.rank();
    auto& model = models[r];
    ddp::Reducer reducer(comm, model->parameters());
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    const auto micro = accum::split_batch(ddp::shard(data.x, r, 2), ddp::shard(data.y, r, 2), 4);  // 2 of 4 items
    const accum::LossFn loss_fn = [&](const accum::MicroBatch& mb) {
      return torch::mse_loss(model->forward(mb.input), mb.target);
    };
    ddp::train_step(reducer, sgd, micro, loss_fn);
    sgd.zero_grad();
    {
      ddp::NoSync quiet(reducer);
      comm.reset_stats();
      loss_fn(micro[0]).mul(0.5).backward();
      quiet_calls[r] = comm.stats().all_reduce_calls;
    }
    loss_fn(micro[1]).mul(0.5).backward();
    reducer.finish();
    sgd.step();
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    INFO(outcomes[r].error);
    REQUIRE(outcomes[r].ok);
    CHECK(quiet_calls[r] == 0);
    const double rel = rel_error(values_of(models[r]->parameters()), reference);
    CAPTURE(rel);
    CHECK(rel <= 1e-6);
  }
}

TEST_CASE("[step4] two or more ranks finding an inf: every rank skips once, whatever how many found one") {
  std::vector<int> with_two(4, -1), with_all(4, -1);
  dist::run_ranks(launch(4), [&](dist::Comm& comm) {
    with_two[comm.rank()] = ddp::all_ranks_found_inf(comm, comm.rank() == 1 || comm.rank() == 2) ? 1 : 0;
    with_all[comm.rank()] = ddp::all_ranks_found_inf(comm, true) ? 1 : 0;
  });
  CHECK(with_two == std::vector<int>{1, 1, 1, 1});
  CHECK(with_all == std::vector<int>{1, 1, 1, 1});
  // The sharded scaler on 3 ranks, an inf in ranks 0's and 2's gradients: every rank skips, the scale backs off once.
  const int n = 3;
  const ShardedStep run = sharded_step(
      n,
      [](int r, torch::Tensor& grad) {
        if (r != 1) grad[r] = std::numeric_limits<float>::infinity();
      },
      false);
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(run.stepped[r] == 0);
    CHECK(run.scales[r] == 512.0);
    CHECK(torch::equal(run.after[r], torch::zeros({4})));
  }
}

TEST_CASE("[step4] a disabled ShardedGradScaler is a pass-through: no agreement, no scaling, every step runs") {
  // As PyTorch's: scale() returns the loss itself, unscale_ does nothing (no collective), step() steps, update()
  // does nothing, the scale reads 1.
  std::vector<int> same_loss(2, -1), stepped(2, -1);
  std::vector<int64_t> calls(2, -1);
  std::vector<double> scales(2, 0);
  std::vector<torch::Tensor> after(2);
  const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
    const int r = comm.rank();
    torch::Tensor p = torch::zeros({4}, torch::requires_grad());
    torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1));
    amp::GradScalerOptions options;
    options.enabled = false;
    ddp::ShardedGradScaler scaler(comm, options);
    const torch::Tensor loss = (p * (r + 1)).sum();
    const torch::Tensor scaled = scaler.scale(loss);
    same_loss[r] = scaled.unsafeGetTensorImpl() == loss.unsafeGetTensorImpl() ? 1 : 0;
    scaled.backward();
    comm.reset_stats();
    scaler.unscale_(sgd);  // explicit, as before clipping
    stepped[r] = scaler.step(sgd) ? 1 : 0;
    scaler.update();
    calls[r] = comm.stats().calls;
    scales[r] = scaler.get_scale();
    after[r] = p.detach().clone();
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    INFO(outcomes[r].error);
    REQUIRE(outcomes[r].ok);
    CHECK(same_loss[r] == 1);
    CHECK(stepped[r] == 1);
    CHECK(calls[r] == 0);
    CHECK(scales[r] == 1.0);
    CHECK(torch::allclose(after[r], torch::full({4}, -0.1 * (r + 1))));
  }
}

}  // namespace ddp_checks
