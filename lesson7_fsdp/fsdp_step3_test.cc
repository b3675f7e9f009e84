// Checks for lesson 7, step 3: gather on demand, reduce-scatter in the backward, sharded optimizer steps.
// Run: bazel test //lesson7_fsdp:fsdp_step3_test
#include "lesson7_fsdp/fsdp_test_problem.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/torch.h>

#include "common/memory_meter.h"
#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/ddp.h"
#include "lesson7_fsdp/fsdp.h"

using namespace fsdp_checks;  // NOLINT: the shared problem (fsdp_test_problem.h)

namespace {

// `steps` sharded steps on this rank; returns every parameter gathered back (in the oracle's order).
std::vector<torch::Tensor> sharded_training(dist::Comm& comm, const Problem& p, Opt opt, int steps) {
  const int r = comm.rank(), n = comm.world_size();
  std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
  std::vector<torch::Tensor> shards = master_shards(flats);
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
        CAPTURE(name_of(opt));
        const double rel = rel_error(got[static_cast<size_t>(r)], reference);
        CAPTURE(rel);
        CHECK(rel <= 1e-6);  // float32 sums in another order: a few units of 2^-23 (the page says why)
      }
    }
  }
}

TEST_CASE(
    "[step3] per layer and step: one all-gather in the forward, one in the backward, one reduce-scatter, "
    "each after an agreement") {
  const Problem p = make_problem();
  for (const int n : {2, 3}) {
    std::vector<std::vector<std::string>> forward_log(static_cast<size_t>(n)), step_log(static_cast<size_t>(n));
    std::vector<dist::CommStats> stats(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const int r = comm.rank();
      std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
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
    // With the agreements: before each gather, one all-gather of a record of 8 int64 (64 bytes per rank).
    const auto sends_and_agreements = [](const std::vector<std::string>& log) {
      std::vector<std::string> out;
      for (const auto& entry : log) {
        if (entry.rfind("send ", 0) == 0 || entry.rfind("all_gather ", 0) == 0) out.push_back(entry);
      }
      return out;
    };
    const auto agreed = [&](const std::vector<std::vector<int>>& gathers_then_reduces) {
      std::vector<std::string> out{};
      for (const auto& layers : gathers_then_reduces) {
        out.push_back("all_gather 64");
        for (const std::string& send : sends(layers)) out.push_back(send);
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
      // Each layer's forward: its agreement, then its gather; each backward: its agreement, gather, reduce-scatter.
      CHECK(sends_and_agreements(step_log[static_cast<size_t>(r)]) == agreed({{0}, {1}, {2}, {2, 2}, {1, 1}, {0, 0}}));
      const dist::CommStats& s = stats[static_cast<size_t>(r)];
      CHECK(s.send_calls == 9 * (n - 1));
      CHECK(s.send_bytes == bytes);    // 3 (N - 1) / N x the padded bytes of every layer
      CHECK(s.all_gather_calls == 6);  // two agreements per layer and step
      CHECK(s.all_gather_bytes == 6 * 64);
      CHECK(s.all_reduce_calls == 0);
    }
  }
}

namespace {

// Bytes of the tensors and of their gradients.
int64_t tensor_bytes(const std::vector<torch::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const auto& t : tensors)
    bytes += static_cast<int64_t>(t.nbytes() + (t.grad().defined() ? t.grad().nbytes() : 0));
  return bytes;
}

}  // namespace

TEST_CASE("[step3] bytes kept per rank after an Adam step, beside DDP and ZeRO-1 on the same model") {
  // Float32 parameters, gradients and Adam's two moments: 16 bytes per parameter. DDP keeps all of them on every
  // rank; ZeRO-1 (lesson 5, step 5) shards the moments; full sharding shards everything, padding included.
  const Problem p = make_problem();
  const int64_t numel = kLayerNumel[0] + kLayerNumel[1] + kLayerNumel[2];
  for (const int n : {2, 3}) {
    std::vector<int64_t> ddp(static_cast<size_t>(n)), zero1(static_cast<size_t>(n)), sharded(static_cast<size_t>(n));
    std::vector<int64_t> owned(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const int r = comm.rank();
      const auto replicated = [&] {
        std::vector<torch::Tensor> all;
        for (const auto& layer : p.layers) {
          for (const auto& t : layer) all.push_back(t.clone().requires_grad_(true));
        }
        return all;
      };
      const auto step_on = [&](const std::vector<torch::Tensor>& all) {
        torch::Tensor h = rows(p.x, r, n);
        for (size_t l = 0; l < 3; ++l) h = kLayers[l](h, {all[2 * l], all[2 * l + 1]});
        torch::mse_loss(h, rows(p.y, r, n)).backward();
      };
      {  // DDP-style (the gradients' all-reduce does not change what is kept)
        std::vector<torch::Tensor> all = replicated();
        torch::optim::Adam adam(all, torch::optim::AdamOptions(0.01));
        step_on(all);
        adam.step();
        ddp[static_cast<size_t>(r)] = tensor_bytes(all) + ddp::optimizer_state_bytes(adam);
      }
      {  // ZeRO-1: lesson 5's ZeroOptimizer over the same replicated parameters
        std::vector<torch::Tensor> all = replicated();
        ddp::ZeroOptimizer zero(comm, all, [](std::vector<torch::Tensor> mine) {
          return std::make_unique<torch::optim::Adam>(mine, torch::optim::AdamOptions(0.01));
        });
        step_on(all);
        zero.step();
        zero1[static_cast<size_t>(r)] = tensor_bytes(all) + zero.state_bytes();
        for (size_t i = 0; i < all.size(); ++i) {
          if (zero.owners()[i] == r) owned[static_cast<size_t>(r)] += all[i].numel();
        }
      }
      {  // fully sharded (steps 2 and 3)
        std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
        std::vector<torch::Tensor> shards = master_shards(flats);
        torch::optim::Adam adam(shards, torch::optim::AdamOptions(0.01));
        torch::Tensor h = rows(p.x, r, n);
        for (size_t l = 0; l < flats.size(); ++l) h = fsdp::sharded_forward(comm, flats[l], kLayers[l], h);
        torch::mse_loss(h, rows(p.y, r, n)).backward();
        adam.step();
        sharded[static_cast<size_t>(r)] = tensor_bytes(shards) + ddp::optimizer_state_bytes(adam);
      }
    });
    int64_t shard_elements = 0;
    for (const int64_t layer : kLayerNumel) shard_elements += shard_of(layer, n);
    int64_t owned_in_all = 0;
    for (int r = 0; r < n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      CHECK(ddp[static_cast<size_t>(r)] == 16 * numel);
      CHECK(zero1[static_cast<size_t>(r)] == 8 * numel + 8 * owned[static_cast<size_t>(r)]);
      CHECK(sharded[static_cast<size_t>(r)] == 16 * shard_elements);  // 1/N of the padded model
      CHECK(sharded[static_cast<size_t>(r)] < zero1[static_cast<size_t>(r)]);
      owned_in_all += owned[static_cast<size_t>(r)];
    }
    CHECK(owned_in_all == numel);  // ZeRO-1's moments: every parameter's on exactly one rank
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

TEST_CASE("[step3] the layer function is kept until the backward: a temporary passed to sharded_forward is safe") {
  const Problem p = make_problem();
  const int n = 2;
  dist::run_ranks(launch(n), [&](dist::Comm& comm) {
    const int r = comm.rank();
    fsdp::FlatParam flat = fsdp::flatten_and_shard(p.layers[1], r, n);
    fsdp::FlatParam same = fsdp::flatten_and_shard(p.layers[1], r, n);
    const torch::Tensor x = torch::randn({4, 15});
    // A token that only the layer function holds: it lives as long as sharded_forward keeps the function.
    auto token = std::make_shared<int>(1);
    const std::weak_ptr<int> watch = token;
    torch::Tensor y = fsdp::sharded_forward(
        comm, flat,
        [token = std::move(token)](const torch::Tensor& h, const std::vector<torch::Tensor>& params) {
          return hidden(h, params) * static_cast<double>(*token);
        },
        x);  // the lambda's std::function is a temporary: gone after this line, unless sharded_forward copied it
    CHECK_FALSE(watch.expired());  // kept for the backward
    if (watch.expired()) return;   // (the backward would call a destroyed function)
    y.sum().backward();
    fsdp::sharded_forward(comm, same, hidden, x).sum().backward();  // the same layer, the same input
    CHECK(torch::equal(flat.shard.grad(), same.shard.grad()));
    y = torch::Tensor();
    CHECK(watch.expired());  // ... and freed with the graph: nothing outlives it
  });
}

TEST_CASE("[step3] a shard that does not require grad is refused by name") {
  const Problem p = make_problem();
  const std::vector<dist::RankOutcome> outcomes = dist::run_ranks_collect(launch(1), [&](dist::Comm& comm) {
    fsdp::FlatParam flat = fsdp::flatten_and_shard(p.layers[0], 0, 1);
    flat.shard = flat.shard.detach();
    fsdp::sharded_forward(comm, flat, kLayers[0], p.x);
  });
  check_every_rank_failed_with(outcomes, "requires grad");
}

namespace {

// The problem's three layers on this rank: `steps` steps whose loss on rank 1 is `rank1_loss` of the layers'
// outputs (every rank's loss is the problem's elsewhere).
void train_skipping(dist::Comm& comm, const Problem& p, int steps,
                    const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& rank1_loss) {
  const int r = comm.rank(), n = comm.world_size();
  std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
  for (int s = 0; s < steps; ++s) {
    std::vector<torch::Tensor> outs;
    torch::Tensor h = rows(p.x, r, n);
    for (size_t l = 0; l < flats.size(); ++l) outs.push_back(h = fsdp::sharded_forward(comm, flats[l], kLayers[l], h));
    (r == 1 ? rank1_loss(outs) : torch::mse_loss(h, rows(p.y, r, n))).backward();
  }
}

}  // namespace

TEST_CASE("[step3] a rank whose loss skips a layer: the same error on every rank, naming each rank's call") {
  const Problem p = make_problem();
  // Rank 1's loss reads layer 1's output: its backward starts at layer 1 while rank 0's starts at layer 2 (56
  // elements). Both are in an agreement: every rank fails at once, no further call needed.
  check_fails_on_every_rank(
      2, [&](dist::Comm& comm) { train_skipping(comm, p, 1, [](const auto& outs) { return outs[1].sum(); }); },
      "the ranks disagree on the layer they are about to gather (rank 0: the backward of a layer of 56 elements");
  // Rank 1's loss uses none of the layers: its next forward (layer 0, 135 elements) meets rank 0's backward.
  const torch::Tensor other = torch::ones({1}, torch::requires_grad());
  check_fails_on_every_rank(
      2, [&](dist::Comm& comm) { train_skipping(comm, p, 2, [&](const auto&) { return other.sum(); }); },
      "rank 1: the forward of a layer of 135 elements");
}

TEST_CASE("[step3] bad arguments or another model on one rank only: refused on every rank, by name") {
  const Problem p = make_problem();
  // Rank 1's shard does not require grad.
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        fsdp::FlatParam flat = fsdp::flatten_and_shard(p.layers[0], comm.rank(), 2);
        if (comm.rank() == 1) flat.shard = flat.shard.detach();
        fsdp::sharded_forward(comm, flat, kLayers[0], rows(p.x, comm.rank(), 2));
      },
      "on rank 1: the layer's shard must be a leaf that requires grad");
  // Rank 1's FlatParam was made for 3 ranks.
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        fsdp::FlatParam flat = fsdp::flatten_and_shard(p.layers[0], comm.rank(), comm.rank() == 1 ? 3 : 2);
        fsdp::sharded_forward(comm, flat, kLayers[0], rows(p.x, comm.rank(), 2));
      },
      "on rank 1: the FlatParam was made for rank 1 of 3");
  // Rank 1 holds rank 0's FlatParam: the same world size and shapes, only its rank tells.
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        fsdp::FlatParam flat = fsdp::flatten_and_shard(p.layers[0], 0, 2);
        fsdp::sharded_forward(comm, flat, kLayers[0], rows(p.x, comm.rank(), 2));
      },
      "on rank 1: the FlatParam was made for rank 0 of 2, but this is rank 1 of 2");
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
        torch::Tensor h = rows(p.x, r, 2);
        for (size_t l = 0; l < 3; ++l) h = fsdp::sharded_forward(comm, flats[l], kLayers[l], h);
      },
      "the ranks disagree on the layer they are about to gather");
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
    std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
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

TEST_CASE("[step3] two backwards before one step accumulate the full batch's gradient (micro-batches)") {
  const Problem p = make_problem();
  for (const int n : {2, 3}) {
    std::vector<std::vector<torch::Tensor>> got(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const int r = comm.rank();
      std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
      for (int m = 0; m < 2; ++m) {  // each micro-batch is half the rank's rows: its loss counts half
        torch::Tensor h = micro_rows(p.x, r, n, m, 2);
        for (size_t l = 0; l < flats.size(); ++l) h = fsdp::sharded_forward(comm, flats[l], kLayers[l], h);
        (torch::mse_loss(h, micro_rows(p.y, r, n, m, 2)) / 2).backward();
      }
      for (const auto& flat : flats) got[static_cast<size_t>(r)].push_back(flat.shard.grad());
    });
    check_full_batch_grads(got, full_batch_flat_grads(p, n), 1e-6);
  }
}

TEST_CASE("[step3] parameters straight from torch::nn modules (they require grad): shard, train, gather back") {
  const Problem p = make_problem();
  const std::vector<torch::Tensor> reference = full_batch(p, Opt::kSgd, 3);
  const int n = 2;
  std::vector<std::vector<torch::Tensor>> got(static_cast<size_t>(n));
  dist::run_ranks(launch(n), [&](dist::Comm& comm) {
    const int r = comm.rank();
    std::vector<fsdp::FlatParam> flats;
    for (const auto& init : p.layers) {
      // make_problem's initial values copied in: the ranks are threads sharing one CPU generator, so seeding it
      // again here would race with the other rank's draws (seen on LibTorch 2.6).
      torch::nn::Linear layer(init[0].size(1), init[0].size(0));
      {
        torch::NoGradGuard no_grad;
        layer->weight.copy_(init[0]);
        layer->bias.copy_(init[1]);
      }
      REQUIRE(layer->weight.requires_grad());
      flats.push_back(fsdp::flatten_and_shard(layer->parameters(), r, n));  // weight, bias
      CHECK(flats.back().shard.is_leaf());
      CHECK(flats.back().shard.requires_grad());
      torch::NoGradGuard no_grad;
      for (auto& t : layer->parameters()) t.fill_(-1);  // the module's tensors change: the shard, a copy, does not
    }
    torch::optim::SGD sgd(master_shards(flats), torch::optim::SGDOptions(0.1));
    for (int s = 0; s < 3; ++s) {
      sgd.zero_grad();
      torch::Tensor h = rows(p.x, r, n);
      for (size_t l = 0; l < flats.size(); ++l) h = fsdp::sharded_forward(comm, flats[l], kLayers[l], h);
      torch::mse_loss(h, rows(p.y, r, n)).backward();
      sgd.step();
    }
    got[static_cast<size_t>(r)] = gathered_params(comm, flats);
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(rel_error(got[static_cast<size_t>(r)], reference) <= 1e-6);
  }
}
