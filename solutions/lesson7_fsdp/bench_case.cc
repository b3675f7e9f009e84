// Lesson 7's bench case, a small honest one: on 2 ranks (threads of the bench, each with its own Gloo group over
// loopback), Gloo's all-reduce of B bytes beside step 1's ring reduce-scatter + ring all-gather of the same B
// (what an all-reduce is made of). Rank 0's times; the bytes column is what each rank sends: napkin
// 2 (N - 1) / N x B for Gloo's algorithm, counted by the communicator for the rings. No PyTorch peer: Gloo in
// LibTorch 1.13 has no reduce-scatter, and 2.x's is an all-reduce then a chunk.
#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <vector>

#include <ATen/ATen.h>

#include "bench/harness.h"
#include "bench/registry.h"
#include "common/device.h"
#include "lesson5_distributed/comm.h"
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
}

const bench::Registered registered(7, bench::Case{"l7", lesson7_case});

}  // namespace
