// Lesson 7 demo: what a rank sends, by counting. N = 2 ranks (threads of this process, each with its own Gloo
// group over loopback, as lesson 5's checks start them):
//   * one payload of B bytes: Gloo's all-reduce (lesson 5) beside our ring reduce-scatter + all-gather (step 1),
//     the bytes each rank sent as the communicator counted them, and the time (median of rank 0's runs).
//
//   bazel run //lesson7_fsdp:demo -- --quick        (reference solution)
//   bazel run //lesson7_fsdp:my_demo -- --quick     (your fsdp.cc)
#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "common/device.h"
#include "common/report.h"
#include "lesson5_distributed/comm.h"
#include "lesson7_fsdp/fsdp.h"

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

}  // namespace

int main(int argc, char** argv) {
  workshop::Flags flags(argc, argv,
                        {{"device", "cpu (default; the rings run on Gloo, CPU tensors)"},
                         {"quick", "small, fast settings for a CPU"},
                         {"csv_dir", "write the table and the summary line as CSV into this folder"}});
  const bool quick = flags.has("quick");
  const c10::Device device = workshop::parse_device(flags.get("device", "cpu"));
  if (!device.is_cpu()) std::cout << "(the rings run on Gloo: CPU tensors, whatever --device says)\n";
  const std::string csv_dir = flags.get("csv_dir", "");
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
  const std::string path = table.emit(csv_dir);
  if (!path.empty()) std::cout << "wrote " << path << "\n";
  workshop::append_summary(csv_dir, {{"7 fsdp", "all-reduce of one payload: Gloo vs our two rings (ms)",
                                      all_reduce.median_ms, rings.median_ms, workshop::device_name(c10::kCPU)}});
  return 0;
}
