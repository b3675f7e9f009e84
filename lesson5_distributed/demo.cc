// Lesson 5 demo: N ranks on this machine, started as separate processes (torchrun-style, a TCPStore on
// 127.0.0.1), train the same MLP on equal shards of one batch four ways and print, side by side: collectives
// and bytes per step, the ring all-reduce napkin math, the per-step time, the optimizer-state bytes per rank
// (lesson 4's meter, in each rank's own process) and how far the parameters end up from the first variant.
//
//   bazel run //lesson5_distributed:demo -- --world_size=4            (reference solution)
//   bazel run //lesson5_distributed:my_demo -- --quick                 (your ddp.cc)
//   bazel run //lesson5_distributed:demo -- --quick --csv_dir=/tmp/out
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>

#include "common/device.h"
#include "common/report.h"
#include "lesson5_distributed/demo_ranks.h"

namespace {

std::string scientific(double value) {
  std::ostringstream out;
  out << std::scientific << std::setprecision(2) << value;
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  const int child = l5demo::maybe_run_as_rank(argc, argv);  // a rank started by the parent below
  if (child >= 0) return child;
  try {
    workshop::Flags flags(argc, argv,
                          {{"device", "cpu (default); the ranks always run with Gloo on the CPU"},
                           {"quick", "small, fast settings for a CPU"},
                           {"world_size", "ranks to start (default 4; --quick: 2)"},
                           {"fault_exit_rank", "a fault drill: this rank exits right after joining; the others must "
                                               "fail with a clear error, and the demo exits 1"},
                           {"csv_dir", "write the table and the summary line as CSV into this folder"}});
    const bool quick = flags.has("quick");
    const std::string device = flags.get("device", "cpu");
    const std::string where = workshop::device_name(c10::Device(c10::kCPU)) + ", Gloo over loopback";
    workshop::parse_device(device);  // a clear error for a device that is not there
    if (device != "cpu") {
      std::cout << "note: --device=" << device << ": the ranks still run with Gloo on the CPU (NCCL needs one GPU "
                << "per rank; this demo does not start NCCL ranks)\n";
    }
    const int world_size = static_cast<int>(flags.get_int("world_size", quick ? 2 : 4));
    TORCH_CHECK(world_size >= 1 && world_size <= 16, "--world_size must be in 1 .. 16, got ", world_size);
    const std::string csv_dir = flags.get("csv_dir", "");
    const l5demo::Config config = l5demo::config_for(quick, world_size);
    TORCH_CHECK(config.batch % world_size == 0, "--world_size=", world_size, ": the batch of ", config.batch,
                " items does not divide evenly into the ranks");
    const double param_bytes = 4.0 * config.depth * (config.width * config.width + config.width);

    std::cout << "Lesson 5 — data parallel on " << world_size << " ranks (processes, Gloo over 127.0.0.1) on "
              << workshop::device_name(c10::Device(c10::kCPU)) << "\n"
              << "MLP " << config.depth << " x Linear(" << config.width << ", " << config.width << "): "
              << 2 * config.depth << " parameters, " << workshop::mib(param_bytes) << "; batch " << config.batch
              << " (" << config.batch / world_size << " per rank), Adam, bucket budget "
              << workshop::mib(static_cast<double>(config.bucket_bytes)) << ", " << config.steps
              << " timed steps per row\n\n";

    double probe_ms = 0;
    int64_t probe_bytes = 0;
    const std::vector<l5demo::Result> results =
        l5demo::launch(config, quick, std::chrono::seconds(600), &probe_ms, &probe_bytes,
                       static_cast<int>(flags.get_int("fault_exit_rank", -1)));

    // [demo_table]
    workshop::Table table("lesson5_distributed",
                          {"variant", "ranks", "collectives / step", "payload MiB / step", "napkin MiB sent / rank",
                           "step ms (median)", "optimizer state bytes / rank", "max rel diff vs per-parameter"});
    for (const auto& r : results) {
      table.add({r.variant, std::to_string(world_size), std::to_string(r.collectives_per_step),
                 workshop::fixed(r.payload_bytes_per_step / (1024.0 * 1024.0), 3),
                 workshop::fixed(r.napkin_bytes_per_step / (1024.0 * 1024.0), 3), workshop::fixed(r.median_ms, 2),
                 std::to_string(r.optimizer_state_bytes), scientific(r.rel_diff)});
    }
    // [demo_table]
    const std::string path = table.emit(csv_dir);
    if (!path.empty()) std::cout << "wrote " << path << "\n";
    const double wire = dist::ring_allreduce_wire_bytes(static_cast<double>(probe_bytes), world_size);
    std::cout << "\nLoopback ceiling (one " << workshop::mib(static_cast<double>(probe_bytes)) << " all-reduce): "
              << workshop::fixed(probe_ms, 2) << " ms, " << workshop::fixed(wire / (probe_ms * 1e-3) / 1e9, 2)
              << " GB/s sent per rank by the ring napkin math.\n";
    const l5demo::Result& per_param = results.front();
    const l5demo::Result& zero = results.back();
    std::cout << "Buckets cut the calls from " << per_param.collectives_per_step << " to "
              << results[1].collectives_per_step << " per step for the same bytes; ZeRO-1 holds "
              << zero.optimizer_state_bytes << " of " << results[1].optimizer_state_bytes
              << " optimizer-state bytes per rank (1/" << world_size << ").\n";
    workshop::append_summary(csv_dir, {{"5 data parallel", "all-reduce calls / step, per-parameter vs bucketed",
                                        static_cast<double>(per_param.collectives_per_step),
                                        static_cast<double>(results[1].collectives_per_step), where},
                                       {"5 data parallel", "step time (ms), per-parameter vs bucketed + overlap",
                                        per_param.median_ms, results[2].median_ms, where},
                                       {"5 data parallel", "optimizer state bytes / rank, plain vs ZeRO-1",
                                        static_cast<double>(results[1].optimizer_state_bytes),
                                        static_cast<double>(zero.optimizer_state_bytes), where}});
    return 0;
  } catch (const c10::Error& error) {
    std::cerr << "error: " << error.what_without_backtrace() << "\n";
    return 1;
  }
}
