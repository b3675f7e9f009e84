// Lesson 5 demo: N ranks on this machine, started as separate processes (torchrun-style, a TCPStore on
// 127.0.0.1), train the same MLP on equal shards of one batch four ways and print, side by side: collectives
// and bytes per step, the ring all-reduce napkin math, the per-step time, the optimizer-state bytes per rank
// (lesson 4's meter, in each rank's own process) and how far the parameters end up from the first variant.
//
//   bazel run //lesson5_distributed:demo -- --world_size=4            (reference solution)
//   bazel run //lesson5_distributed:my_demo -- --quick                 (your ddp.cc)
//   bazel run //lesson5_distributed:demo -- --quick --csv_dir=/tmp/out
//   bazel run //lesson5_distributed:demo -- --rounds=3 --sim_delay_ms=0.5   (latency simulated, on loopback)
// On a (simulated) real network, one namespace per rank, as root: lesson5_distributed/netns/netns_run.sh.
#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>

#include "common/demo.h"
#include "common/device.h"
#include "common/report.h"
#include "lesson5_distributed/demo_ranks.h"

namespace {

std::string scientific(double value) {
  std::ostringstream out;
  out << std::scientific << std::setprecision(2) << value;
  return out.str();
}

// The link as the flags describe it: a kernel-shaped rate, a simulated delay per call, a kernel delay per packet.
using LinkFlags = ranks::LinkFlags;

// --netns and --hosts: one network namespace and one address per rank (lesson5_distributed/netns/), or loopback.
l5demo::Network network_from_flags(const workshop::Flags& flags, int world_size) {
  return ranks::network_from(flags.get("netns", ""), flags.get("hosts", ""), world_size);
}

// The napkin table and the rankings (the page shows this body as its snippet demo_napkin_table).
void napkin_tables(const std::vector<l5demo::Result>& results, const l5demo::Extras& extras, const LinkFlags& link,
                   int world_size, double measured_bytes_per_s, const std::string& csv_dir) {
  const double link_gbit = link.gbit, delay_ms = link.delay_ms, link_delay_ms = link.link_delay_ms;
  // [demo_napkin_table]
  // Measured step time next to the napkin figure, per variant, and the ranking of the variants in each round.
  const double bytes_per_s = link_gbit > 0 ? link_gbit * 1e9 / 8 : measured_bytes_per_s;
  const l5demo::CallCost own = l5demo::call_cost(extras, world_size, bytes_per_s);
  std::cout << "\nNapkin math: link " << workshop::fixed(bytes_per_s * 8 / 1e9, 3) << " Gbit/s per rank ("
            << (link_gbit > 0 ? "kernel-shaped rate" : "measured") << "; the large all-reduce measured "
            << workshop::fixed(measured_bytes_per_s * 8 / 1e9, 3) << "), " << workshop::fixed(delay_ms, 3)
            << " ms simulated per call + " << workshop::fixed(link_delay_ms, 3)
            << " ms kernel per step of a collective (2 (N - 1) per all-reduce); "
            << "a call's own cost " << workshop::fixed(own.all_reduce_ms, 3) << " ms per all-reduce, "
            << workshop::fixed(own.broadcast_ms, 3) << " ms per broadcast (bursts of " << l5demo::kBurst << " "
            << workshop::mib(extras.tiny_bytes) << " calls took " << workshop::fixed(extras.reduce_call_ms, 3)
            << " and " << workshop::fixed(extras.bcast_call_ms, 3)
            << " ms per call); compute with no communication: forward " << workshop::fixed(extras.forward_ms, 2)
            << " ms, backward " << workshop::fixed(extras.backward_ms, 2) << " ms, optimizer "
            << workshop::fixed(extras.optimizer_ms, 2) << " ms\n";
  workshop::Table napkins("lesson5_network", {"variant", "ranks", "calls / step", "step ms (median of rounds)",
                                              "napkin ms", "measured / napkin", "napkin: compute", "napkin: wire",
                                              "napkin: calls", "round medians ms"});
  for (size_t k = 0; k < results.size(); ++k) {
    const l5demo::Result& r = results[k];
    const l5demo::Napkin nk =
        l5demo::napkin(static_cast<int>(k), r, extras, world_size, bytes_per_s, delay_ms, link_delay_ms);
    std::string rounds_text;
    for (double ms : r.round_ms) rounds_text += (rounds_text.empty() ? "" : " ") + workshop::fixed(ms, 1);
    napkins.add({r.variant, std::to_string(world_size), std::to_string(r.collectives_per_step),
                 workshop::fixed(r.median_ms, 2), workshop::fixed(nk.total_ms, 2),
                 workshop::fixed(r.median_ms / nk.total_ms, 2), workshop::fixed(nk.compute_ms, 2),
                 workshop::fixed(nk.wire_ms, 2), workshop::fixed(nk.calls_ms, 2), rounds_text});
  }
  napkins.emit(csv_dir);
  std::string first_ranking;
  bool same = true;
  for (size_t round = 0; round < results.front().round_ms.size(); ++round) {
    std::vector<size_t> order(results.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return results[a].round_ms[round] < results[b].round_ms[round]; });
    std::string ranking;
    for (size_t k : order) ranking += (ranking.empty() ? "" : " < ") + results[k].variant;
    if (round == 0) first_ranking = ranking;
    same = same && ranking == first_ranking;
    std::cout << "round " << round + 1 << " (fastest first): " << ranking << "\n";
  }
  std::cout << "ranking the same in every round: " << (same ? "yes" : "NO") << "\n";
  // [demo_napkin_table]
}

int run(const workshop::Demo& demo) {
  const workshop::Flags& flags = demo.flags;
  const bool quick = demo.quick;
  std::string where = workshop::device_name(c10::Device(c10::kCPU)) + ", Gloo over loopback";
  if (!demo.device.is_cpu()) {
    std::cout << "note: --device=" << demo.device << ": the ranks still run with Gloo on the CPU (NCCL needs one "
              << "GPU per rank; this demo does not start NCCL ranks)\n";
  }
  const int world_size = static_cast<int>(flags.get_int("world_size", quick ? 2 : 4));
  TORCH_CHECK(world_size >= 1 && world_size <= 16, "--world_size must be in 1 .. 16, got ", world_size);
  const std::string& csv_dir = demo.csv_dir;
  l5demo::Config config = l5demo::config_for(quick, world_size);
  config.rounds = static_cast<int>(flags.get_int("rounds", 1));
  config.steps = static_cast<int>(flags.get_int("steps", config.steps));
  TORCH_CHECK(config.steps >= 1 && config.steps <= 1000, "--steps must be in 1 .. 1000, got ", config.steps);
  TORCH_CHECK(config.rounds >= 1 && config.rounds <= 20, "--rounds must be in 1 .. 20, got ", config.rounds);
  const LinkFlags link = ranks::link_flags(flags.get_double("link_gbit", 0), flags.get_double("sim_delay_ms", 0),
                                           flags.get_double("link_delay_ms", 0));
  const double delay_ms = link.delay_ms, link_delay_ms = link.link_delay_ms, link_gbit = link.gbit;
  config.sim_delay_us = static_cast<int64_t>(std::llround(delay_ms * 1000));
  l5demo::Network network = network_from_flags(flags, world_size);
  const bool on_netns = !network.netns.empty();
  if (on_netns) where = workshop::device_name(c10::Device(c10::kCPU)) + ", Gloo over network namespaces";
  TORCH_CHECK(config.batch % world_size == 0, "--world_size=", world_size, ": the batch of ", config.batch,
              " items does not divide evenly into the ranks");
  const double param_bytes = 4.0 * config.depth * (config.width * config.width + config.width);

  std::cout << "Lesson 5 — data parallel on " << world_size << " ranks (processes, Gloo over "
            << (on_netns ? "one network namespace per rank, " + network.hosts[0] + " .. " + network.hosts.back()
                         : std::string(network.hosts.empty() ? "127.0.0.1" : network.hosts[0]))
            << ") on " << workshop::device_name(c10::Device(c10::kCPU)) << "\n"
            << "MLP " << config.depth << " x Linear(" << config.width << ", " << config.width
            << "): " << 2 * config.depth << " parameters, " << workshop::mib(param_bytes) << "; batch " << config.batch
            << " (" << config.batch / world_size << " per rank), Adam, bucket budget "
            << workshop::mib(static_cast<double>(config.bucket_bytes)) << ", " << config.steps << " timed steps per row"
            << (config.rounds > 1 ? ", " + std::to_string(config.rounds) + " rounds" : "") << "\n";
  if (on_netns || link_gbit > 0 || delay_ms > 0) {
    std::cout << ranks::link_line(flags.get("link", on_netns ? "veth" : "loopback"), link_gbit, delay_ms, link_delay_ms,
                                  "the measured large all-reduce")
              << "\n";
  }
  std::cout << "\n";

  double probe_ms = 0;
  int64_t probe_bytes = 0;
  l5demo::Extras extras;
  const std::vector<l5demo::Result> results =
      l5demo::launch(config, quick, std::chrono::seconds(600), &probe_ms, &probe_bytes,
                     static_cast<int>(flags.get_int("fault_exit_rank", -1)), network.hosts.empty() ? nullptr : &network,
                     &extras);

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
  std::cout << "\n"
            << (on_netns ? "Link" : "Loopback") << " ceiling (one " << workshop::mib(static_cast<double>(probe_bytes))
            << " all-reduce): " << workshop::fixed(probe_ms, 2) << " ms, "
            << workshop::fixed(wire / (probe_ms * 1e-3) / 1e9, 2) << " GB/s sent per rank by the ring napkin math.\n";
  napkin_tables(results, extras, link, world_size, wire / (probe_ms * 1e-3), csv_dir);
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
}

}  // namespace

int main(int argc, char** argv) {
  const int child = l5demo::maybe_run_as_rank(argc, argv);  // a rank started by the parent below
  if (child >= 0) return child;
  return workshop::demo_main(
      argc, argv,
      workshop::DemoOptions("Lesson 5 demo: N ranks (processes) train the same MLP on shards of one batch four ways: "
                            "collectives, bytes, step time and optimizer state per rank, side by side.")
          .device("cpu")
          .device_help("cpu (default); the ranks always run with Gloo on the CPU")
          .flags({{"world_size", "ranks to start (default 4; --quick: 2)"},
                  {"fault_exit_rank",
                   "a fault drill: this rank exits right after joining; the others must fail with a clear error, "
                   "and the demo exits 1"},
                  {"steps", "timed steps per variant and round (default 10; --quick: 5)"},
                  {"rounds", "every variant once per round, in turn, this many rounds (default 1)"},
                  {"sim_delay_ms", "SIMULATED latency added to every collective by dist::Comm (default 0)"},
                  {"netns", "NS0,NS1,...: start rank r inside network namespace NSr (root; see netns/)"},
                  {"hosts", "ADDR0,ADDR1,...: rank r's Gloo address; the store listens at ADDR0"},
                  {"link_gbit",
                   "the link's rate per rank in Gbit/s for the napkin math (default: the measured large "
                   "all-reduce)"},
                  {"link_delay_ms", "latency the KERNEL adds per collective (netem), for the napkin math"},
                  {"link", "how the link was made, printed with the results (e.g. 'tbf 1gbit')"}}),
      run);
}
