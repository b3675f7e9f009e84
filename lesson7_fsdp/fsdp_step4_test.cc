// Checks for lesson 7, step 4: the next layer's all-gather in flight while a layer computes (prefetch).
// Run: bazel test //lesson7_fsdp:fsdp_step4_test
#include "lesson7_fsdp/fsdp_test_problem.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "common/memory_meter.h"
#include "lesson5_distributed/comm.h"
#include "lesson7_fsdp/fsdp.h"

using namespace fsdp_checks;  // NOLINT: the shared problem (fsdp_test_problem.h)

namespace {

struct Run {
  std::vector<torch::Tensor> params;  // after the steps, gathered back
  int max_alive = 0;
  int64_t sent_per_step = 0;  // the last step's bytes
  int64_t sends_per_step = 0;
  int64_t agreements_per_step = 0;  // the all-gathers of the agreements' records
  int64_t agreement_bytes_per_step = 0;
};

// `steps` steps of the problem on this rank through a ShardedStack.
Run stack_training(dist::Comm& comm, const Problem& p, Opt opt, int steps, bool prefetch) {
  const int r = comm.rank(), n = comm.world_size();
  std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
  std::vector<torch::Tensor> shards = master_shards(flats);
  auto optimizer = make_optimizer(shards, opt);
  fsdp::ShardedStack stack(comm, flats, kLayers, prefetch);
  Run run;
  for (int s = 0; s < steps; ++s) {
    comm.reset_stats();
    optimizer->zero_grad();
    torch::mse_loss(stack.forward(rows(p.x, r, n)), rows(p.y, r, n)).backward();
    stack.finish();
    run.sent_per_step = comm.stats().send_bytes;
    run.sends_per_step = comm.stats().send_calls;
    run.agreements_per_step = comm.stats().all_gather_calls;
    run.agreement_bytes_per_step = comm.stats().all_gather_bytes;
    optimizer->step();
  }
  run.max_alive = stack.max_alive();
  run.params = gathered_params(comm, flats);
  return run;
}

}  // namespace

TEST_CASE("[step4] start_gather: every rank's shard in rank order, (N-1)/N of the padded bytes, in one round") {
  const Problem p = make_problem();
  for (const int n : {2, 3, 4}) {
    std::vector<torch::Tensor> got(static_cast<size_t>(n));
    std::vector<dist::CommStats> stats(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const fsdp::FlatParam flat = fsdp::flatten_and_shard(p.layers[1], comm.rank(), n);
      fsdp::PendingGather pending = fsdp::start_gather(comm, flat, 7);
      got[static_cast<size_t>(comm.rank())] = pending.wait();
      stats[static_cast<size_t>(comm.rank())] = comm.stats();
    });
    const fsdp::FlatParam any = fsdp::flatten_and_shard(p.layers[1], 0, n);
    for (int r = 0; r < n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      const std::vector<torch::Tensor> views = fsdp::unflatten(any, got[static_cast<size_t>(r)]);
      CHECK(torch::equal(views[0], p.layers[1][0]));
      CHECK(torch::equal(views[1], p.layers[1][1]));
      CHECK(stats[static_cast<size_t>(r)].send_bytes == (n - 1) * shard_of(kLayerNumel[1], n) * 4);
      CHECK(stats[static_cast<size_t>(r)].send_calls == n - 1);
    }
  }
  fsdp_checks::check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        const fsdp::FlatParam flat = fsdp::flatten_and_shard(p.layers[0], comm.rank(), 3);
        fsdp::start_gather(comm, flat, 0);
      },
      "was made for rank");
}

TEST_CASE("[step4] with and without prefetch: the same parameters, the same bytes; two buffers alive at most") {
  const Problem p = make_problem();
  for (const Opt opt : {Opt::kSgd, Opt::kAdam}) {
    const std::vector<torch::Tensor> reference = full_batch(p, opt, 3);
    for (const int n : {2, 3}) {
      std::vector<Run> with(static_cast<size_t>(n)), without(static_cast<size_t>(n));
      dist::run_ranks(launch(n), [&](dist::Comm& comm) {
        with[static_cast<size_t>(comm.rank())] = stack_training(comm, p, opt, 3, true);
        without[static_cast<size_t>(comm.rank())] = stack_training(comm, p, opt, 3, false);
      });
      int64_t bytes = 0;
      for (int l = 0; l < 3; ++l) bytes += 3 * (n - 1) * shard_of(kLayerNumel[l], n) * 4;
      for (int r = 0; r < n; ++r) {
        CAPTURE(n);
        CAPTURE(r);
        CAPTURE(name_of(opt));
        const Run& a = with[static_cast<size_t>(r)];
        const Run& b = without[static_cast<size_t>(r)];
        REQUIRE(a.params.size() == b.params.size());
        for (size_t i = 0; i < a.params.size(); ++i) CHECK(torch::equal(a.params[i], b.params[i]));
        CHECK(rel_error(a.params, reference) <= 1e-6);
        CHECK(a.sent_per_step == bytes);  // 2 all-gathers + 1 reduce-scatter per layer, prefetched or not
        CHECK(b.sent_per_step == bytes);
        CHECK(a.sends_per_step == 9 * (n - 1));
        // The agreements: the forward's, one per layer's backward and finish()'s, each a record of 8 int64.
        CHECK(a.agreements_per_step == 5);
        CHECK(a.agreement_bytes_per_step == 5 * 64);
        CHECK(a.max_alive == 2);  // the layer computing and the next one's gather in flight, never more
        CHECK(b.max_alive == 1);  // without prefetch: one layer's at a time
      }
    }
  }
}

TEST_CASE("[step4] the next layer's gather is under way before a layer computes, forward and backward") {
  const Problem p = make_problem();
  const int n = 2;
  // On 2 ranks every gather or reduce-scatter is one send of the layer's shard, and the three shards differ in
  // size: the last send before a layer function runs names the layer whose collective was started last.
  std::vector<std::string> send_of;
  for (int l = 0; l < 3; ++l) send_of.push_back("send " + std::to_string(4 * shard_of(kLayerNumel[l], n)));
  for (const bool prefetch : {true, false}) {
    std::vector<std::pair<int64_t, std::string>> seen;  // rank 0: (sends so far, the last one) at each layer call
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      std::vector<fsdp::FlatParam> flats = shard_layers(p, comm.rank(), n);
      std::vector<fsdp::LayerFn> watched;
      for (const auto& fn : kLayers) {
        watched.push_back([&comm, &seen, fn](const torch::Tensor& x, const std::vector<torch::Tensor>& params) {
          if (comm.rank() == 0) {
            std::string last;
            for (const auto& entry : comm.log()) {
              if (entry.rfind("send ", 0) == 0) last = entry;
            }
            seen.emplace_back(comm.stats().send_calls, last);
          }
          return fn(x, params);
        });
      }
      fsdp::ShardedStack stack(comm, flats, watched, prefetch);
      comm.reset_stats();
      stack.forward(rows(p.x, comm.rank(), n)).sum().backward();
      stack.finish();
    });
    CAPTURE(prefetch);
    // Forward, layers 0, 1, 2: with prefetch, layer l runs after layer l + 1's gather has started. Backward, layers
    // 2, 1, 0: layer 2 is gathered again; with prefetch layer l - 1's gather starts before layer l recomputes; each
    // reduce-scatter follows its layer's recomputation.
    const std::vector<std::pair<int64_t, std::string>> expected =
        prefetch ? std::vector<std::pair<int64_t, std::string>>{{2, send_of[1]}, {3, send_of[2]}, {3, send_of[2]},
                                                                {5, send_of[1]}, {7, send_of[0]}, {8, send_of[1]}}
                 : std::vector<std::pair<int64_t, std::string>>{{1, send_of[0]}, {2, send_of[1]}, {3, send_of[2]},
                                                                {4, send_of[2]}, {6, send_of[1]}, {8, send_of[0]}};
    REQUIRE(seen.size() == expected.size());
    for (size_t i = 0; i < seen.size(); ++i) {
      CAPTURE(i);
      CHECK(seen[i].first == expected[i].first);
      CHECK(seen[i].second == expected[i].second);
    }
  }
}

TEST_CASE("[step4] one LayerFn per FlatParam") {
  const Problem p = make_problem();
  const std::vector<dist::RankOutcome> outcomes = dist::run_ranks_collect(launch(1), [&](dist::Comm& comm) {
    std::vector<fsdp::FlatParam> flats{fsdp::flatten_and_shard(p.layers[0], 0, 1)};
    fsdp::ShardedStack stack(comm, flats, kLayers);
    stack.forward(p.x);
  });
  check_every_rank_failed_with(outcomes, "one LayerFn per FlatParam");
}

TEST_CASE("[step4] lesson 4's meter: a prefetching forward holds two layers' full parameters, never three") {
  const std::vector<std::vector<torch::Tensor>> layers = wide_layers();
  const int n = 2;
  for (const bool prefetch : {true, false}) {
    std::vector<int64_t> peak(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      std::vector<fsdp::FlatParam> flats;
      for (const auto& layer : layers) flats.push_back(fsdp::flatten_and_shard(layer, comm.rank(), n));
      fsdp::ShardedStack stack(comm, flats, std::vector<fsdp::LayerFn>(layers.size(), fsdp::LayerFn(hidden)), prefetch);
      const torch::Tensor x = torch::randn({2, 64});
      workshop::MemoryMeter meter(torch::kCPU, workshop::MeterScope::kThisThread);  // this rank's thread only
      stack.forward(x);
      peak[static_cast<size_t>(comm.rank())] = meter.peak_bytes();
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(prefetch);
      CAPTURE(r);
      CAPTURE(peak[static_cast<size_t>(r)]);
      // Gathered layers of 16640 bytes each plus at most 8 KiB of activations and temporaries.
      const int64_t buffers = prefetch ? 2 : 1;
      CHECK(peak[static_cast<size_t>(r)] >= buffers * kWideLayerBytes);
      CHECK(peak[static_cast<size_t>(r)] <= buffers * kWideLayerBytes + 8192);
    }
  }
}

namespace {

// The problem's stack on this rank, trained for `steps` steps with SGD; `depends` says whether rank 1's loss uses the
// stack's output, `finish` whether every rank calls finish() after its backward.
void train_with_rank1(dist::Comm& comm, const Problem& p, int steps, bool depends, bool finish) {
  const int r = comm.rank(), n = comm.world_size();
  std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
  std::vector<torch::Tensor> shards = master_shards(flats);
  torch::optim::SGD sgd(shards, torch::optim::SGDOptions(0.1));
  fsdp::ShardedStack stack(comm, flats, kLayers);
  const torch::Tensor other = torch::ones({1}, torch::requires_grad());
  for (int s = 0; s < steps; ++s) {
    sgd.zero_grad();
    const torch::Tensor out = stack.forward(rows(p.x, r, n));
    const torch::Tensor loss = (r == 1 && !depends) ? other.sum() : torch::mse_loss(out, rows(p.y, r, n));
    loss.backward();
    if (finish) stack.finish();
    sgd.step();
  }
}

}  // namespace

TEST_CASE("[step4] a layer that gets no gradient on one rank: the same error on every rank, naming it, no timeout") {
  const Problem p = make_problem();
  // Rank 1's loss does not use the stack's output: its backward never reaches layer 2. Without finish(), its next
  // forward meets rank 0's agreement before layer 2's backward.
  check_fails_on_every_rank(
      2, [&](dist::Comm& comm) { train_with_rank1(comm, p, 2, false, false); },
      "layer 2 got no gradient on rank 1 (it is in a forward");
  // With finish(), one step is enough: rank 1 makes no call after its finish(), which meets rank 0's agreement.
  check_fails_on_every_rank(
      2, [&](dist::Comm& comm) { train_with_rank1(comm, p, 1, false, true); },
      "layer 2 got no gradient on rank 1 (it is in finish() instead");
}

TEST_CASE("[step4] finish(): forgotten on one rank, or at a call that matches nothing: named on every rank") {
  const Problem p = make_problem();
  // Rank 1 goes on to its next forward without finish(); rank 0 waits in its finish().
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        std::vector<fsdp::FlatParam> flats = shard_layers(p, comm.rank(), 2);
        fsdp::ShardedStack stack(comm, flats, kLayers);
        const torch::Tensor x = rows(p.x, comm.rank(), 2);
        stack.forward(x).sum().backward();
        if (comm.rank() == 0) stack.finish();
        stack.forward(x);
      },
      "on rank 1: finish() was not called after the previous backward");
  // No backward at all (no-grad forwards), and finish() on rank 0 only: a finish() that meets a forward.
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        std::vector<fsdp::FlatParam> flats = shard_layers(p, comm.rank(), 2);
        fsdp::ShardedStack stack(comm, flats, kLayers);
        torch::NoGradGuard no_grad;
        stack.forward(rows(p.x, comm.rank(), 2));
        if (comm.rank() == 0) stack.finish();
        stack.forward(rows(p.x, comm.rank(), 2));
      },
      "the ranks are at different calls");
}

TEST_CASE("[step4] a layer function that ignores its parameters on one rank: zeros are that rank's share, no hang") {
  const Problem p = make_problem();
  const int n = 2;
  // Rank 1's layer 1 does not use its parameters (a skipped expert, say): its gradient there is zero.
  const fsdp::LayerFn skip = ignores_params;
  std::vector<torch::Tensor> got(n);
  const std::vector<dist::RankOutcome> outcomes = dist::run_ranks_collect(launch(n, 5000), [&](dist::Comm& comm) {
    const int r = comm.rank();
    std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
    fsdp::ShardedStack stack(comm, flats, r == 1 ? std::vector<fsdp::LayerFn>{hidden, skip, last} : kLayers);
    torch::mse_loss(stack.forward(rows(p.x, r, n)), rows(p.y, r, n)).backward();
    stack.finish();
    got[static_cast<size_t>(r)] = flats[1].shard.grad().clone();
  });
  // The oracle: rank 0's own gradient of layer 1, plus rank 1's zeros, over 2.
  std::vector<std::vector<torch::Tensor>> layers;
  for (const auto& layer : p.layers) {
    layers.emplace_back();
    for (const auto& t : layer) layers.back().push_back(t.clone().requires_grad_(true));
  }
  torch::Tensor h = rows(p.x, 0, n);
  for (size_t l = 0; l < 3; ++l) h = kLayers[l](h, layers[l]);
  torch::mse_loss(h, rows(p.y, 0, n)).backward();
  const torch::Tensor flat = torch::cat({layers[1][0].grad().reshape({-1}), layers[1][1].grad().reshape({-1}),
                                         torch::zeros({fsdp::padded_numel(kLayerNumel[1], n) - kLayerNumel[1]})}) /
                             n;
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    INFO(outcomes[static_cast<size_t>(r)].error);
    REQUIRE(outcomes[static_cast<size_t>(r)].ok);
    const int64_t size = shard_of(kLayerNumel[1], n);
    CHECK(rel_error({got[static_cast<size_t>(r)]}, {flat.narrow(0, r * size, size)}) <= 1e-6);
  }
}

TEST_CASE("[step4] models that differ across ranks: the same error on every rank before any gather") {
  const Problem p = make_problem();
  // Rank 1 has a layer fewer.
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        const int r = comm.rank();
        std::vector<fsdp::FlatParam> flats;
        for (size_t l = 0; l < (r == 1 ? 2u : 3u); ++l) flats.push_back(fsdp::flatten_and_shard(p.layers[l], r, 2));
        fsdp::ShardedStack stack(comm, flats,
                                 std::vector<fsdp::LayerFn>(kLayers.begin(), kLayers.begin() + flats.size()));
        stack.forward(rows(p.x, r, 2));
      },
      "models differ across ranks");
  // Rank 1's middle weight is transposed: the same sizes, another shape.
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        const int r = comm.rank();
        std::vector<fsdp::FlatParam> flats;
        for (size_t l = 0; l < 3; ++l) {
          std::vector<torch::Tensor> layer = p.layers[l];
          if (r == 1 && l == 1) layer[0] = layer[0].t().contiguous();
          flats.push_back(fsdp::flatten_and_shard(layer, r, 2));
        }
        fsdp::ShardedStack stack(comm, flats, kLayers);
        stack.forward(rows(p.x, r, 2));
      },
      "models differ across ranks");
}

TEST_CASE("[step4] a layer used twice in one forward is refused on every rank, naming it") {
  const Problem p = make_problem();
  // On rank 1 only, the same shard listed twice (layer 2 is layer 1's FlatParam again): rank 1 must not throw
  // alone, or rank 0 waits for it in the agreement.
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        std::vector<fsdp::FlatParam> flats;
        for (size_t l = 0; l < 3; ++l) flats.push_back(fsdp::flatten_and_shard(p.layers[l], comm.rank(), 2));
        if (comm.rank() == 1) flats[2] = flats[1];
        fsdp::ShardedStack stack(comm, flats, kLayers);
        stack.forward(rows(p.x, comm.rank(), 2));
      },
      "on rank 1: layer 2 is layer 1 again");
  // On rank 1 only, a second forward while the first one's graph waits for its backward: every layer would be
  // gathered twice. Rank 0 backpropagates and meets rank 1's second forward.
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        std::vector<fsdp::FlatParam> flats = shard_layers(p, comm.rank(), 2);
        fsdp::ShardedStack stack(comm, flats, kLayers);
        const torch::Tensor x = rows(p.x, comm.rank(), 2);
        const torch::Tensor a = stack.forward(x);
        const torch::Tensor b = comm.rank() == 1 ? stack.forward(x) : a;
        (a + b).sum().backward();
      },
      "on rank 1: layer 0 was gathered twice before its backward");
  // Not after a backward, nor when the graph is gone or was never made (no-grad).
  dist::run_ranks(launch(2), [&](dist::Comm& comm) {
    std::vector<fsdp::FlatParam> flats = shard_layers(p, comm.rank(), 2);
    fsdp::ShardedStack stack(comm, flats, kLayers);
    const torch::Tensor x = rows(p.x, comm.rank(), 2);
    const torch::Tensor out = stack.forward(x);
    out.sum().backward();
    stack.finish();
    stack.forward(x);                   // the first graph's backward ran (its output is still alive)
    stack.forward(x).sum().backward();  // the previous output was dropped: its graph is gone
    stack.finish();
    torch::NoGradGuard no_grad;
    stack.forward(x);
    stack.forward(x);
  });
}

TEST_CASE(
    "[step4] a FlatParam of another rank or world size, a shard without grad, one listed twice: on rank 1 only, "
    "refused on every rank") {
  const Problem p = make_problem();
  // The stack's forward on rank 1 with `change` applied to its FlatParams (rank 0's are right).
  const auto on_rank1 = [&p](std::function<void(std::vector<fsdp::FlatParam>&)> change) {
    return [&p, change](dist::Comm& comm) {
      std::vector<fsdp::FlatParam> flats = shard_layers(p, comm.rank(), 2);
      if (comm.rank() == 1) change(flats);
      fsdp::ShardedStack stack(comm, flats, kLayers);
      stack.forward(rows(p.x, comm.rank(), 2));
    };
  };
  // Rank 0's FlatParams on rank 1: the same shapes and world size, so only their rank tells (rank 1 alone would
  // fail in its gather, and rank 0 would wait for it).
  check_fails_on_every_rank(2, on_rank1([&p](auto& flats) { flats = shard_layers(p, 0, 2); }),
                            "on rank 1: layer 0's FlatParam was made for rank 0 of 2, but this is rank 1 of 2");
  check_fails_on_every_rank(2, on_rank1([&p](auto& flats) { flats[2] = fsdp::flatten_and_shard(p.layers[2], 0, 2); }),
                            "on rank 1: layer 2's FlatParam was made for rank 0 of 2");
  // Made for 3 ranks.
  check_fails_on_every_rank(2, on_rank1([&p](auto& flats) { flats = shard_layers(p, 1, 3); }),
                            "on rank 1: layer 0's FlatParam was made for rank 1 of 3, but this is rank 1 of 2");
  // Layer 1's shard detached (it does not require grad).
  check_fails_on_every_rank(2, on_rank1([](auto& flats) { flats[1].shard = flats[1].shard.detach(); }),
                            "on rank 1: layer 1's shard must be a leaf that requires grad");
  // The same shard listed twice, not next to itself: layer 2 is layer 0 again.
  check_fails_on_every_rank(2, on_rank1([](auto& flats) { flats[2] = flats[0]; }),
                            "on rank 1: layer 2 is layer 0 again");
}

TEST_CASE("[step4] two backwards (each with its finish()) before one step accumulate the full batch's gradient") {
  const Problem p = make_problem();
  for (const bool prefetch : {true, false}) {
    for (const int n : {2, 3}) {
      CAPTURE(prefetch);
      std::vector<std::vector<torch::Tensor>> got(static_cast<size_t>(n));
      dist::run_ranks(launch(n), [&](dist::Comm& comm) {
        const int r = comm.rank();
        std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
        fsdp::ShardedStack stack(comm, flats, kLayers, prefetch);
        for (int m = 0; m < 2; ++m) {  // each micro-batch is half the rank's rows: its loss counts half
          const torch::Tensor out = stack.forward(micro_rows(p.x, r, n, m, 2));
          (torch::mse_loss(out, micro_rows(p.y, r, n, m, 2)) / 2).backward();
          stack.finish();
        }
        for (const auto& flat : flats) got[static_cast<size_t>(r)].push_back(flat.shard.grad());
      });
      check_full_batch_grads(got, full_batch_flat_grads(p, n), 1e-6);
    }
  }
}

TEST_CASE("[step4] lesson 4's meter in the backward: the working set of one or two layers, never the model's") {
  const std::vector<std::vector<torch::Tensor>> layers = wide_layers();
  const int n = 2;
  for (const bool prefetch : {true, false}) {
    std::vector<int64_t> peak(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      std::vector<fsdp::FlatParam> flats;
      for (const auto& layer : layers) flats.push_back(fsdp::flatten_and_shard(layer, comm.rank(), n));
      fsdp::ShardedStack stack(comm, flats, std::vector<fsdp::LayerFn>(layers.size(), fsdp::LayerFn(hidden)), prefetch);
      const torch::Tensor x = torch::randn({2, 64});
      const torch::Tensor out = stack.forward(x);
      // From the end of the forward: the backward runs on this thread (CPU autograd), so this rank's meter sees it.
      workshop::MemoryMeter meter(torch::kCPU, workshop::MeterScope::kThisThread);
      out.sum().backward();
      stack.finish();
      peak[static_cast<size_t>(comm.rank())] = meter.peak_bytes();
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(prefetch);
      CAPTURE(r);
      CAPTURE(peak[static_cast<size_t>(r)]);
      // What stays: every layer's gradient shard (8 x 8320 bytes, 1/N of the model). What comes and goes while
      // a layer is reduced: its gathered parameters, their gradient (autograd builds it from the views' in
      // buffers of the whole flat size), that gradient over N and the reduced shard, and with prefetch the next
      // layer's gather: a few layers' worth (LibTorch 1.13: 4.3 without prefetch, 4.9 with), at most 6 here.
      // Never the model's: every layer's full parameters or full gradients would be 8 x 16640 bytes more.
      const int64_t kept = 8 * kWideLayerBytes / n;
      CHECK(peak[static_cast<size_t>(r)] >= kept);
      CHECK(peak[static_cast<size_t>(r)] <= kept + 6 * kWideLayerBytes + 8192);
    }
  }
}
