// Lesson 7 demo: what a rank sends, by counting. N = 2 ranks (threads of this process, each with its own Gloo
// group over loopback, as lesson 5's checks start them):
//   * one payload of B bytes: Gloo's all-reduce (lesson 5) beside our ring reduce-scatter + all-gather (step 1),
//     the bytes each rank sent as the communicator counted them, and the time (median of rank 0's runs);
//   * one training step of an MLP with Adam, DDP-style (replicated parameters, one all-reduce of the gradients)
//     beside fully sharded (steps 2 and 3): the bytes each rank keeps between steps (parameters, gradients,
//     Adam's two moments, read from the tensors themselves) and the bytes it sends per step, and the step time;
//     the sharded step once layer by layer (step 3) and once with the next layer's gather prefetched (step 4).
//
//   bazel run //lesson7_fsdp:demo -- --quick        (reference solution)
//   bazel run //lesson7_fsdp:my_demo -- --quick     (your fsdp.cc)
//
// With --what_fits it prints step 7's table instead (what_fits.h: arithmetic, nothing runs) and stops.
#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/device.h"
#include "common/report.h"
#include "lesson5_distributed/comm.h"
#include "lesson7_fsdp/fsdp.h"
#include "lesson7_fsdp/what_fits.h"

namespace {

constexpr int kRanks = 2;

dist::LaunchOptions launch() {
  dist::LaunchOptions options;
  options.world_size = kRanks;
  options.timeout = std::chrono::seconds(60);
  return options;
}

// Rank 0's median time of `repeats` runs of `op` and the bytes rank 0 sent in one run.
struct Measured {
  double median_ms = 0;
  int64_t sent_bytes = 0;
};

Measured measure(int repeats, const std::function<void(dist::Comm&)>& op) {
  Measured out;
  dist::run_ranks(launch(), [&](dist::Comm& comm) {
    op(comm);  // warm-up (Gloo's first call on a pair sets it up)
    comm.barrier();
    comm.reset_stats();
    op(comm);
    const dist::CommStats once = comm.stats();
    std::vector<double> ms;
    for (int i = 0; i < repeats; ++i) {
      comm.barrier();
      const auto start = std::chrono::steady_clock::now();
      op(comm);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    if (comm.rank() == 0) {
      out.median_ms = workshop::median(ms);
      out.sent_bytes = once.send_bytes;
    }
  });
  return out;
}

// The model: `layers` square Linear layers of `width` with tanh between; every rank gets the same initial values.
std::vector<std::vector<torch::Tensor>> make_layers(int layers, int64_t width) {
  torch::manual_seed(3);
  std::vector<std::vector<torch::Tensor>> out;
  for (int l = 0; l < layers; ++l) {
    torch::nn::Linear layer(width, width);
    out.push_back({layer->weight.detach().clone(), layer->bias.detach().clone()});
  }
  return out;
}

torch::Tensor layer_fn(const torch::Tensor& x, const std::vector<torch::Tensor>& p) {
  return torch::tanh(torch::nn::functional::linear(x, p[0], p[1]));
}

// Bytes of the parameters, their gradients and Adam's state tensors that `params` hold.
int64_t persistent_bytes(const std::vector<torch::Tensor>& params, torch::optim::Adam& adam) {
  int64_t bytes = 0;
  for (const auto& p : params) {
    bytes += static_cast<int64_t>(p.nbytes());
    if (p.grad().defined()) bytes += static_cast<int64_t>(p.grad().nbytes());
  }
  for (const auto& entry : adam.state()) {
    const auto& state = static_cast<const torch::optim::AdamParamState&>(*entry.second);
    bytes += static_cast<int64_t>(state.exp_avg().nbytes() + state.exp_avg_sq().nbytes());
  }
  return bytes;
}

struct StepFigures {
  int64_t persistent = 0;  // rank 0, after the steps
  int64_t sent = 0;        // rank 0, in one step
  double median_ms = 0;    // rank 0
};

enum class Mode { kDdp, kSharded, kPrefetch };

// `steps` steps on each rank's slice of the batch: DDP-style, sharded layer by layer (step 3) or as a stack
// with prefetch (step 4); rank 0's figures.
StepFigures train(Mode mode, int layers, int64_t width, int64_t items, int steps) {
  const bool sharded = mode != Mode::kDdp;
  StepFigures out;
  const auto init = make_layers(layers, width);
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({items, width}), y = torch::randn({items, width});
  dist::run_ranks(launch(), [&](dist::Comm& comm) {
    const int r = comm.rank(), n = comm.world_size();
    const torch::Tensor xr = x.narrow(0, r * items / n, items / n), yr = y.narrow(0, r * items / n, items / n);
    std::vector<std::vector<torch::Tensor>> replicas;  // DDP: every parameter on every rank
    std::vector<fsdp::FlatParam> flats;                // sharded: a slice of each layer's flat buffer
    std::vector<torch::Tensor> params;                 // what the optimizer steps
    for (const auto& layer : init) {
      if (sharded) {
        flats.push_back(fsdp::flatten_and_shard(layer, r, n));
      } else {
        replicas.emplace_back();
        for (const auto& t : layer) replicas.back().push_back(t.clone().requires_grad_(true));
      }
    }
    for (auto& flat : flats) params.push_back(flat.shard);
    for (auto& layer : replicas) params.insert(params.end(), layer.begin(), layer.end());
    torch::optim::Adam adam(params, torch::optim::AdamOptions(1e-3));
    const std::vector<fsdp::LayerFn> fns(static_cast<size_t>(layers), fsdp::LayerFn(layer_fn));
    std::unique_ptr<fsdp::ShardedStack> stack;
    if (mode == Mode::kPrefetch) stack = std::make_unique<fsdp::ShardedStack>(comm, flats, fns, true);
    std::vector<double> ms;
    for (int s = 0; s < steps; ++s) {
      comm.barrier();
      comm.reset_stats();
      const auto start = std::chrono::steady_clock::now();
      adam.zero_grad();
      torch::Tensor h = xr;
      if (stack) h = stack->forward(xr);
      for (int l = 0; l < layers && !stack; ++l) {
        h = sharded ? fsdp::sharded_forward(comm, flats[static_cast<size_t>(l)], fns[static_cast<size_t>(l)], h)
                    : layer_fn(h, replicas[static_cast<size_t>(l)]);
      }
      torch::mse_loss(h, yr).backward();
      if (stack) stack->finish();
      if (!sharded) {  // DDP-style: one all-reduce of every gradient, then the average
        std::vector<torch::Tensor> grads;
        for (const auto& p : params) grads.push_back(p.grad().reshape({-1}));
        torch::Tensor flat = torch::cat(grads);
        comm.all_reduce(flat);
        flat.div_(n);
        int64_t offset = 0;
        for (const auto& p : params) {
          p.grad().copy_(flat.narrow(0, offset, p.numel()).view_as(p));
          offset += p.numel();
        }
      }
      adam.step();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    if (r == 0) {
      out.persistent = persistent_bytes(params, adam);
      const dist::CommStats& stats = comm.stats();
      out.sent =
          sharded
              ? stats.send_bytes
              : static_cast<int64_t>(dist::ring_allreduce_wire_bytes(static_cast<double>(stats.all_reduce_bytes), n));
      out.median_ms = workshop::median(ms);
    }
  });
  return out;
}

// Step 7: what fits on 8 to 64 H200s, one table per model (what_fits.h; arithmetic only).
void print_what_fits(const std::string& csv_dir) {
  const fsdp::Cluster cluster;
  const auto gb = [](double bytes) { return workshop::fixed(bytes / 1e9, 1); };
  std::cout << "Step 7 — what fits: bytes per GPU and napkin communication per step (what_fits.h)\n"
            << "Assumptions: " << cluster.gpu_bytes / 1000000000 << " GB per GPU (H200), " << cluster.gpus_per_node
            << " GPUs per node, NVLink " << workshop::fixed(cluster.nvlink_gigabytes_per_s, 0)
            << " GB/s per GPU and direction inside a node, " << workshop::fixed(cluster.network_gigabits_per_s, 0)
            << " Gb/s per GPU between nodes; Adam in mixed precision, 2 + 2 + 12 bytes per parameter; "
            << "GB = 1e9 bytes.\n";
  for (const fsdp::TransformerShape& shape : fsdp::published_shapes()) {
    const fsdp::ParamCount count = fsdp::count_parameters(shape);
    std::cout << "\n"
              << shape.name << ": " << count.total() << " parameters (" << count.layers << " blocks of "
              << count.per_layer << ", " << count.other << " outside), sequence " << shape.sequence << ", micro-batch "
              << shape.micro_batch << "; activations per GPU "
              << gb(static_cast<double>(fsdp::activation_bytes(shape, false))) << " GB, checkpointed "
              << gb(static_cast<double>(fsdp::activation_bytes(shape, true))) << " GB\n";
    std::string file = shape.name;
    for (char& c : file) c = (c == ' ' || c == '-' || c == '.') ? '_' : c;
    workshop::Table table("lesson7_what_fits_" + file, {"GPUs", "strategy", "state GB", "total GB", "fits",
                                                        "total GB ckpt", "fits ckpt", "sent GB/step", "comm s/step"});
    for (int gpus : {8, 16, 32, 64}) {
      for (fsdp::Strategy strategy : fsdp::all_strategies()) {
        const fsdp::Fit plain = fsdp::what_fits(shape, strategy, gpus, false, cluster);
        const fsdp::Fit ckpt = fsdp::what_fits(shape, strategy, gpus, true, cluster);
        table.add({std::to_string(gpus), fsdp::strategy_name(strategy), gb(static_cast<double>(plain.state.total())),
                   gb(static_cast<double>(plain.total)), plain.fits ? "yes" : "no", gb(static_cast<double>(ckpt.total)),
                   ckpt.fits ? "yes" : "no", gb(static_cast<double>(plain.comm_bytes)),
                   workshop::fixed(plain.comm_s, 3)});
      }
    }
    const std::string path = table.emit(csv_dir);
    if (!path.empty()) std::cout << "wrote " << path << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  workshop::Flags flags(argc, argv,
                        {{"device", "cpu (default; the rings run on Gloo, CPU tensors)"},
                         {"quick", "small, fast settings for a CPU"},
                         {"csv_dir", "write the table and the summary line as CSV into this folder"},
                         {"what_fits", "print step 7's table (what fits on 8 to 64 H200s) and stop"}});
  const bool quick = flags.has("quick");
  const c10::Device device = workshop::parse_device(flags.get("device", "cpu"));
  if (!device.is_cpu()) std::cout << "(the rings run on Gloo: CPU tensors, whatever --device says)\n";
  const std::string csv_dir = flags.get("csv_dir", "");
  if (flags.has("what_fits")) {
    print_what_fits(csv_dir);
    return 0;
  }
  const int repeats = quick ? 5 : 20;
  const int64_t elements = quick ? (int64_t{1} << 16) : (int64_t{1} << 22);
  const double payload = 4.0 * static_cast<double>(elements);

  std::cout << "Lesson 7 — Fully sharded data parallel: " << kRanks << " ranks (threads, Gloo on loopback), "
            << workshop::device_name(c10::Device(c10::kCPU)) << "\n\n";

  // Gloo's all-reduce counts its payload (what it was handed); what its algorithm sends is the napkin's
  // 2 (N - 1) / N x B. Our rings count what they send.
  const Measured all_reduce = measure(repeats, [&](dist::Comm& comm) {
    at::Tensor x = at::ones({elements});
    comm.all_reduce(x);
  });
  const Measured rings = measure(repeats, [&](dist::Comm& comm) {
    const at::Tensor full = at::ones({elements});
    at::Tensor shard = at::empty({elements / kRanks});
    fsdp::reduce_scatter_into(comm, full, shard);
    fsdp::all_gather_into(comm, shard, at::empty({elements}));
  });
  workshop::Table table("lesson7_fsdp_rings", {"operation on " + workshop::mib(payload), "bytes sent per rank",
                                               "how counted", "ms (median, rank 0)"});
  table.add({"Gloo all_reduce", std::to_string(static_cast<int64_t>(dist::ring_allreduce_wire_bytes(payload, kRanks))),
             "napkin 2(N-1)/N x B", workshop::fixed(all_reduce.median_ms, 3)});
  table.add({"ring reduce_scatter + all_gather (step 1)", std::to_string(rings.sent_bytes), "counted",
             workshop::fixed(rings.median_ms, 3)});
  std::string path = table.emit(csv_dir);
  if (!path.empty()) std::cout << "wrote " << path << "\n";

  const int layers = 4;
  const int64_t width = quick ? 128 : 512, items = 64;
  const int steps = quick ? 3 : 10;
  std::cout << "\nOne training step, " << layers << " x Linear(" << width << ", " << width << ") + tanh, Adam, "
            << items << " items split over " << kRanks << " ranks:\n";
  const StepFigures ddp = train(Mode::kDdp, layers, width, items, steps);
  const StepFigures fsdp_step = train(Mode::kSharded, layers, width, items, steps);
  const StepFigures prefetched = train(Mode::kPrefetch, layers, width, items, steps);
  workshop::Table steps_table("lesson7_fsdp_step",
                              {"training", "bytes kept per rank (params, grads, Adam)", "bytes sent per rank per step",
                               "how counted", "step ms (median, rank 0)"});
  steps_table.add({"DDP-style: replicated, one all-reduce", std::to_string(ddp.persistent), std::to_string(ddp.sent),
                   "napkin 2(N-1)/N x payload", workshop::fixed(ddp.median_ms, 3)});
  steps_table.add({"fully sharded (steps 2 and 3)", std::to_string(fsdp_step.persistent),
                   std::to_string(fsdp_step.sent), "counted", workshop::fixed(fsdp_step.median_ms, 3)});
  steps_table.add({"fully sharded + prefetch (step 4)", std::to_string(prefetched.persistent),
                   std::to_string(prefetched.sent), "counted", workshop::fixed(prefetched.median_ms, 3)});
  path = steps_table.emit(csv_dir);
  if (!path.empty()) std::cout << "wrote " << path << "\n";
  std::cout << "kept: DDP / sharded = " << workshop::fixed(static_cast<double>(ddp.persistent) / fsdp_step.persistent)
            << "; sent: sharded / DDP = " << workshop::fixed(static_cast<double>(fsdp_step.sent) / ddp.sent) << "\n";
  workshop::append_summary(csv_dir, {{"7 fsdp", "bytes kept per rank: DDP-style vs fully sharded",
                                      static_cast<double>(ddp.persistent), static_cast<double>(fsdp_step.persistent),
                                      workshop::device_name(c10::kCPU)}});
  return 0;
}
