// Lesson 7 demo: what a rank sends, by counting. By default N = 2 ranks (threads of this process, each with its own
// Gloo group over loopback, as lesson 5's checks start them):
//   * one payload of B bytes: Gloo's all-reduce (lesson 5) beside our ring reduce-scatter + all-gather (step 1),
//     the bytes each rank sent as the communicator counted them, and the time (median of rank 0's runs);
//   * one training step of an MLP with Adam, DDP-style (replicated parameters, one all-reduce of the gradients)
//     beside fully sharded (steps 2 and 3): the bytes each rank keeps between steps (parameters, gradients,
//     Adam's two moments, read from the tensors themselves) and the bytes it sends per step, and the step time;
//     the sharded step once layer by layer (step 3) and once with the next layer's gather prefetched (step 4).
//
//   bazel run //lesson7_fsdp:demo -- --quick        (reference solution)
//   bazel run //lesson7_fsdp:my_demo -- --quick     (your fsdp.cc)
//   bazel run //lesson7_fsdp:demo -- --quick --device=cpu --csv_dir=/tmp/out   (as the docs site runs it)
//
// The other modes, one file each (demo_parts.h lists them): --world_size=N starts N ranks as processes, on loopback
// or on shaped links (demo_processes.cc opens with those command lines); --what_fits prints step 7's table
// (demo_what_fits.cc).
#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <torch/version.h>

#include "common/demo.h"
#include "common/device.h"
#include "common/report.h"
#include "lesson5_distributed/comm.h"
#include "lesson7_fsdp/demo_parts.h"
#include "lesson7_fsdp/fsdp.h"

namespace {

using l7demo::Mode;
using l7demo::StepFigures;

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

// `steps` steps on 2 ranks (threads) of `items` items in all; rank 0's figures.
StepFigures train(Mode mode, int layers, int64_t width, int64_t items, int steps) {
  StepFigures out;
  const auto init = l7demo::make_layers(layers, width);
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({items, width}), y = torch::randn({items, width});
  dist::run_ranks(launch(), [&](dist::Comm& comm) {
    const int r = comm.rank(), n = comm.world_size();
    const StepFigures mine = l7demo::train_rank(comm, mode, init, x.narrow(0, r * items / n, items / n),
                                                y.narrow(0, r * items / n, items / n), steps);
    if (r == 0) out = mine;
  });
  return out;
}

// --what_fits and --world_size go to their files; the default mode: the rings on one payload, then one training
// step three ways.
int run(const workshop::Demo& demo) {
  if (!demo.device.is_cpu()) std::cout << "(the rings run on Gloo: CPU tensors, whatever --device says)\n";
  if (demo.flags.has("what_fits")) {
    l7demo::print_what_fits(demo.csv_dir);
    return 0;
  }
  if (demo.flags.has("world_size")) return l7demo::run_processes(demo);
  const bool quick = demo.quick;
  const std::string& csv_dir = demo.csv_dir;
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
  // Step 1's reduce-scatter alone, beside the group's own: LibTorch 2.x's Gloo all-reduces a copy and keeps its
  // chunk; 1.13's Gloo has none (the row says so).
  const Measured ring_rs = measure(repeats, [&](dist::Comm& comm) {
    at::Tensor shard = at::empty({elements / kRanks});
    fsdp::reduce_scatter_into(comm, at::ones({elements}), shard);
  });
  std::string group_rs_ms = "none";
  std::string group_rs_how = "napkin 2(N-1)/N x B (an all-reduce inside)";
  try {
    group_rs_ms =
        workshop::fixed(measure(repeats,
                                [&](dist::Comm& comm) {
                                  comm.group_reduce_scatter(at::empty({elements / kRanks}), at::ones({elements}));
                                })
                            .median_ms,
                        3);
  } catch (const c10::Error& error) {
    const std::string what = error.what();
    group_rs_how = "LibTorch " TORCH_VERSION ": " + (what.find("does not support") != std::string::npos
                                                         ? std::string("Gloo has none")
                                                         : what.substr(0, what.find('\n')));
  }
  workshop::Table table("lesson7_fsdp_rings", {"operation on " + workshop::mib(payload), "bytes sent per rank",
                                               "how counted", "ms (median, rank 0)"});
  table.add({"Gloo all_reduce", std::to_string(static_cast<int64_t>(dist::ring_allreduce_wire_bytes(payload, kRanks))),
             "napkin 2(N-1)/N x B", workshop::fixed(all_reduce.median_ms, 3)});
  table.add({"ring reduce_scatter + all_gather (step 1)", std::to_string(rings.sent_bytes), "counted",
             workshop::fixed(rings.median_ms, 3)});
  table.add({"ring reduce_scatter (step 1)", std::to_string(ring_rs.sent_bytes), "counted",
             workshop::fixed(ring_rs.median_ms, 3)});
  table.add({"the group's own reduce_scatter (c10d)",
             group_rs_ms == "none"
                 ? "-"
                 : std::to_string(static_cast<int64_t>(dist::ring_allreduce_wire_bytes(payload, kRanks))),
             group_rs_how, group_rs_ms});
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

}  // namespace

int main(int argc, char** argv) {
  const int child = l7demo::run_as_rank(argc, argv);  // a rank started by --world_size (demo_ranks.cc)
  if (child >= 0) return child;
  workshop::FlagHelp flags = l7demo::process_flags();
  flags.emplace("what_fits", "print step 7's table (what fits on 8 to 64 H200s) and stop");
  return workshop::demo_main(
      argc, argv,
      workshop::DemoOptions("Lesson 7 demo: the bytes a rank keeps and sends, DDP-style beside fully sharded, on 2 "
                            "ranks as threads; --world_size=N: the step four ways on N ranks as processes; "
                            "--what_fits: step 7's table.")
          .device("cpu")
          .device_help("cpu (default; the rings run on Gloo, CPU tensors)")
          .flags(flags),
      run);
}
