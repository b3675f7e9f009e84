// Lesson 7's demo, --world_size=N: N ranks as PROCESSES (lesson 5's launcher, process_ranks.h; each measures what
// demo_ranks.cc says), the step timed four ways: DDP-style, ZeRO-1 (lesson 5's ddp::ZeroOptimizer: replicated
// parameters and gradients, Adam's state sharded; an all-reduce of the gradients, then a broadcast of every
// parameter from its owner), fully sharded without and with prefetch. Per row: the bytes rank 0 keeps between steps
// and its peak during a step (lesson 4's meter, common/memory_meter.h, over the whole rank process), the bytes it
// sends, the step time beside the napkin (compute vs bytes sent / link rate), and the CPU floor (every rank's CPU
// time per step, getrusage, summed over the ranks, / the hardware threads: no schedule finishes a step faster on
// this machine); then the verdict on prefetch (within 1.5x of max(compute, communication)), which says when the CPU
// floor alone rules the goal out.
//
//   bazel run //lesson7_fsdp:demo -- --world_size=2                  (processes on loopback)
//   bazel run //lesson7_fsdp:demo -- --quick --world_size=2 --csv_dir=/tmp/out
//   bazel run //lesson7_fsdp:demo -- --world_size=4 --rounds=3 --sim_delay_ms=0.5   (latency simulated)
// On shaped links, every rank in its own network namespace (as root; lesson5_distributed/netns/, which passes
// --netns, --hosts, --link_gbit, --link_delay_ms and --link):
//   bazel build //lesson7_fsdp:demo
//   lesson5_distributed/netns/netns_run.sh --demo .bazel/bin/lesson7_fsdp/demo --world_size 2 --gbit 1
//       --delay_ms 0 --rounds 3                                      (one command line)
//   python3 lesson5_distributed/netns/record.py --lesson 7 --demo .bazel/bin/lesson7_fsdp/demo --out FILE
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <sched.h>

#include "common/demo.h"
#include "common/device.h"
#include "common/report.h"
#include "lesson5_distributed/process_ranks.h"
#include "lesson7_fsdp/demo_parts.h"

namespace l7demo {

workshop::FlagHelp process_flags() {
  return {{"world_size",
           "N: start N ranks as processes and time the step DDP-style, ZeRO-1 and fully sharded without and with "
           "prefetch, beside the napkin, each rank's peak bytes and the CPU floor (without it: 2 ranks as threads)"},
          {"rounds", "with --world_size: every row once per round, this many rounds (default 1)"},
          {"steps", "with --world_size: timed steps per row and round (default 10; --quick: 3)"},
          {"layers", "with --world_size: Linear layers (default 8; --quick: 4)"},
          {"width", "with --world_size: their width (default 512; --quick: 256)"},
          {"items_per_rank", "with --world_size: items per rank and step (default 256; --quick: 64)"},
          {"sim_delay_ms", "with --world_size: SIMULATED latency added to every collective by dist::Comm (default 0)"},
          {"netns", "NS0,NS1,...: start rank r inside network namespace NSr (root; lesson5_distributed/netns/)"},
          {"hosts", "ADDR0,ADDR1,...: rank r's Gloo address; the store listens at ADDR0"},
          {"link_gbit", "the link's rate per rank in Gbit/s for the napkin (default: the measured all-gather)"},
          {"link_delay_ms", "latency the KERNEL adds per collective (netem), for the napkin"},
          {"link", "how the link was made, printed with the results (e.g. 'tbf 1gbit')"}};
}

namespace {

// The flags of --world_size, checked.
ProcConfig proc_config(const workshop::Flags& flags, bool quick) {
  ProcConfig c;
  if (quick) c.layers = 4, c.width = 256, c.items = 64, c.steps = 3;
  c.rounds = static_cast<int>(flags.get_int("rounds", 1));
  c.steps = static_cast<int>(flags.get_int("steps", c.steps));
  c.layers = static_cast<int>(flags.get_int("layers", c.layers));
  c.width = flags.get_int("width", c.width);
  c.items = flags.get_int("items_per_rank", c.items);
  TORCH_CHECK(c.rounds >= 1 && c.rounds <= 20, "--rounds must be in 1 .. 20, got ", c.rounds);
  TORCH_CHECK(c.steps >= 1 && c.steps <= 1000, "--steps must be in 1 .. 1000, got ", c.steps);
  TORCH_CHECK(c.layers >= 1 && c.width >= 1 && c.items >= 1, "--layers, --width, --items_per_rank must be >= 1, got ",
              c.layers, ", ", c.width, ", ", c.items);
  return c;
}

// The hardware threads this process may run on (its affinity mask; else std::thread::hardware_concurrency()).
int usable_cpus() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0) return CPU_COUNT(&allowed);
  return std::max(1u, std::thread::hardware_concurrency());
}

// [demo_napkin]
// Compute: DDP's forward + backward + Adam on every parameter; ZeRO-1's the same with Adam on 1/N; the sharded
// step's forward twice (the backward recomputes each layer from its gathered parameters) + backward + Adam on 1/N.
// Communication: the link bytes of the step (count_bytes: what this rank sent, counted; ZeRO-1's broadcasts once
// per tree step) at the link's rate, plus the simulated delay per call. No prefetch, DDP, ZeRO-1: the two in turn;
// prefetch: at best the larger of the two. CPU floor: every rank's CPU ms per step, summed, / the hardware threads.
struct Napkin {
  double compute_ms = 0, comm_ms = 0, napkin_ms = 0, step_ms = 0, cpu_floor_ms = 0;
};

std::vector<Napkin> napkins(const ProcResults& res, int world_size, double bytes_per_s, double delay_per_call_ms,
                            int cpus) {
  std::vector<Napkin> out(kProcModes);
  for (size_t k = 0; k < kProcModes; ++k) {
    const ProcResults::Row& row = res.rows[k];
    Napkin& nap = out[k];
    const double adam = res.optimizer / (kProcMode[k] == Mode::kDdp ? 1 : world_size);
    nap.compute_ms = (is_sharded(kProcMode[k]) ? 2 * res.forward : res.forward) + res.backward + adam;
    nap.comm_ms = row.link_bytes / bytes_per_s * 1e3 + row.calls * delay_per_call_ms;
    nap.napkin_ms =
        kProcMode[k] == Mode::kPrefetch ? std::max(nap.compute_ms, nap.comm_ms) : nap.compute_ms + nap.comm_ms;
    nap.step_ms = workshop::median(row.round_ms);
    nap.cpu_floor_ms = workshop::median(row.round_cpu_ms) / cpus;
  }
  return out;
}
// [demo_napkin]

void print_proc_table(const ProcResults& res, const std::vector<Napkin>& nap, int world_size,
                      const std::string& csv_dir) {
  workshop::Table table("lesson7_network",
                        {"training", "ranks", "bytes kept / rank", "peak bytes / rank", "MiB sent / rank / step",
                         "calls / step", "step ms (median of rounds)", "napkin ms", "measured / napkin",
                         "napkin: compute", "napkin: communication", "CPU floor ms", "round medians ms"});
  for (size_t k = 0; k < kProcModes; ++k) {
    const ProcResults::Row& row = res.rows[k];
    std::string rounds_text;
    for (double ms : row.round_ms) rounds_text += (rounds_text.empty() ? "" : " ") + workshop::fixed(ms, 1);
    table.add({kProcName[k], std::to_string(world_size), std::to_string(static_cast<int64_t>(row.kept)),
               std::to_string(static_cast<int64_t>(row.peak)), workshop::fixed(row.sent / (1024.0 * 1024.0), 3),
               std::to_string(static_cast<int64_t>(row.calls)), workshop::fixed(nap[k].step_ms, 2),
               workshop::fixed(nap[k].napkin_ms, 2), workshop::fixed(nap[k].step_ms / nap[k].napkin_ms, 2),
               workshop::fixed(nap[k].compute_ms, 2), workshop::fixed(nap[k].comm_ms, 2),
               workshop::fixed(nap[k].cpu_floor_ms, 2), rounds_text});
  }
  const std::string path = table.emit(csv_dir);
  if (!path.empty()) std::cout << "wrote " << path << "\n";
}

// Prefetch's saving, the verdict on the goal (with prefetch within 1.5x of max(compute, communication)) and, when
// the CPU floor is above that, why no schedule can meet it here; then each row's peak on its busiest rank.
void print_verdict(const ProcResults& res, const std::vector<Napkin>& nap, int world_size, int cpus) {
  const Napkin& with = nap[kPrefetchRow];
  const Napkin& without = nap[kNoPrefetchRow];
  const double bound = std::max(with.compute_ms, with.comm_ms);
  const double ratio = with.step_ms / bound;
  std::cout << "Prefetch saves " << workshop::fixed(without.step_ms - with.step_ms, 2) << " ms per step ("
            << workshop::fixed(without.step_ms, 2) << " -> " << workshop::fixed(with.step_ms, 2) << " ms); at most "
            << workshop::fixed(std::min(with.compute_ms, with.comm_ms), 2)
            << " ms can hide (the smaller of compute and communication)\n"
            << "Verdict: with prefetch the step is " << workshop::fixed(ratio, 2) << "x max(compute "
            << workshop::fixed(with.compute_ms, 2) << " ms, communication " << workshop::fixed(with.comm_ms, 2)
            << " ms) — within 1.5x: " << (ratio <= 1.5 ? "met" : "NOT MET");
  if (with.cpu_floor_ms > 1.5 * bound) {
    std::cout << "; the goal cannot be met on this machine: its CPU floor, " << workshop::fixed(with.cpu_floor_ms, 2)
              << " ms (" << world_size << " ranks' CPU time per step / " << cpus << " hardware threads), is above 1.5x "
              << workshop::fixed(bound, 2) << " = " << workshop::fixed(1.5 * bound, 2) << " ms";
  }
  std::cout << "\nPeak bytes / rank, the most of any rank:";
  for (size_t k = 0; k < kProcModes; ++k) {
    std::cout << (k == 0 ? " " : "; ") << kProcName[k] << " = " << static_cast<int64_t>(res.rows[k].peak_any);
  }
  std::cout << "\n";
}

// The napkin's inputs, what ZeRO-1 sends, and how the peak and the CPU floor are measured.
void print_napkin_inputs(const ProcResults& res, double bytes_per_s, bool shaped, double delay_per_call_ms, int cpus) {
  const double measured_bytes_per_s = res.probe_sent / (res.probe_ms * 1e-3);
  std::cout << "Napkin math: link " << workshop::fixed(bytes_per_s * 8 / 1e9, 3) << " Gbit/s per rank ("
            << (shaped ? "kernel-shaped rate" : "measured") << "; one all-gather of the model measured "
            << workshop::fixed(measured_bytes_per_s * 8 / 1e9, 3) << "), " << workshop::fixed(delay_per_call_ms, 3)
            << " ms latency per call; compute with no communication: forward " << workshop::fixed(res.forward, 2)
            << " ms, backward " << workshop::fixed(res.backward, 2) << " ms, Adam " << workshop::fixed(res.optimizer, 2)
            << " ms (every rank busy at once, median of rounds)\n"
            << "ZeRO-1 (lesson 5's ddp::ZeroOptimizer): the DDP-style all-reduce of the gradients, Adam on the "
               "parameters this rank owns, then one broadcast per parameter from its owner; sent = the all-reduce as a "
               "ring's 2 (N - 1) / N + (N - 1) / N of the broadcasts' bytes; its communication counts the broadcasts "
               "once per step of Gloo's binomial tree, ceil(log2 N)\n"
            << "Peak bytes / rank: rank 0's tensor bytes at their highest in a timed step, counted (lesson 4's meter, "
               "the whole rank process) from before the row's model existed; CPU floor ms: every rank's CPU time per "
               "timed step (getrusage, user + system, Gloo's threads included), summed over the ranks, / "
            << cpus << " hardware threads: no schedule finishes a step faster on this machine\n";
}

}  // namespace

int run_processes(const workshop::Demo& demo) {
  const workshop::Flags& flags = demo.flags;
  const std::string& csv_dir = demo.csv_dir;
  const int world_size = static_cast<int>(flags.get_int("world_size", 2));
  TORCH_CHECK(world_size >= 1 && world_size <= 16, "--world_size must be in 1 .. 16, got ", world_size);
  ProcConfig c = proc_config(flags, demo.quick);
  const ranks::LinkFlags link = ranks::link_flags(flags.get_double("link_gbit", 0), flags.get_double("sim_delay_ms", 0),
                                                  flags.get_double("link_delay_ms", 0));
  c.delay_us = static_cast<int64_t>(std::llround(link.delay_ms * 1000));
  const ranks::Network network = ranks::network_from(flags.get("netns", ""), flags.get("hosts", ""), world_size);
  const bool on_netns = !network.netns.empty();
  const double model_bytes = 4.0 * c.layers * (c.width * c.width + c.width);
  const std::string cpu = workshop::device_name(c10::Device(c10::kCPU));
  std::cout << "Lesson 7 — Fully sharded data parallel on " << world_size << " ranks (processes, Gloo over "
            << (on_netns ? "one network namespace per rank, " + network.hosts[0] + " .. " + network.hosts.back()
                         : std::string(network.hosts.empty() ? "127.0.0.1" : network.hosts[0]))
            << ") on " << cpu << "\n"
            << "Model " << c.layers << " x Linear(" << c.width << ", " << c.width << ") + tanh, "
            << workshop::mib(model_bytes) << ", Adam; " << c.items << " items per rank; " << c.steps
            << " timed steps per row (after one warm-up), " << c.rounds << " round" << (c.rounds > 1 ? "s" : "")
            << "\n";
  std::cout << ranks::link_line(flags.get("link", on_netns ? "veth" : "loopback"), link.gbit, link.delay_ms,
                                link.link_delay_ms, "the measured all-gather")
            << "\n\n";

  ranks::Launch l;
  l.prefix = "l7", l.who = "lesson 7 demo", l.world_size = world_size, l.args = proc_args(c);
  l.network = network.hosts.empty() ? nullptr : &network;
  const ProcResults res = parse_results(ranks::launch(l));
  const double bytes_per_s = link.gbit > 0 ? link.gbit * 1e9 / 8 : res.probe_sent / (res.probe_ms * 1e-3);
  const double delay_per_call_ms = link.delay_ms + link.link_delay_ms;
  const int cpus = usable_cpus();
  const std::vector<Napkin> nap = napkins(res, world_size, bytes_per_s, delay_per_call_ms, cpus);
  print_napkin_inputs(res, bytes_per_s, link.gbit > 0, delay_per_call_ms, cpus);
  print_proc_table(res, nap, world_size, csv_dir);
  print_verdict(res, nap, world_size, cpus);
  workshop::append_summary(csv_dir,
                           {{"7 fsdp", "step ms, fully sharded: no prefetch vs prefetch", nap[kNoPrefetchRow].step_ms,
                             nap[kPrefetchRow].step_ms, cpu + (on_netns ? ", network namespaces" : ", loopback")}});
  return 0;
}

}  // namespace l7demo
