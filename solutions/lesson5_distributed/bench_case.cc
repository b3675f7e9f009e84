// Lesson 5's bench case: data-parallel training on N ranks, which are processes of this binary (demo_ranks.h)
// meeting over Gloo on loopback. Rows: per-parameter all-reduce, bucketed, bucketed + overlap, ZeRO-1, for each
// world size; the loopback ceiling is one large all-reduce timed in the same run. Beside them, PyTorch's own
// DistributedDataParallel (gloo, the same bucket cap) and ZeroRedundancyOptimizer on the same model, world size,
// seeds and thread count (bench/peer.py "l5", which spawns its own N processes).
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include "bench/harness.h"
#include "bench/registry.h"
#include "common/report.h"
#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/demo_ranks.h"

namespace bench {

using workshop::fixed;

namespace {

// The peer's key for our variant, "" where PyTorch has no counterpart of its own (the per-parameter and the
// bucketed-after-backward loops are this lesson's steps; DDP always overlaps).
std::string peer_key(const std::string& variant, int n) {
  const std::string prefix = "l5.n" + std::to_string(n) + ".";
  if (variant == "bucketed + overlap") return prefix + "ddp";
  if (variant.rfind("ZeRO-1", 0) == 0) return prefix + "zero";
  return "";
}

// Sets an environment variable for the lifetime of this object (the rank processes inherit it), then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// --world_sizes: the numbers of ranks, each >= 1.
std::vector<int> parse_world_sizes(const std::string& text) {
  std::vector<int> sizes;
  std::stringstream list(text);
  for (std::string item; std::getline(list, item, ',');) {
    const int n = std::atoi(item.c_str());
    TORCH_CHECK(n >= 1, "--world_sizes: '", item, "' is not a number of ranks >= 1");
    sizes.push_back(n);
  }
  return sizes;
}

const CaseFlag world_sizes_flag("world_sizes", "data parallel (l5): ranks, comma-separated (default 2,4; --quick: 2)",
                                [](const std::string& text) { parse_world_sizes(text); });

}  // namespace

int lesson5_rank(int argc, char** argv) { return l5demo::maybe_run_as_rank(argc, argv); }

void lesson5(Context& c) {
  // The ranks are fresh processes: they get this process's intra-op thread count through OMP_NUM_THREADS (which
  // LibTorch's default reads), and the peer's ranks the same number through torch.set_num_threads.
  const int threads = at::get_num_threads();
  const ScopedEnv omp("OMP_NUM_THREADS", std::to_string(threads));
  std::vector<std::string> worlds;
  l5demo::Config config;
  for (int n : parse_world_sizes(c.flag("world_sizes", c.quick ? "2" : "2,4"))) {
    config = l5demo::config_for(c.quick, n);
    std::cout << "lesson 5: " << n << " ranks, MLP " << config.depth << " x " << config.width << ", batch "
              << config.batch << ", bucket budget " << workshop::mib(static_cast<double>(config.bucket_bytes)) << ", "
              << threads << " thread(s) per rank" << std::endl;
    double probe_ms = 0;
    int64_t probe_bytes = 0;
    const std::vector<l5demo::Result> results =
        l5demo::launch(config, c.quick, std::chrono::seconds(600), &probe_ms, &probe_bytes);
    const double ceiling = dist::ring_allreduce_wire_bytes(static_cast<double>(probe_bytes), n) / (probe_ms * 1e-3);
    c.ceiling_rows.push_back(
        {"all-reduce over loopback, " + std::to_string(n) + " ranks (Gloo, ring napkin bytes sent per rank)", ceiling,
         "GB/s", "1 (median of 5)"});
    const double base_ms = results.front().median_ms;
    // Forward + backward of one rank's share: 6 FLOPs per item per weight (the GFLOP/s column is per rank).
    const double flops_per_rank = 6.0 * (config.batch / n) * config.depth * config.width * config.width;
    for (const auto& r : results) {
      workshop::Timing t{r.median_ms, r.min_ms, r.max_ms, {}};
      // If the whole step were communication at the loopback ceiling, how long would the napkin bytes take?
      const double comm_floor_ms = r.napkin_bytes_per_step / ceiling * 1e3;
      c.rows.push_back(Row{"lesson 5: data parallel (N=" + std::to_string(n) + ")", r.variant, t, flops_per_rank,
                           r.napkin_bytes_per_step, "", base_ms / r.median_ms,
                           std::to_string(r.collectives_per_step) + " calls/step, payload " +
                               workshop::mib(r.payload_bytes_per_step) + ", napkin " +
                               workshop::mib(r.napkin_bytes_per_step) + " sent/rank (" + fixed(comm_floor_ms, 2) +
                               " ms at the loopback ceiling); optimizer state " +
                               workshop::mib(static_cast<double>(r.optimizer_state_bytes)) + "/rank",
                           peer_key(r.variant, n), /*same_way_peak=*/-1});
    }
    worlds.push_back(std::to_string(n));
  }
  if (worlds.empty()) return;
  // Every world size has the same sizes but for the ranks (config_for); the peer runs them all in one call.
  c.peer->run("l5", "worlds=" + join(worlds, "+") + ",width=" + std::to_string(config.width) +
                        ",depth=" + std::to_string(config.depth) + ",batch=" + std::to_string(config.batch) +
                        ",bucket_bytes=" + std::to_string(config.bucket_bytes) +
                        ",steps=" + std::to_string(config.steps) + ",threads=" + std::to_string(threads) +
                        ",timeout=" + std::string(c.quick ? "180" : "600"));
  c.notes.push_back(
      "Lesson 5: PyTorch's side is DistributedDataParallel (gloo, bucket_cap_mb = our bucket budget, which "
      "overlaps by default: beside our \"bucketed + overlap\") and DDP + ZeroRedundancyOptimizer(Adam) beside our "
      "ZeRO-1; the same MLP, seeds, shards, Adam(1e-3), one warm-up step, then timed steps each after a barrier, "
      "rank 0's median. Its call counts come from an extra, untimed step with a counting comm hook (DDP's "
      "all-reduces) and counting wrappers of torch.distributed.broadcast / all_gather (ZeRO's). DDP caps its "
      "first bucket separately (dist._DEFAULT_FIRST_BUCKET_BYTES, 1 MiB): the peer sets it to the same budget. "
      "DDP orders its buckets by the first backward's gradient order, ours fills them in reverse parameter order. "
      "Lesson 5 runs once per world size, whatever --rounds.");
}

namespace {
// once: each run relaunches its rank processes.
const Registered registered(5, Case{"l5", lesson5, /*once=*/true, nullptr, lesson5_rank});
}  // namespace

}  // namespace bench
