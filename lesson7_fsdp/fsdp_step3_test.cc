// Checks for lesson 7, step 3: gather on demand, reduce-scatter in the backward, sharded optimizer steps.
// Run: bazel test //lesson7_fsdp:fsdp_step3_test
#include "lesson7_fsdp/fsdp_test_problem.h"

#include <string>
#include <vector>

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/torch.h>

#include "common/memory_meter.h"
#include "lesson5_distributed/comm.h"
#include "lesson7_fsdp/fsdp.h"

using namespace fsdp_checks;  // NOLINT: the shared problem (fsdp_test_problem.h)

namespace {

// `steps` sharded steps on this rank; returns every parameter gathered back (in the oracle's order).
std::vector<torch::Tensor> sharded_training(dist::Comm& comm, const Problem& p, Opt opt, int steps) {
  const int r = comm.rank(), n = comm.world_size();
  std::vector<fsdp::FlatParam> flats;
  for (const auto& layer : p.layers) flats.push_back(fsdp::flatten_and_shard(layer, r, n));
  std::vector<torch::Tensor> shards;
  for (auto& flat : flats) shards.push_back(flat.shard);
  auto optimizer = make_optimizer(shards, opt);  // the optimizer sees only this rank's slices
  for (int s = 0; s < steps; ++s) {
    optimizer->zero_grad();
    torch::Tensor h = rows(p.x, r, n);
    for (size_t l = 0; l < flats.size(); ++l) h = fsdp::sharded_forward(comm, flats[l], kLayers[l], h);
    torch::mse_loss(h, rows(p.y, r, n)).backward();
    optimizer->step();
  }
  return gathered_params(comm, flats);
}

}  // namespace

TEST_CASE("[step3] K sharded steps on N ranks equal K full-batch steps of one process (SGD and Adam)") {
  const Problem p = make_problem();
  for (const Opt opt : {Opt::kSgd, Opt::kAdam}) {
    const std::vector<torch::Tensor> reference = full_batch(p, opt, 3);
    const std::vector<torch::Tensor> start = full_batch(p, opt, 0);
    REQUIRE(rel_error(start, reference) > 1e-3);  // the steps move the parameters, far beyond the tolerance
    for (const int n : {2, 3}) {
      std::vector<std::vector<torch::Tensor>> got(static_cast<size_t>(n));
      dist::run_ranks(launch(n), [&](dist::Comm& comm) {
        got[static_cast<size_t>(comm.rank())] = sharded_training(comm, p, opt, 3);
      });
      for (int r = 0; r < n; ++r) {
        CAPTURE(n);
        CAPTURE(r);
        CAPTURE(opt == Opt::kSgd ? "SGD" : "Adam");
        const double rel = rel_error(got[static_cast<size_t>(r)], reference);
        CAPTURE(rel);
        CHECK(rel <= 1e-6);  // float32 sums in another order: a few units of 2^-23 (the page says why)
      }
    }
  }
}

TEST_CASE("[step3] per layer and step: one all-gather in the forward, one in the backward, one reduce-scatter") {
  const Problem p = make_problem();
  for (const int n : {2, 3}) {
    std::vector<std::vector<std::string>> forward_log(static_cast<size_t>(n)), step_log(static_cast<size_t>(n));
    std::vector<dist::CommStats> stats(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const int r = comm.rank();
      std::vector<fsdp::FlatParam> flats;
      for (const auto& layer : p.layers) flats.push_back(fsdp::flatten_and_shard(layer, r, n));
      comm.reset_stats();
      torch::Tensor h = rows(p.x, r, n);
      for (size_t l = 0; l < flats.size(); ++l) h = fsdp::sharded_forward(comm, flats[l], kLayers[l], h);
      forward_log[static_cast<size_t>(r)] = comm.log();
      torch::mse_loss(h, rows(p.y, r, n)).backward();
      step_log[static_cast<size_t>(r)] = comm.log();
      stats[static_cast<size_t>(r)] = comm.stats();
      for (const auto& flat : flats) {  // the gradient of each slice, and nothing bigger
        REQUIRE(flat.shard.grad().defined());
        CHECK(flat.shard.grad().numel() == flat.padded_numel / n);
      }
    });
    // Each ring is N - 1 sends of one shard: the sends of the forward, then of the backward, layer by layer.
    const auto sends = [&](const std::vector<int>& layers) {
      std::vector<std::string> out;
      for (const int l : layers) {
        for (int i = 0; i < n - 1; ++i) out.push_back("send " + std::to_string(4 * shard_of(kLayerNumel[l], n)));
      }
      return out;
    };
    const auto only_sends = [](const std::vector<std::string>& log) {
      std::vector<std::string> out;
      for (const auto& entry : log) {
        if (entry.rfind("send ", 0) == 0) out.push_back(entry);
      }
      return out;
    };
    int64_t bytes = 0;
    for (int l = 0; l < 3; ++l) bytes += 3 * (n - 1) * shard_of(kLayerNumel[l], n) * 4;
    for (int r = 0; r < n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      // Forward: layer 0, 1, 2 gathered in turn. Backward: layer 2 gathered then reduce-scattered, then 1, then 0.
      CHECK(only_sends(forward_log[static_cast<size_t>(r)]) == sends({0, 1, 2}));
      CHECK(only_sends(step_log[static_cast<size_t>(r)]) == sends({0, 1, 2, 2, 2, 1, 1, 0, 0}));
      const dist::CommStats& s = stats[static_cast<size_t>(r)];
      CHECK(s.send_calls == 9 * (n - 1));
      CHECK(s.send_bytes == bytes);  // 3 (N - 1) / N x the padded bytes of every layer
      CHECK(s.all_reduce_calls == 0);
    }
  }
}

TEST_CASE("[step3] a layer's full parameters are freed as soon as the forward, and the backward, are done") {
  const Problem p = make_problem();
  const int n = 2;
  dist::run_ranks(launch(n), [&](dist::Comm& comm) {
    fsdp::FlatParam flat = fsdp::flatten_and_shard(p.layers[1], comm.rank(), n);
    // The layer function sees the parameters it is given: note their storage (weakly: the note keeps nothing).
    std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> seen;
    std::vector<size_t> seen_bytes;
    const fsdp::LayerFn watched = [&](const torch::Tensor& x, const std::vector<torch::Tensor>& params) {
      seen.push_back(params[0].storage().getWeakStorageImpl());
      seen_bytes.push_back(params[0].storage().nbytes());
      return hidden(x, params);
    };
    const torch::Tensor x = torch::randn({4, 15}).requires_grad_(true);
    const torch::Tensor y = fsdp::sharded_forward(comm, flat, watched, x);
    REQUIRE(seen.size() == 1);
    CHECK(seen_bytes[0] == static_cast<size_t>(flat.padded_numel * 4));  // views of the whole gathered buffer
    CHECK(seen[0].expired());                                            // ... gone once the forward returned
    y.sum().backward();
    REQUIRE(seen.size() == 2);  // gathered again for the backward
    CHECK(seen_bytes[1] == static_cast<size_t>(flat.padded_numel * 4));
    CHECK(seen[1].expired());  // ... and gone again
    CHECK(x.grad().defined());
    CHECK(x.grad().sizes() == x.sizes());
  });
}

TEST_CASE("[step3] a shard that does not require grad is refused by name") {
  const Problem p = make_problem();
  const std::vector<dist::RankOutcome> outcomes = dist::run_ranks_collect(launch(1), [&](dist::Comm& comm) {
    fsdp::FlatParam flat = fsdp::flatten_and_shard(p.layers[0], 0, 1);
    flat.shard = flat.shard.detach();
    fsdp::sharded_forward(comm, flat, kLayers[0], p.x);
  });
  REQUIRE(outcomes.size() == 1);
  CHECK_FALSE(outcomes[0].ok);
  CHECK(outcomes[0].error.find("requires grad") != std::string::npos);
}

TEST_CASE("[step3] a layer that ignores its parameters on one rank: zeros are that rank's share, not a hang") {
  const Problem p = make_problem();
  const int n = 2;
  // Rank 1's middle layer skips its parameters (an expert no item was routed to, say). Without allow_unused,
  // autograd::grad throws on rank 1 alone and rank 0 waits in the reduce-scatter until the timeout.
  const fsdp::LayerFn skip = ignores_params;
  std::vector<torch::Tensor> got(n);
  const std::vector<dist::RankOutcome> outcomes = dist::run_ranks_collect(launch(n, 5000), [&](dist::Comm& comm) {
    const int r = comm.rank();
    std::vector<fsdp::FlatParam> flats;
    for (const auto& layer : p.layers) flats.push_back(fsdp::flatten_and_shard(layer, r, n));
    torch::Tensor h = rows(p.x, r, n);
    for (size_t l = 0; l < 3; ++l) h = fsdp::sharded_forward(comm, flats[l], (r == 1 && l == 1) ? skip : kLayers[l], h);
    torch::mse_loss(h, rows(p.y, r, n)).backward();
    got[static_cast<size_t>(r)] = flats[1].shard.grad().clone();
  });
  // The oracle: rank 0's own gradient of the middle layer plus rank 1's zeros, over N.
  std::vector<std::vector<torch::Tensor>> layers;
  for (const auto& layer : p.layers) {
    layers.emplace_back();
    for (const auto& t : layer) layers.back().push_back(t.clone().requires_grad_(true));
  }
  torch::Tensor h = rows(p.x, 0, n);
  for (size_t l = 0; l < 3; ++l) h = kLayers[l](h, layers[l]);
  torch::mse_loss(h, rows(p.y, 0, n)).backward();
  const int64_t size = shard_of(kLayerNumel[1], n);
  const torch::Tensor flat = torch::cat({layers[1][0].grad().reshape({-1}), layers[1][1].grad().reshape({-1}),
                                         torch::zeros({n * size - kLayerNumel[1]})}) /
                             n;
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    INFO(outcomes[static_cast<size_t>(r)].error);
    REQUIRE(outcomes[static_cast<size_t>(r)].ok);
    CHECK(rel_error({got[static_cast<size_t>(r)]}, {flat.narrow(0, r * size, size)}) <= 1e-6);
  }
}

TEST_CASE("[step3] lesson 4's meter: a forward holds one layer's full parameters at a time, not the model's") {
  const std::vector<std::vector<torch::Tensor>> layers = wide_layers();
  const int n = 2;
  std::vector<int64_t> peak(static_cast<size_t>(n));
  dist::run_ranks(launch(n), [&](dist::Comm& comm) {
    std::vector<fsdp::FlatParam> flats;
    for (const auto& layer : layers) flats.push_back(fsdp::flatten_and_shard(layer, comm.rank(), n));
    const torch::Tensor x = torch::randn({2, 64});
    // Counts this rank's thread only (the other rank's tensors are another thread's).
    workshop::MemoryMeter meter(torch::kCPU, workshop::MeterScope::kThisThread);
    torch::Tensor h = x;
    for (size_t l = 0; l < flats.size(); ++l) h = fsdp::sharded_forward(comm, flats[l], hidden, h);
    peak[static_cast<size_t>(comm.rank())] = meter.peak_bytes();
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CAPTURE(peak[static_cast<size_t>(r)]);
    // One gathered layer (16640 bytes) plus the activations (8 layers x 2 x 64 floats, 4 KiB, with room for the
    // temporaries of tanh and linear); all 8 layers' full parameters would be 133120 bytes.
    CHECK(peak[static_cast<size_t>(r)] >= kWideLayerBytes);
    CHECK(peak[static_cast<size_t>(r)] <= kWideLayerBytes + 8192);
  }
}
