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
// With --world_size=N it starts N ranks as PROCESSES instead (lesson 5's launcher, process_ranks.h) and times the
// step four ways: DDP-style, ZeRO-1 (lesson 5's ddp::ZeroOptimizer: replicated parameters and gradients, Adam's
// state sharded; an all-reduce of the gradients, then a broadcast of every parameter from its owner), fully
// sharded without and with prefetch. Per row: the bytes rank 0 keeps between steps and its peak during a step
// (lesson 4's meter, common/memory_meter.h, over the whole rank process), the bytes it sends, the step time beside
// the napkin (compute vs bytes sent / link rate), and the CPU floor (every rank's CPU time per step, getrusage,
// summed over the ranks, / the hardware threads: no schedule finishes a step faster on this machine); then the
// verdict on prefetch (within 1.5x of max(compute, communication)), which says when the CPU floor alone rules the
// goal out. Under lesson5_distributed/netns/netns_run.sh every rank runs in its own network namespace on a
// kernel-shaped link:
//   lesson5_distributed/netns/netns_run.sh --demo .bazel/bin/lesson7_fsdp/demo --world_size 2 --gbit 1
//       --delay_ms 0 --rounds 3         (one command line)
//
// With --what_fits it prints step 7's table instead (what_fits.h: arithmetic, nothing runs) and stops.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sched.h>
#include <sys/resource.h>

#include <torch/torch.h>
#include <torch/version.h>

#include "common/device.h"
#include "common/memory_meter.h"
#include "common/report.h"
#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/ddp.h"
#include "lesson5_distributed/process_ranks.h"
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

// Bytes of the parameters and their gradients that `params` hold, plus `state_bytes` of optimizer state.
int64_t persistent_bytes(const std::vector<torch::Tensor>& params, int64_t state_bytes) {
  int64_t bytes = state_bytes;
  for (const auto& p : params) {
    bytes += static_cast<int64_t>(p.nbytes());
    if (p.grad().defined()) bytes += static_cast<int64_t>(p.grad().nbytes());
  }
  return bytes;
}

// CPU seconds this process has used so far, user + system, every thread (Gloo's included).
double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * t.tv_usec; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

struct StepFigures {
  int64_t persistent = 0;      // rank 0, after the steps
  int64_t sent = 0;            // rank 0, in one step (the last)
  int64_t agreement_sent = 0;  // rank 0, in one step: the stack's agreement records (all_gather)
  int64_t link_bytes = 0;      // rank 0, in one step: the bytes the napkin puts through the link one after another
  int64_t calls = 0;           // rank 0, communicator calls in one step (the last)
  double median_ms = 0;        // rank 0
  std::vector<double> ms;      // every timed step
  // Whole-process figures, for --world_size (a process per rank; the default mode's ranks are threads of one
  // process): the most tensor bytes held during a timed step, counted from before this row's model existed (so:
  // parameters, gradients, optimizer state, activations, gathered layers, buffers; only with train_rank's `peak`),
  // and the CPU ms per timed step (getrusage: user + system of every thread).
  int64_t peak = 0;
  double cpu_ms = 0;
};

// kSharded: layer by layer (step 3); kStack / kPrefetch: the ShardedStack (step 4) without / with prefetch;
// kZero1: replicated parameters and gradients, Adam's state sharded (lesson 5's step 5, ddp::ZeroOptimizer).
enum class Mode { kDdp, kZero1, kSharded, kStack, kPrefetch };

bool is_sharded(Mode mode) { return mode == Mode::kSharded || mode == Mode::kStack || mode == Mode::kPrefetch; }

// One rank's model and optimizer in one mode. Not movable: the stack keeps a reference to `flats`.
struct RankModel {
  RankModel() = default;
  RankModel(const RankModel&) = delete;
  RankModel& operator=(const RankModel&) = delete;
  std::vector<std::vector<torch::Tensor>> replicas;  // DDP-style, ZeRO-1: every parameter on every rank
  std::vector<fsdp::FlatParam> flats;                // sharded: a slice of each layer's flat buffer
  std::vector<torch::Tensor> params;                 // every parameter this rank holds
  std::vector<fsdp::LayerFn> fns;
  std::unique_ptr<torch::optim::Adam> adam;   // all but ZeRO-1
  std::unique_ptr<ddp::ZeroOptimizer> zero;   // ZeRO-1: Adam over this rank's share only
  std::unique_ptr<fsdp::ShardedStack> stack;  // kStack, kPrefetch
};

std::unique_ptr<RankModel> make_rank_model(dist::Comm& comm, Mode mode,
                                           const std::vector<std::vector<torch::Tensor>>& init) {
  auto m = std::make_unique<RankModel>();
  for (const auto& layer : init) {
    if (is_sharded(mode)) {
      m->flats.push_back(fsdp::flatten_and_shard(layer, comm.rank(), comm.world_size()));
      m->params.push_back(m->flats.back().shard);
    } else {
      m->replicas.emplace_back();
      for (const auto& t : layer) m->replicas.back().push_back(t.clone().requires_grad_(true));
      m->params.insert(m->params.end(), m->replicas.back().begin(), m->replicas.back().end());
    }
  }
  m->fns.assign(init.size(), fsdp::LayerFn(layer_fn));
  const torch::optim::AdamOptions options(1e-3);
  if (mode == Mode::kZero1) {
    m->zero = std::make_unique<ddp::ZeroOptimizer>(comm, m->params, [&](std::vector<at::Tensor> mine) {
      return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::Adam(std::move(mine), options));
    });
  } else {
    m->adam = std::make_unique<torch::optim::Adam>(m->params, options);
  }
  if (mode == Mode::kStack || mode == Mode::kPrefetch) {
    m->stack = std::make_unique<fsdp::ShardedStack>(comm, m->flats, m->fns, mode == Mode::kPrefetch);
  }
  return m;
}

// DDP-style and ZeRO-1: one all-reduce of every gradient (flattened into one buffer), then the average.
void all_reduce_gradients(dist::Comm& comm, const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad().reshape({-1}));
  torch::Tensor flat = torch::cat(grads);
  comm.all_reduce(flat);
  flat.div_(comm.world_size());
  int64_t offset = 0;
  for (const auto& p : params) {
    p.grad().copy_(flat.narrow(0, offset, p.numel()).view_as(p));
    offset += p.numel();
  }
}

// One training step of `m` on this rank's slice `xr`, `yr` of the batch.
void one_step(dist::Comm& comm, RankModel& m, Mode mode, const torch::Tensor& xr, const torch::Tensor& yr) {
  if (m.zero) m.zero->zero_grad();
  if (m.adam) m.adam->zero_grad();
  torch::Tensor h = xr;
  if (m.stack) h = m.stack->forward(xr);
  for (size_t l = 0; l < m.fns.size() && !m.stack; ++l) {
    h = is_sharded(mode) ? fsdp::sharded_forward(comm, m.flats[l], m.fns[l], h) : layer_fn(h, m.replicas[l]);
  }
  torch::mse_loss(h, yr).backward();
  if (m.stack) m.stack->finish();
  if (!is_sharded(mode)) all_reduce_gradients(comm, m.params);
  if (m.zero) m.zero->step();  // Adam on this rank's share, then every parameter broadcast from its owner
  if (m.adam) m.adam->step();
}

// Rank 0's bytes of one step from the communicator's counts. Sharded: every byte it sent point-to-point. DDP-style:
// Gloo's all-reduce payload as a ring's 2 (N - 1) / N. ZeRO-1: that, plus the broadcasts' bytes (counted on every
// rank) x (N - 1) / N, what each rank sends of them on average (each broadcast reaches N - 1 ranks once). The link
// bytes (the napkin's communication): the same, except that ZeRO-1's broadcasts count ceil(log2 N) times (Gloo's
// binomial tree: the payload leaves a sender once per tree step, and the broadcasts run one after another), as
// lesson 5's napkin counts them.
void count_bytes(const dist::CommStats& stats, Mode mode, int n, StepFigures& out) {
  const double ring = dist::ring_allreduce_wire_bytes(static_cast<double>(stats.all_reduce_bytes), n);
  const double broadcast = static_cast<double>(stats.broadcast_bytes);
  const double tree_steps = std::ceil(std::log2(std::max(1, n)));
  out.sent = is_sharded(mode) ? stats.send_bytes : static_cast<int64_t>(ring + broadcast * (n - 1) / n);
  out.agreement_sent = stats.all_gather_bytes * (n - 1);  // the stack's agreement records (gathered to every peer)
  out.link_bytes =
      is_sharded(mode) ? out.sent + out.agreement_sent : static_cast<int64_t>(ring + tree_steps * broadcast);
  out.calls = stats.calls;
}

// One rank's `steps` steps on its slice `xr`, `yr` of the batch: DDP-style, ZeRO-1, sharded layer by layer (step 3)
// or as a stack with or without prefetch (step 4). `warm_up`: one untimed step first. `peak`: measure the peak
// bytes (a rank per process only: the meter counts the whole process, and its counting allocator costs a lock per
// allocation, which the default mode's timings go without).
StepFigures train_rank(dist::Comm& comm, Mode mode, const std::vector<std::vector<torch::Tensor>>& init,
                       const torch::Tensor& xr, const torch::Tensor& yr, int steps, bool warm_up = false,
                       bool peak = false) {
  const int64_t before = peak ? workshop::cpu_allocated_bytes() : 0;  // before this row's model exists
  const std::unique_ptr<RankModel> m = make_rank_model(comm, mode, init);
  std::optional<workshop::MemoryMeter> meter;  // the whole process: with --world_size, this rank
  if (peak) meter.emplace();
  StepFigures out;
  double cpu_s = 0;
  for (int s = warm_up ? -1 : 0; s < steps; ++s) {
    comm.barrier();
    comm.reset_stats();
    if (meter) meter->reset();
    const int64_t at_start = meter ? workshop::cpu_allocated_bytes() - before : 0;
    const double cpu_start = cpu_seconds();
    const auto start = std::chrono::steady_clock::now();
    one_step(comm, *m, mode, xr, yr);
    const auto end = std::chrono::steady_clock::now();
    const double cpu_end = cpu_seconds();
    if (s < 0) continue;
    out.ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
    cpu_s += cpu_end - cpu_start;
    if (meter) out.peak = std::max(out.peak, at_start + meter->peak_bytes());
  }
  out.persistent = persistent_bytes(m->params, m->zero ? m->zero->state_bytes() : ddp::optimizer_state_bytes(*m->adam));
  count_bytes(comm.stats(), mode, comm.world_size(), out);
  out.median_ms = workshop::median(out.ms);
  out.cpu_ms = cpu_s * 1e3 / std::max(1, steps);
  return out;
}

// `steps` steps on 2 ranks (threads) of `items` items in all; rank 0's figures.
StepFigures train(Mode mode, int layers, int64_t width, int64_t items, int steps) {
  StepFigures out;
  const auto init = make_layers(layers, width);
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({items, width}), y = torch::randn({items, width});
  dist::run_ranks(launch(), [&](dist::Comm& comm) {
    const int r = comm.rank(), n = comm.world_size();
    const StepFigures mine = train_rank(comm, mode, init, x.narrow(0, r * items / n, items / n),
                                        y.narrow(0, r * items / n, items / n), steps);
    if (r == 0) out = mine;
  });
  return out;
}

// ---- Ranks as processes (--world_size): lesson 5's launcher (process_ranks.h), on loopback or, under
// lesson5_distributed/netns/netns_run.sh, one network namespace per rank with kernel-shaped links.

struct ProcConfig {
  int rounds = 1;
  int steps = 10;
  int layers = 8;
  int64_t width = 512;
  int64_t items = 256;   // per rank
  int64_t delay_us = 0;  // SIMULATED latency per collective (dist::Comm::set_simulated_delay)
};

std::vector<std::string> proc_args(const ProcConfig& c) {
  return {"--l7_rounds=" + std::to_string(c.rounds), "--l7_steps=" + std::to_string(c.steps),
          "--l7_layers=" + std::to_string(c.layers), "--l7_width=" + std::to_string(c.width),
          "--l7_items=" + std::to_string(c.items),   "--l7_delay_us=" + std::to_string(c.delay_us)};
}

ProcConfig proc_config_from(const std::vector<std::string>& args) {
  ProcConfig c;
  for (const std::string& a : args) {
    auto is = [&](const std::string& name) { return a.rfind("--l7_" + name + "=", 0) == 0; };
    auto value = [&](const std::string& name) { return std::stoll(a.substr(name.size() + 6)); };
    if (is("rounds")) c.rounds = static_cast<int>(value("rounds"));
    if (is("steps")) c.steps = static_cast<int>(value("steps"));
    if (is("layers")) c.layers = static_cast<int>(value("layers"));
    if (is("width")) c.width = value("width");
    if (is("items")) c.items = value("items");
    if (is("delay_us")) c.delay_us = value("delay_us");
  }
  return c;
}

constexpr int kProcModes = 4;
constexpr int kNoPrefetchRow = 2, kPrefetchRow = 3;
const Mode kProcMode[kProcModes] = {Mode::kDdp, Mode::kZero1, Mode::kStack, Mode::kPrefetch};
const char* const kProcName[kProcModes] = {"DDP-style: replicated, one all-reduce",
                                           "ZeRO-1: replicated, Adam's state sharded", "fully sharded, no prefetch",
                                           "fully sharded + prefetch"};

// The link: one all-gather of the whole model's bytes (our ring, step 1), median of 5 after a warm-up. Returns
// "probe <ms> <bytes sent>".
std::string probe_link(dist::Comm& comm, const ProcConfig& c) {
  const int n = comm.world_size();
  const int64_t model_elements = c.layers * (c.width * c.width + c.width);
  const int64_t gather_elements = (model_elements + n - 1) / n * n;
  const at::Tensor shard = at::ones({gather_elements / n}), full = at::empty({gather_elements});
  std::vector<double> ms;
  for (int i = 0; i <= 5; ++i) {
    comm.barrier();
    comm.reset_stats();
    const auto start = std::chrono::steady_clock::now();
    fsdp::all_gather_into(comm, shard, full);
    if (i > 0)
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::ostringstream out;
  out << std::setprecision(17) << "probe " << workshop::median(ms) << " " << comm.stats().send_bytes << "\n";
  return out.str();
}

// Compute only, every rank busy at once: replicated layers, no communication; the medians of `steps` steps of
// forward, backward and Adam (after one warm-up step, in which Adam's state appears).
std::vector<double> measure_compute(dist::Comm& comm, const std::vector<std::vector<torch::Tensor>>& init,
                                    const torch::Tensor& xr, const torch::Tensor& yr, int steps) {
  std::vector<torch::Tensor> params;
  std::vector<std::vector<torch::Tensor>> replicas;
  for (const auto& layer : init) {
    replicas.emplace_back();
    for (const auto& t : layer) replicas.back().push_back(t.clone().requires_grad_(true));
    params.insert(params.end(), replicas.back().begin(), replicas.back().end());
  }
  torch::optim::Adam adam(params, torch::optim::AdamOptions(1e-3));
  std::vector<double> f, b, o;
  const auto ms = [](auto from, auto to) { return std::chrono::duration<double, std::milli>(to - from).count(); };
  for (int s = -1; s < steps; ++s) {
    adam.zero_grad();
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    torch::Tensor h = xr;
    for (const auto& layer : replicas) h = layer_fn(h, layer);
    torch::Tensor loss = torch::mse_loss(h, yr);
    const auto t1 = std::chrono::steady_clock::now();
    loss.backward();
    const auto t2 = std::chrono::steady_clock::now();
    adam.step();
    const auto t3 = std::chrono::steady_clock::now();
    if (s < 0) continue;
    f.push_back(ms(t0, t1)), b.push_back(ms(t1, t2)), o.push_back(ms(t2, t3));
  }
  return {workshop::median(f), workshop::median(b), workshop::median(o)};
}

// Over every rank (collectives, so every rank calls it): the CPU ms per step summed, the peak bytes' maximum.
std::pair<double, double> over_ranks(dist::Comm& comm, const StepFigures& f) {
  at::Tensor cpu = at::full({1}, f.cpu_ms, at::kDouble), peak = at::full({1}, static_cast<double>(f.peak), at::kDouble);
  comm.all_reduce(cpu);
  comm.all_reduce(peak, dist::ReduceOp::kMax);
  return {cpu.item<double>(), peak.item<double>()};
}

// Every row's figures on this rank, `c.rounds` times; rank 0's text (the rest is discarded by the launcher):
//   row K <kept> <peak, rank 0> <peak, most of any rank> <sent> <link bytes> <calls>   (the last round's)
//   ms K <median step ms of round 1> ...
//   cpu K <CPU ms per step, summed over the ranks, of round 1> ...
std::string rows_text(dist::Comm& comm, const ProcConfig& c, const std::vector<std::vector<torch::Tensor>>& init,
                      const torch::Tensor& xr, const torch::Tensor& yr, std::vector<std::vector<double>>& compute) {
  std::vector<std::ostringstream> ms(kProcModes), cpu(kProcModes);
  std::vector<StepFigures> last(kProcModes);
  std::vector<double> peak_any(kProcModes, 0);
  for (size_t k = 0; k < kProcModes; ++k) ms[k].precision(17), cpu[k].precision(17);
  for (int round = 0; round < c.rounds; ++round) {
    compute.push_back(measure_compute(comm, init, xr, yr, c.steps));
    for (size_t k = 0; k < kProcModes; ++k) {
      last[k] = train_rank(comm, kProcMode[k], init, xr, yr, c.steps, /*warm_up=*/true, /*peak=*/true);
      const std::pair<double, double> all = over_ranks(comm, last[k]);
      ms[k] << " " << last[k].median_ms, cpu[k] << " " << all.first;
      peak_any[k] = std::max(peak_any[k], all.second);
    }
  }
  std::ostringstream out;
  out << std::setprecision(17);
  for (size_t k = 0; k < kProcModes; ++k) {
    const StepFigures& f = last[k];
    out << "row " << k << " " << f.persistent << " " << f.peak << " " << peak_any[k] << " " << f.sent + f.agreement_sent
        << " " << f.link_bytes << " " << f.calls << "\n"
        << "ms " << k << ms[k].str() << "\ncpu " << k << cpu[k].str() << "\n";
  }
  return out.str();
}

// What one rank measures (rank 0's is printed). Text: one "key values..." line per figure.
std::string proc_rank(dist::Comm& comm, const ProcConfig& c) {
  workshop::cpu_allocated_bytes();  // installs the counting allocator before the rows' tensors exist
  const int r = comm.rank(), n = comm.world_size();
  const auto init = make_layers(c.layers, c.width);
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({c.items * n, c.width}), y = torch::randn({c.items * n, c.width});
  const torch::Tensor xr = x.narrow(0, r * c.items, c.items), yr = y.narrow(0, r * c.items, c.items);
  const std::string probe = probe_link(comm, c);
  comm.set_simulated_delay(std::chrono::microseconds(c.delay_us));
  std::vector<std::vector<double>> compute;  // per round: forward, backward, Adam
  const std::string rows = rows_text(comm, c, init, xr, yr, compute);
  std::vector<double> forward, backward, optimizer;
  for (const auto& round : compute) {
    forward.push_back(round[0]), backward.push_back(round[1]), optimizer.push_back(round[2]);
  }
  std::ostringstream out;
  out << std::setprecision(17) << probe << "compute " << workshop::median(forward) << " " << workshop::median(backward)
      << " " << workshop::median(optimizer) << "\n";
  return out.str() + rows;
}

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

// Rank 0's text (rows_text, proc_rank), read back.
struct ProcResults {
  double probe_ms = 0, probe_sent = 0, forward = 0, backward = 0, optimizer = 0;
  struct Row {
    double kept = 0, peak = 0, peak_any = 0, sent = 0, link_bytes = 0, calls = 0;
    std::vector<double> round_ms, round_cpu_ms;
  };
  std::vector<Row> rows = std::vector<Row>(kProcModes);
};

ProcResults parse_results(const std::string& text) {
  ProcResults out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key;
    int k = 0;
    double value = 0;
    words >> key;
    if (key == "probe") words >> out.probe_ms >> out.probe_sent;
    if (key == "compute") words >> out.forward >> out.backward >> out.optimizer;
    if (key != "row" && key != "ms" && key != "cpu") continue;
    words >> k;
    ProcResults::Row& row = out.rows.at(static_cast<size_t>(k));
    if (key == "row") words >> row.kept >> row.peak >> row.peak_any >> row.sent >> row.link_bytes >> row.calls;
    while (key == "ms" && words >> value) row.round_ms.push_back(value);
    while (key == "cpu" && words >> value) row.round_cpu_ms.push_back(value);
  }
  return out;
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

// --world_size=N: the step comparison with N ranks as processes; on namespaces with --netns and --hosts.
int run_processes(const workshop::Flags& flags, bool quick, const std::string& csv_dir) {
  const int world_size = static_cast<int>(flags.get_int("world_size", 2));
  TORCH_CHECK(world_size >= 1 && world_size <= 16, "--world_size must be in 1 .. 16, got ", world_size);
  ProcConfig c = proc_config(flags, quick);
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

// Step 7: lesson 4's planner on the napkin probe, for kPlanBatch sequences per GPU per step: the recipe it picks and
// its peak in GB, or "none fits" and the least-memory recipe's peak.
constexpr int64_t kPlanBatch = 8;

std::pair<std::string, std::string> plan_text(const fsdp::TransformerShape& shape, fsdp::Strategy strategy, int gpus,
                                              const fsdp::Cluster& cluster) {
  try {
    const mem::Plan plan = fsdp::plan_cell(shape, strategy, gpus, kPlanBatch, cluster);
    return {mem::describe(plan.recipe), workshop::fixed(static_cast<double>(plan.peak_bytes) / 1e9, 1)};
  } catch (const c10::Error&) {
    const mem::Recipe least = mem::candidate_recipes(kPlanBatch, shape.layers).back();
    const double smallest = static_cast<double>(fsdp::recipe_peak_bytes(shape, strategy, gpus, kPlanBatch, least));
    return {"none fits", "(" + workshop::fixed(smallest / 1e9, 1) + ")"};
  }
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
    workshop::Table table("lesson7_what_fits_" + file,
                          {"GPUs", "strategy", "state GB", "total GB", "fits", "total GB ckpt", "fits ckpt",
                           "sent GB/step", "comm s/step", "lesson 4's plan, " + std::to_string(kPlanBatch) + " seq.",
                           "plan GB"});
    for (int gpus : {8, 16, 32, 64}) {
      for (fsdp::Strategy strategy : fsdp::all_strategies()) {
        const fsdp::Fit plain = fsdp::what_fits(shape, strategy, gpus, false, cluster);
        const fsdp::Fit ckpt = fsdp::what_fits(shape, strategy, gpus, true, cluster);
        const auto plan = plan_text(shape, strategy, gpus, cluster);
        table.add({std::to_string(gpus), fsdp::strategy_name(strategy), gb(static_cast<double>(plain.state.total())),
                   gb(static_cast<double>(plain.total)), plain.fits ? "yes" : "no", gb(static_cast<double>(ckpt.total)),
                   ckpt.fits ? "yes" : "no", gb(static_cast<double>(plain.comm_bytes)),
                   workshop::fixed(plain.comm_s, 3), plan.first, plan.second});
      }
    }
    const std::string path = table.emit(csv_dir);
    if (!path.empty()) std::cout << "wrote " << path << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int child = ranks::run_as_rank("l7", argc, argv, [](dist::Comm& comm, const std::vector<std::string>& args) {
    return proc_rank(comm, proc_config_from(args));
  });
  if (child >= 0) return child;  // a rank started by run_processes
  workshop::Flags flags(
      argc, argv,
      {{"device", "cpu (default; the rings run on Gloo, CPU tensors)"},
       {"quick", "small, fast settings for a CPU"},
       {"csv_dir", "write the table and the summary line as CSV into this folder"},
       {"what_fits", "print step 7's table (what fits on 8 to 64 H200s) and stop"},
       {"world_size",
        "N: start N ranks as processes and time the step DDP-style, ZeRO-1 and fully sharded without and "
        "with prefetch, beside the napkin, each rank's peak bytes and the CPU floor (without it: 2 ranks as "
        "threads, the tables below)"},
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
       {"link", "how the link was made, printed with the results (e.g. 'tbf 1gbit')"}});
  const bool quick = flags.has("quick");
  const c10::Device device = workshop::parse_device(flags.get("device", "cpu"));
  if (!device.is_cpu()) std::cout << "(the rings run on Gloo: CPU tensors, whatever --device says)\n";
  const std::string csv_dir = flags.get("csv_dir", "");
  if (flags.has("what_fits")) {
    print_what_fits(csv_dir);
    return 0;
  }
  if (flags.has("world_size")) return run_processes(flags, quick, csv_dir);
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
