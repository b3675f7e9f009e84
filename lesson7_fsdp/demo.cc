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
// step DDP-style, fully sharded without and with prefetch, beside the napkin (compute vs bytes sent / link rate)
// and a verdict. Under lesson5_distributed/netns/netns_run.sh every rank runs in its own network namespace on a
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
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "common/device.h"
#include "common/report.h"
#include "lesson5_distributed/comm.h"
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
  int64_t persistent = 0;      // rank 0, after the steps
  int64_t sent = 0;            // rank 0, in one step (the last)
  int64_t agreement_sent = 0;  // rank 0, in one step: the stack's agreement records (all_gather)
  int64_t calls = 0;           // rank 0, communicator calls in one step (the last)
  double median_ms = 0;        // rank 0
  std::vector<double> ms;      // every timed step
};

// kSharded: layer by layer (step 3); kStack / kPrefetch: the ShardedStack (step 4) without / with prefetch.
enum class Mode { kDdp, kSharded, kStack, kPrefetch };

// One rank's `steps` steps on its slice `xr`, `yr` of the batch: DDP-style, sharded layer by layer (step 3) or as a
// stack with or without prefetch (step 4). `warm_up`: one untimed step first.
StepFigures train_rank(dist::Comm& comm, Mode mode, const std::vector<std::vector<torch::Tensor>>& init,
                       const torch::Tensor& xr, const torch::Tensor& yr, int steps, bool warm_up = false) {
  const int r = comm.rank(), n = comm.world_size();
  const int layers = static_cast<int>(init.size());
  const bool sharded = mode != Mode::kDdp;
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
  if (mode == Mode::kStack || mode == Mode::kPrefetch) {
    stack = std::make_unique<fsdp::ShardedStack>(comm, flats, fns, mode == Mode::kPrefetch);
  }
  StepFigures out;
  for (int s = warm_up ? -1 : 0; s < steps; ++s) {
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
    if (s >= 0)
      out.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  out.persistent = persistent_bytes(params, adam);
  const dist::CommStats& stats = comm.stats();
  out.sent =
      sharded ? stats.send_bytes
              : static_cast<int64_t>(dist::ring_allreduce_wire_bytes(static_cast<double>(stats.all_reduce_bytes), n));
  out.agreement_sent = stats.all_gather_bytes * (n - 1);  // the stack's agreement records (gathered to every peer)
  out.calls = stats.calls;
  out.median_ms = workshop::median(out.ms);
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

constexpr int kProcModes = 3;
const Mode kProcMode[kProcModes] = {Mode::kDdp, Mode::kStack, Mode::kPrefetch};
const char* const kProcName[kProcModes] = {"DDP-style: replicated, one all-reduce", "fully sharded, no prefetch",
                                           "fully sharded + prefetch"};

// What one rank measures (rank 0's is printed). Text: one "key values..." line per figure.
std::string proc_rank(dist::Comm& comm, const ProcConfig& c) {
  const int r = comm.rank(), n = comm.world_size();
  const auto init = make_layers(c.layers, c.width);
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({c.items * n, c.width}), y = torch::randn({c.items * n, c.width});
  const torch::Tensor xr = x.narrow(0, r * c.items, c.items), yr = y.narrow(0, r * c.items, c.items);
  // The link: one all-gather of the whole model's bytes (our ring, step 1), median of 5 after a warm-up.
  const int64_t model_elements = c.layers * (c.width * c.width + c.width);
  const int64_t gather_elements = (model_elements + n - 1) / n * n;
  double probe_ms = 0;
  int64_t probe_sent = 0;
  {
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
    probe_ms = workshop::median(ms), probe_sent = comm.stats().send_bytes;
  }
  comm.set_simulated_delay(std::chrono::microseconds(c.delay_us));
  std::vector<double> forward, backward, optimizer;
  std::vector<std::vector<double>> round_ms(kProcModes);
  std::vector<StepFigures> last(kProcModes);
  for (int round = 0; round < c.rounds; ++round) {
    {  // compute only, every rank busy at once: replicated layers, no communication
      std::vector<torch::Tensor> params;
      std::vector<std::vector<torch::Tensor>> replicas;
      for (const auto& layer : init) {
        replicas.emplace_back();
        for (const auto& t : layer) replicas.back().push_back(t.clone().requires_grad_(true));
        params.insert(params.end(), replicas.back().begin(), replicas.back().end());
      }
      torch::optim::Adam adam(params, torch::optim::AdamOptions(1e-3));
      std::vector<double> f, b, o;
      for (int s = -1; s < c.steps; ++s) {
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
        if (s < 0) continue;  // warm-up (Adam's state appears)
        f.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        b.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
        o.push_back(std::chrono::duration<double, std::milli>(t3 - t2).count());
      }
      forward.push_back(workshop::median(f)), backward.push_back(workshop::median(b));
      optimizer.push_back(workshop::median(o));
    }
    for (int k = 0; k < kProcModes; ++k) {
      last[static_cast<size_t>(k)] = train_rank(comm, kProcMode[k], init, xr, yr, c.steps, /*warm_up=*/true);
      round_ms[static_cast<size_t>(k)].push_back(last[static_cast<size_t>(k)].median_ms);
    }
  }
  std::ostringstream out;
  out << std::setprecision(17) << "probe " << probe_ms << " " << probe_sent << "\n"
      << "compute " << workshop::median(forward) << " " << workshop::median(backward) << " "
      << workshop::median(optimizer) << "\n";
  for (int k = 0; k < kProcModes; ++k) {
    const StepFigures& f = last[static_cast<size_t>(k)];
    out << "row " << k << " " << f.persistent << " " << f.sent + f.agreement_sent << " " << f.calls;
    for (double ms : round_ms[static_cast<size_t>(k)]) out << " " << ms;
    out << "\n";
  }
  return out.str();
}

// --world_size=N: the step comparison with N ranks as processes; on namespaces with --netns and --hosts.
int run_processes(const workshop::Flags& flags, bool quick, const std::string& csv_dir) {
  const int world_size = static_cast<int>(flags.get_int("world_size", 2));
  TORCH_CHECK(world_size >= 1 && world_size <= 16, "--world_size must be in 1 .. 16, got ", world_size);
  ProcConfig c;
  if (quick) c.layers = 4, c.width = 256, c.items = 64, c.steps = 3;
  c.rounds = static_cast<int>(flags.get_int("rounds", 1));
  c.steps = static_cast<int>(flags.get_int("steps", c.steps));
  c.layers = static_cast<int>(flags.get_int("layers", c.layers));
  c.width = flags.get_int("width", c.width);
  c.items = flags.get_int("items_per_rank", c.items);
  TORCH_CHECK(c.rounds >= 1 && c.rounds <= 20, "--rounds must be in 1 .. 20, got ", c.rounds);
  TORCH_CHECK(c.steps >= 1 && c.steps <= 1000, "--steps must be in 1 .. 1000, got ", c.steps);
  TORCH_CHECK(c.layers >= 1 && c.width >= 1 && c.items >= 1, "--layers, --width, --items_per_rank must be >= 1");
  const ranks::LinkFlags link = ranks::link_flags(flags.get_double("link_gbit", 0), flags.get_double("sim_delay_ms", 0),
                                                  flags.get_double("link_delay_ms", 0));
  const double delay_ms = link.delay_ms, link_delay_ms = link.link_delay_ms, link_gbit = link.gbit;
  c.delay_us = static_cast<int64_t>(std::llround(delay_ms * 1000));
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
  std::cout << ranks::link_line(flags.get("link", on_netns ? "veth" : "loopback"), link_gbit, delay_ms, link_delay_ms,
                                "the measured all-gather")
            << "\n\n";

  ranks::Launch l;
  l.prefix = "l7", l.who = "lesson 7 demo", l.world_size = world_size, l.args = proc_args(c);
  l.network = network.hosts.empty() ? nullptr : &network;
  std::istringstream in(ranks::launch(l));

  double probe_ms = 0, probe_sent = 0, forward = 0, backward = 0, optimizer = 0;
  struct Row {
    double kept = 0, sent = 0, calls = 0;
    std::vector<double> round_ms;
  };
  std::vector<Row> rows(kProcModes);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key;
    words >> key;
    if (key == "probe") words >> probe_ms >> probe_sent;
    if (key == "compute") words >> forward >> backward >> optimizer;
    if (key == "row") {
      int k = 0;
      words >> k;
      Row& row = rows.at(static_cast<size_t>(k));
      words >> row.kept >> row.sent >> row.calls;
      double ms = 0;
      while (words >> ms) row.round_ms.push_back(ms);
    }
  }
  const double measured_bytes_per_s = probe_sent / (probe_ms * 1e-3);
  const double bytes_per_s = link_gbit > 0 ? link_gbit * 1e9 / 8 : measured_bytes_per_s;
  // [demo_napkin]
  // Compute: DDP's forward + backward + Adam on every parameter; the sharded step's forward twice (the backward
  // recomputes each layer from its gathered parameters) + backward + Adam on 1/N. Communication: the bytes this
  // rank sent per step (counted) at the link's rate, plus the simulated delay per call. No prefetch, DDP: the
  // two in turn; prefetch: at best the larger of the two.
  const double delay_per_call_ms = delay_ms + link_delay_ms;
  std::vector<double> compute_ms(kProcModes), comm_ms(kProcModes), napkin_ms(kProcModes);
  for (int k = 0; k < kProcModes; ++k) {
    const Row& row = rows[static_cast<size_t>(k)];
    const bool sharded = kProcMode[k] != Mode::kDdp;
    compute_ms[k] = sharded ? 2 * forward + backward + optimizer / world_size : forward + backward + optimizer;
    comm_ms[k] = row.sent / bytes_per_s * 1e3 + row.calls * delay_per_call_ms;
    napkin_ms[k] = kProcMode[k] == Mode::kPrefetch ? std::max(compute_ms[k], comm_ms[k]) : compute_ms[k] + comm_ms[k];
  }
  // [demo_napkin]
  std::cout << "Napkin math: link " << workshop::fixed(bytes_per_s * 8 / 1e9, 3) << " Gbit/s per rank ("
            << (link_gbit > 0 ? "kernel-shaped rate" : "measured") << "; one all-gather of the model measured "
            << workshop::fixed(measured_bytes_per_s * 8 / 1e9, 3) << "), " << workshop::fixed(delay_per_call_ms, 3)
            << " ms latency per call; compute with no communication: forward " << workshop::fixed(forward, 2)
            << " ms, backward " << workshop::fixed(backward, 2) << " ms, Adam " << workshop::fixed(optimizer, 2)
            << " ms (every rank busy at once, median of rounds)\n";
  workshop::Table table("lesson7_network",
                        {"training", "ranks", "bytes kept / rank", "MiB sent / rank / step", "calls / step",
                         "step ms (median of rounds)", "napkin ms", "measured / napkin", "napkin: compute",
                         "napkin: communication", "round medians ms"});
  std::vector<double> step_ms(kProcModes);
  for (int k = 0; k < kProcModes; ++k) {
    const Row& row = rows[static_cast<size_t>(k)];
    step_ms[k] = workshop::median(row.round_ms);
    std::string rounds_text;
    for (double ms : row.round_ms) rounds_text += (rounds_text.empty() ? "" : " ") + workshop::fixed(ms, 1);
    table.add({kProcName[k], std::to_string(world_size), std::to_string(static_cast<int64_t>(row.kept)),
               workshop::fixed(row.sent / (1024.0 * 1024.0), 3), std::to_string(static_cast<int64_t>(row.calls)),
               workshop::fixed(step_ms[k], 2), workshop::fixed(napkin_ms[k], 2),
               workshop::fixed(step_ms[k] / napkin_ms[k], 2), workshop::fixed(compute_ms[k], 2),
               workshop::fixed(comm_ms[k], 2), rounds_text});
  }
  const std::string path = table.emit(csv_dir);
  if (!path.empty()) std::cout << "wrote " << path << "\n";
  const double bound = std::max(compute_ms[2], comm_ms[2]);
  const double ratio = step_ms[2] / bound;
  std::cout << "Prefetch saves " << workshop::fixed(step_ms[1] - step_ms[2], 2) << " ms per step ("
            << workshop::fixed(step_ms[1], 2) << " -> " << workshop::fixed(step_ms[2], 2) << " ms); at most "
            << workshop::fixed(std::min(compute_ms[2], comm_ms[2]), 2)
            << " ms can hide (the smaller of compute and communication)\n"
            << "Verdict: with prefetch the step is " << workshop::fixed(ratio, 2) << "x max(compute "
            << workshop::fixed(compute_ms[2], 2) << " ms, communication " << workshop::fixed(comm_ms[2], 2)
            << " ms) — within 1.5x: " << (ratio <= 1.5 ? "met" : "NOT MET") << "\n";
  workshop::append_summary(csv_dir, {{"7 fsdp", "step ms, fully sharded: no prefetch vs prefetch", step_ms[1],
                                      step_ms[2], cpu + (on_netns ? ", network namespaces" : ", loopback")}});
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
        "N: start N ranks as processes and time the step DDP-style and fully sharded without and "
        "with prefetch, beside the napkin (without it: 2 ranks as threads, the tables below)"},
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
