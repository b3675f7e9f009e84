// Lesson 7's bench case, a small honest one: on 2 ranks (threads of the bench, each with its own Gloo group over
// loopback), Gloo's all-reduce of B bytes beside step 1's ring reduce-scatter + ring all-gather of the same B
// (what an all-reduce is made of). Rank 0's times; the bytes column is what each rank sends: napkin
// 2 (N - 1) / N x B for Gloo's algorithm, counted by the communicator for the rings. The rings have no PyTorch
// peer: Gloo in LibTorch 1.13 has no reduce-scatter, and 2.x's is an all-reduce then a chunk.
//
// Then one training step of the demo's model (lesson7_fsdp/demo.cc: 4 x Linear(width, width) + tanh from seed 3,
// data from seed 4, Adam(1e-3), each rank its slice of the items) on ShardedStack with prefetch (steps 2 to 4),
// beside PyTorch's FullyShardedDataParallel (FULL_SHARD, gloo) on the same model, seeds and ranks (bench/peer.py
// "l7", which spawns its own rank processes). Where the installed PyTorch cannot run FSDP on the CPU, the peer's
// cell says what failed.
#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <vector>

#include <torch/torch.h>

#include "bench/harness.h"
#include "bench/registry.h"
#include "common/device.h"
#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/ddp.h"
#include "lesson7_fsdp/fsdp.h"

namespace {

constexpr int kRanks = 2;

workshop::Timing time_on_ranks(int repeats, const std::function<void(dist::Comm&)>& op) {
  workshop::Timing timing{};
  dist::LaunchOptions options;
  options.world_size = kRanks;
  options.timeout = std::chrono::seconds(60);
  dist::run_ranks(options, [&](dist::Comm& comm) {
    op(comm);  // warm-up
    std::vector<double> ms;
    for (int i = 0; i < repeats; ++i) {
      comm.barrier();
      const auto start = std::chrono::steady_clock::now();
      op(comm);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    if (comm.rank() == 0) {
      timing.samples_ms = ms;
      timing.median_ms = workshop::median(ms);
      timing.min_ms = *std::min_element(ms.begin(), ms.end());
      timing.max_ms = *std::max_element(ms.begin(), ms.end());
    }
  });
  return timing;
}

// Rank 0's figures for one sharded training step.
struct ShardedFigures {
  workshop::Timing timing{};
  int64_t kept = 0;  // parameters (shards), their gradients, Adam's two moments: what stays between steps
  int64_t sent = 0;  // counted by the communicator, one step
};

// The demo's model and data, trained with ShardedStack (prefetch on): one untimed step, then `steps` steps each
// after a barrier (forward, backward, finish(), Adam's step), as the peer times FSDP's.
ShardedFigures sharded_training(int layers, int64_t width, int64_t items, int steps) {
  torch::manual_seed(3);
  std::vector<std::vector<at::Tensor>> init;
  for (int l = 0; l < layers; ++l) {
    torch::nn::Linear layer(width, width);
    init.push_back({layer->weight.detach().clone(), layer->bias.detach().clone()});
  }
  torch::manual_seed(4);
  const at::Tensor x = torch::randn({items, width}), y = torch::randn({items, width});
  ShardedFigures out;
  dist::LaunchOptions options;
  options.world_size = kRanks;
  options.timeout = std::chrono::seconds(60);
  dist::run_ranks(options, [&](dist::Comm& comm) {
    const int r = comm.rank(), n = comm.world_size();
    const at::Tensor xr = x.narrow(0, r * items / n, items / n), yr = y.narrow(0, r * items / n, items / n);
    std::vector<fsdp::FlatParam> flats;
    std::vector<at::Tensor> shards;
    for (const auto& layer : init) flats.push_back(fsdp::flatten_and_shard(layer, r, n));
    for (const auto& flat : flats) shards.push_back(flat.shard);
    torch::optim::Adam adam(shards, torch::optim::AdamOptions(1e-3));
    const fsdp::LayerFn fn = [](const at::Tensor& h, const std::vector<at::Tensor>& p) {
      return torch::tanh(torch::nn::functional::linear(h, p[0], p[1]));
    };
    fsdp::ShardedStack stack(comm, flats, std::vector<fsdp::LayerFn>(static_cast<size_t>(layers), fn), true);
    const auto step = [&] {
      adam.zero_grad();
      torch::mse_loss(stack.forward(xr), yr).backward();
      stack.finish();
      adam.step();
    };
    step();  // warm-up: Adam's state
    std::vector<double> ms;
    int64_t sent = 0;
    for (int s = 0; s < steps; ++s) {
      comm.barrier();
      comm.reset_stats();
      const auto start = std::chrono::steady_clock::now();
      step();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      sent = comm.stats().send_bytes;
    }
    if (r == 0) {
      int64_t kept = 0;
      for (const auto& p : shards) {
        kept += static_cast<int64_t>(p.nbytes());
        if (p.grad().defined()) kept += static_cast<int64_t>(p.grad().nbytes());
      }
      kept += ddp::optimizer_state_bytes(adam);
      out.kept = kept;
      out.sent = sent;
      out.timing.samples_ms = ms;
      out.timing.median_ms = workshop::median(ms);
      out.timing.min_ms = *std::min_element(ms.begin(), ms.end());
      out.timing.max_ms = *std::max_element(ms.begin(), ms.end());
    }
  });
  return out;
}

void lesson7_case(bench::Context& c) {
  const int64_t elements = c.quick ? (int64_t{1} << 16) : (int64_t{1} << 22);
  const int repeats = c.quick ? 5 : 20;
  std::cout << "lesson 7: all-reduce vs ring reduce-scatter + all-gather, " << elements << " floats, " << kRanks
            << " ranks (CPU, Gloo)" << std::endl;
  const double payload = 4.0 * static_cast<double>(elements);
  const auto gloo = time_on_ranks(repeats, [&](dist::Comm& comm) {
    at::Tensor x = at::ones({elements});
    comm.all_reduce(x);
  });
  const auto rings = time_on_ranks(repeats, [&](dist::Comm& comm) {
    at::Tensor shard = at::empty({elements / kRanks});
    fsdp::reduce_scatter_into(comm, at::ones({elements}), shard);
    fsdp::all_gather_into(comm, shard, at::empty({elements}));
  });
  const double sent = dist::ring_allreduce_wire_bytes(payload, kRanks);
  const std::string bench = "lesson 7: Fully sharded data parallel";
  c.rows.push_back(bench::Row{bench, "Gloo all_reduce", gloo, 0, sent, "", 1.0, "bytes: napkin", "", -1});
  c.rows.push_back(bench::Row{bench, "ring reduce_scatter + all_gather", rings, 0, sent, "",
                              gloo.median_ms / rings.median_ms, "bytes: counted, the same", "", -1});

  // The demo's sizes (lesson7_fsdp/demo.cc).
  const int layers = 4, steps = c.quick ? 3 : 10;
  const int64_t width = c.quick ? 128 : 512, items = 64;
  const int threads = at::get_num_threads();
  std::cout << "lesson 7: one training step, " << layers << " x Linear(" << width << ", " << width << ") + tanh, Adam, "
            << items << " items over " << kRanks << " ranks" << std::endl;
  const ShardedFigures sharded = sharded_training(layers, width, items, steps);
  // A benchmark of its own: its speed-up column is against itself, not against the collectives above.
  c.rows.push_back(bench::Row{bench + ", one training step", "ShardedStack, prefetch (steps 2-4)", sharded.timing, 0,
                              static_cast<double>(sharded.sent), "", 1.0,
                              std::to_string(sharded.kept) +
                                  " bytes kept on rank 0 (shards, their gradients, Adam's moments); bytes: counted",
                              "l7.fsdp", -1});
  c.peer->run("l7", "ranks=" + std::to_string(kRanks) + ",layers=" + std::to_string(layers) + ",width=" +
                        std::to_string(width) + ",items=" + std::to_string(items) + ",steps=" + std::to_string(steps) +
                        ",threads=" + std::to_string(threads) + ",timeout=" + std::string(c.quick ? "180" : "600"));
  c.notes.push_back(
      "Lesson 7: PyTorch's side is FullyShardedDataParallel(FULL_SHARD) on gloo, one unit per Linear inside a root "
      "unit, beside our ShardedStack with prefetch; the demo's model, seeds and slices, Adam(1e-3), one warm-up step, "
      "then timed steps each after a barrier, rank 0's median. Our ranks are threads of the bench; PyTorch's are "
      "spawned processes. Where the installed PyTorch cannot run FSDP on the CPU, its cell names what failed.");
}

const bench::Registered registered(7, bench::Case{"l7", lesson7_case});

}  // namespace
