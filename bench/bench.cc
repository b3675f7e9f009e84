// Benchmarks, side by side: each case runs its baseline and its improved variants in one process on one
// device, warmed up, repeated, synchronised, on random (non-zero) inputs, and reports medians, spread and
// ratios — never a bare time. Beside each, the napkin math: FLOPs and bytes of the workload, the device's
// ceilings measured in the same run (matmul per dtype, memory copy), and the fraction achieved.
//
//   bazel run //bench -- [--device=best|cpu|cuda] [--quick] [--out_dir=DIR] [--cases=l1,l2,l3,l4,l5,scaler]
//                        [--world_sizes=2,4]
//                        [--peer=on|off] [--peer_python=PATH] [--threads=N] [--rounds=N]
//
// Beside our rows, the same run times PyTorch's own implementations from Python (bench/peer.py, a subprocess
// given the same sizes, seed, thread count and device): torch.autocast and its GradScaler, the accumulation
// loop, torch.utils.checkpoint.checkpoint_sequential, and the GradScaler's own cost. The interpreter is
// --peer_python, else $WORKSHOP_PEER_PYTHON, else /usr/bin/python3 (Debian's python3-torch); without torch
// there the bench says so and runs our rows alone.
//
// With --out_dir it writes DIR/bench_<device kind>.csv (machine-readable) and DIR/bench_<device kind>.md
// (Markdown tables headed by device, LibTorch and PyTorch versions, date and command), which docs/results/ keeps.
// CSV: one line per implementation and workload; impl is ours or pytorch; ratio is ours' speed-up over the
// benchmark's first variant (ours lines), ours_over_pytorch_time is our median over PyTorch's (pytorch lines);
// peak_or_bytes is our meter's peak (or the napkin bytes of the scaler), same_way_peak_bytes the peak both sides
// measure the same way (bench/peer_runner.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "bench/peer_runner.h"
#include "common/device.h"
#include "common/memory_meter.h"
#include "common/report.h"
#include "lesson1_amp/autocast.h"
#include "lesson1_amp/grad_scaler.h"
#include "lesson2_accumulation/accumulation.h"
#include "lesson3_profiling/bottleneck.h"
#include "lesson4_memory/breakdown.h"
#include "lesson4_memory/planner.h"
#include "lesson4_memory/workload.h"
#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/demo_ranks.h"
#include "common/compat/compat.h"

namespace {

using workshop::fixed;

struct Row {
  std::string bench;    // which lesson's claim
  std::string variant;  // baseline or improvement
  workshop::Timing timing;
  double flops = 0;     // per repetition
  double bytes = 0;     // moved per repetition (napkin), or peak bytes for memory cases
  double ceiling = 0;   // the relevant measured ceiling (FLOP/s or B/s), 0 if none
  std::string ceiling_name;
  double ratio = 0;     // baseline median / this median (speed-up), or baseline bytes / these bytes
  std::string note;
  std::string key;               // the PyTorch peer's row for the same workload ("" if it has none)
  int64_t same_way_peak = -1;    // peak bytes measured as the peer measures its own (-1: not measured)
};

// The GradScaler's own cost, one implementation per row.
struct ScalerRow {
  std::string name;
  workshop::Timing timing{};
  std::string unavailable;  // non-empty: not run here, and why
  std::string note;
};

struct Context {
  torch::Device device{torch::kCPU};
  bool quick = false;
  std::vector<Row> rows;
  double matmul_ceiling_fp32 = 0, matmul_ceiling_tf32 = 0, matmul_ceiling_bf16 = 0, matmul_ceiling_fp16 = 0;
  double copy_ceiling = 0;
  std::vector<std::pair<int, double>> loopback_ceilings;  // lesson 5: (ranks, B/s sent per rank, ring napkin)
  std::unique_ptr<bench::Peer> peer;
  std::vector<ScalerRow> scaler_rows;
  int64_t scaler_tensors = 0, scaler_elements = 0;
  std::vector<std::string> notes;  // what differs between ours and PyTorch's, in structure (for the report)
};

void set_tf32(bool on) {
  // Present in LibTorch 1.13 and 2.x; only CUDA matmuls read it.
  at::globalContext().setAllowTF32CuBLAS(on);
}

// Whether this LibTorch runs float16 autocast on the bench's device (CUDA always; CPU from 2.3, see compat.h).
bool fp16_autocast(const Context& c) {
  return c.device.is_cuda() || workshop::compat::cpu_autocast_supports(torch::kHalf);
}

// ---- ceilings ---------------------------------------------------------------------------------------------

double measure_matmul(Context& c, torch::ScalarType dtype, bool tf32) {
  const int64_t n = c.device.is_cuda() ? 8192 : (c.quick ? 512 : 1024);
  set_tf32(tf32);
  const auto a = torch::randn({n, n}, torch::dtype(dtype).device(c.device));
  const auto b = torch::randn({n, n}, torch::dtype(dtype).device(c.device));
  auto out = torch::empty({n, n}, torch::dtype(dtype).device(c.device));
  const auto t = workshop::time_repeated(c.device, [&] { torch::mm_out(out, a, b); }, 3, c.quick ? 5 : 10);
  set_tf32(false);
  return 2.0 * n * n * n / (t.median_ms * 1e-3);
}

double measure_copy(Context& c) {
  const int64_t n = c.device.is_cuda() ? (int64_t{1} << 28) : (int64_t{1} << (c.quick ? 23 : 25));  // floats
  const auto src = torch::randn({n}, c.device);
  auto dst = torch::empty({n}, c.device);
  const auto t = workshop::time_repeated(c.device, [&] { dst.copy_(src); }, 3, c.quick ? 5 : 10);
  return 2.0 * 4.0 * n / (t.median_ms * 1e-3);  // read + write
}

void measure_ceilings(Context& c) {
  std::cout << "measuring ceilings (matmul per dtype, copy bandwidth) ..." << std::endl;
  c.matmul_ceiling_fp32 = measure_matmul(c, torch::kFloat, false);
  c.matmul_ceiling_bf16 = measure_matmul(c, torch::kBFloat16, false);
  if (c.device.is_cuda()) c.matmul_ceiling_tf32 = measure_matmul(c, torch::kFloat, true);
  if (fp16_autocast(c)) c.matmul_ceiling_fp16 = measure_matmul(c, torch::kHalf, false);
  c.copy_ceiling = measure_copy(c);
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : separator) + p;
  return out;
}

// ---- lesson 1: float32 vs TF32 vs autocast ----------------------------------------------------------------

void bench_lesson1(Context& c) {
  const bool cuda = c.device.is_cuda();
  const int64_t width = cuda ? 8192 : (c.quick ? 256 : 1024), depth = 4, batch = cuda ? 16384 : (c.quick ? 128 : 512);
  const int warmup = 3, repeats = c.quick ? 5 : 15;
  std::cout << "lesson 1: MLP " << depth << " x " << width << ", batch " << batch << std::endl;
  struct Variant {
    std::string key;  // peer.py's name for it
    std::string name;
    bool autocast;
    torch::ScalarType dtype;
    bool tf32;
    double ceiling;
    std::string ceiling_name;
  };
  std::vector<Variant> variants{{"fp32", "float32", false, torch::kFloat, false, c.matmul_ceiling_fp32, "fp32 matmul"}};
  if (cuda) variants.push_back({"tf32", "TF32 matmuls", false, torch::kFloat, true, c.matmul_ceiling_tf32, "tf32 matmul"});
  variants.push_back({"bf16", "autocast bfloat16", true, torch::kBFloat16, false, c.matmul_ceiling_bf16, "bf16 matmul"});
  if (fp16_autocast(c)) {
    variants.push_back({"fp16", "autocast float16 + GradScaler", true, torch::kHalf, false, c.matmul_ceiling_fp16,
                        "fp16 matmul"});
  }
  const double flops = 6.0 * batch * depth * width * width;  // forward 2, backward 4 FLOPs per weight per item
  double baseline_ms = 0;
  std::vector<std::string> keys;
  for (const auto& v : variants) {
    torch::manual_seed(0);
    torch::nn::Sequential model;
    for (int64_t i = 0; i < depth; ++i) {
      model->push_back(torch::nn::Linear(width, width));
      model->push_back(torch::nn::ReLU());
    }
    model->to(c.device);
    const auto x = torch::randn({batch, width}, c.device);
    const auto y = torch::randn({batch, width}, c.device);
    torch::optim::SGD sgd(model->parameters(), 1e-4);
    amp::GradScalerOptions so;
    so.enabled = v.autocast && v.dtype == torch::kHalf;
    amp::GradScaler scaler(so);
    amp::StepOptions options;
    options.device = c.device.type();
    options.dtype = v.dtype;
    options.autocast = v.autocast;
    set_tf32(v.tf32);
    const auto step = [&] {
      amp::train_step(sgd, scaler, [&] { return torch::mse_loss(model->forward(x).to(torch::kFloat), y); }, options);
    };
    const auto t = workshop::time_repeated(c.device, step, warmup, repeats);
    workshop::MemoryMeter meter(c.device);
    step();
    const double peak = static_cast<double>(meter.peak_bytes());
    const int64_t same_way = bench::same_way_peak_bytes(c.device, step);
    set_tf32(false);
    if (baseline_ms == 0) baseline_ms = t.median_ms;
    Row row{"lesson 1: training step", v.name, t, flops, peak, v.ceiling, v.ceiling_name, baseline_ms / t.median_ms,
            "peak " + workshop::mib(peak), "l1." + v.key, same_way};
    c.rows.push_back(row);
    keys.push_back(v.key);
  }
  c.peer->run("l1", "width=" + std::to_string(width) + ",depth=" + std::to_string(depth) + ",batch=" +
                        std::to_string(batch) + ",warmup=" + std::to_string(warmup) + ",repeats=" +
                        std::to_string(repeats) + ",variants=" + join(keys, "+"));
}

// ---- lesson 2: memory and time vs K ---------------------------------------------------------------------

void bench_lesson2(Context& c) {
  const int64_t batch = c.quick ? 256 : 1024, width = c.device.is_cuda() ? 4096 : (c.quick ? 256 : 1024);
  const int warmup = 2, repeats = c.quick ? 3 : 10;
  const std::vector<int64_t> ks{1, 4, 16};
  std::cout << "lesson 2: effective batch " << batch << ", MLP width " << width << std::endl;
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(256, width), torch::nn::ReLU(), torch::nn::Linear(width, width),
                              torch::nn::ReLU(), torch::nn::Linear(width, 16));
  model->to(c.device);
  const auto x = torch::randn({batch, 256}, c.device);
  const auto y = torch::randn({batch, 16}, c.device);
  torch::optim::SGD sgd(model->parameters(), 1e-4);
  const accum::LossFn loss = [&](const accum::MicroBatch& mb) {
    return torch::mse_loss(model->forward(mb.input), mb.target);
  };
  double baseline_ms = 0, baseline_bytes = 0;
  std::vector<std::string> k_names;
  for (int64_t k : ks) {
    const auto micro = accum::split_batch(x, y, batch / k);
    accum::AccumulationOptions options;
    options.accumulation_steps = k;
    const auto window = [&] { accum::train_accumulated(sgd, micro, loss, options); };
    window();  // warm-up, allocates .grad
    workshop::MemoryMeter meter(c.device);
    window();
    const double peak = static_cast<double>(meter.peak_bytes());
    const int64_t same_way = bench::same_way_peak_bytes(c.device, window);
    const auto t = workshop::time_repeated(c.device, window, warmup, repeats);
    if (k == 1) {
      baseline_ms = t.median_ms;
      baseline_bytes = peak;
    }
    Row row{"lesson 2: accumulation", "K=" + std::to_string(k) + " (micro-batch " + std::to_string(batch / k) + ")",
            t, 6.0 * batch * (256.0 * width + width * width + width * 16.0), peak, c.matmul_ceiling_fp32,
            "fp32 matmul", baseline_ms / t.median_ms,
            "peak " + workshop::mib(peak) + ", " + fixed(baseline_bytes / std::max(peak, 1.0), 2) + "x less than K=1",
            "l2.k" + std::to_string(k), same_way};
    c.rows.push_back(row);
    k_names.push_back(std::to_string(k));
  }
  c.peer->run("l2", "batch=" + std::to_string(batch) + ",width=" + std::to_string(width) + ",warmup=" +
                        std::to_string(warmup) + ",repeats=" + std::to_string(repeats) + ",ks=" + join(k_names, "+"));
}

// ---- lesson 3: the planted loop before and after the fix ---------------------------------------------------

void bench_lesson3(Context& c) {
  prof::TrainerOptions options;
  if (c.device.is_cuda()) {
    options.samples = 65536;
    options.batch = 4096;
    options.features = 256;
    options.hidden = 1024;
  }
  std::cout << "lesson 3: planted loop vs fixed loop, batch " << options.batch << std::endl;
  prof::Trainer slow(options, c.device), fast(options, c.device);
  fast.prepare();
  const int repeats = c.quick ? 5 : 20;
  const auto t_slow = workshop::time_repeated(c.device, [&] { slow.slow_step(); }, 3, repeats);
  const auto t_fast = workshop::time_repeated(c.device, [&] { fast.fast_step(); }, 3, repeats);
  const double flops = 6.0 * options.batch * (options.features * options.hidden + options.hidden * options.classes);
  // No PyTorch peer: the planted problems are this lesson's own loop, not a library feature.
  c.rows.push_back(Row{"lesson 3: training loop", "planted problems (sync, data in step, tiny ops)", t_slow, flops, 0,
                       0, "", 1.0, "", "", -1});
  c.rows.push_back(Row{"lesson 3: training loop", "fixed", t_fast, flops, 0, 0, "", t_slow.median_ms / t_fast.median_ms,
                       "", "", -1});
}

// ---- lesson 4: peak bytes and time per technique ----------------------------------------------------------

// The layers per segment of a checkpoint_sequential over `layers` layers in `segments` segments, the last
// (run plainly) after the bar: ours splits evenly (the first layers % segments get one more); PyTorch's makes
// segments - 1 checkpointed segments of layers / segments and gives the rest to the last.
std::string split_of(int64_t layers, int64_t segments, bool pytorch) {
  std::vector<int64_t> sizes;
  for (int64_t s = 0; s < segments; ++s) {
    if (pytorch) {
      sizes.push_back(s + 1 < segments ? layers / segments : layers - (segments - 1) * (layers / segments));
    } else {
      sizes.push_back(layers / segments + (s < layers % segments ? 1 : 0));
    }
  }
  std::string out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out += (i == 0 ? "" : (i + 1 == sizes.size() ? " | " : "+")) + std::to_string(sizes[i]);
  }
  return out;
}

void bench_lesson4(Context& c) {
  mem::MlpSpec spec;
  spec.layers = 32;
  spec.width = c.device.is_cuda() ? 1024 : (c.quick ? 64 : 128);
  spec.batch = c.device.is_cuda() ? 8192 : (c.quick ? 1024 : 2048);
  const int timed = c.quick ? 3 : 10;
  std::cout << "lesson 4: MLP " << spec.layers << " x " << spec.width << ", batch " << spec.batch << std::endl;
  struct Variant {
    std::string name;
    mem::Recipe recipe;
  };
  mem::Recipe plain, checkpointed, low, accumulated;
  checkpointed.segments = 6;
  low = checkpointed;
  low.low_precision = true;
  accumulated = low;
  accumulated.micro_batch = spec.batch / 4;
  const std::vector<Variant> variants{{"plain", plain},
                                      {"checkpointed (6 segments)", checkpointed},
                                      {"+ 16-bit autocast", low},
                                      {"+ accumulation (4 micro-batches)", accumulated}};
  double base_ms = 0, base_bytes = 0;
  std::vector<std::string> recipes;
  for (const auto& v : variants) {
    const mem::StepMemory m = mem::measure_training(spec, v.recipe, c.device, timed);
    const double peak = static_cast<double>(m.step_peak_bytes);
    // The same step once more, its peak measured as the peer measures PyTorch's (after the same warm-up).
    int64_t same_way = -1;
    {
      torch::nn::Sequential model = mem::make_deep_mlp(spec, c.device);
      auto batch = mem::make_batch(spec, c.device);
      torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
      const auto step = [&] { mem::train_step(model, adam, batch.first, batch.second, v.recipe); };
      step();  // warm-up: creates Adam's state
      mem::set_grads_to_none(model->parameters());
      same_way = bench::same_way_peak_bytes(c.device, step, [&] { mem::set_grads_to_none(model->parameters()); });
    }
    if (base_ms == 0) {
      base_ms = m.median_step_ms;
      base_bytes = peak;
    }
    const std::string recipe = std::to_string(v.recipe.micro_batch) + ":" + std::to_string(v.recipe.segments) + ":" +
                               (v.recipe.low_precision ? "1" : "0");
    recipes.push_back(recipe);
    std::string key = recipe;
    std::replace(key.begin(), key.end(), ':', '_');
    workshop::Timing timing{m.median_step_ms, m.median_step_ms, m.median_step_ms, {}};
    c.rows.push_back(Row{"lesson 4: memory", v.name, timing, 6.0 * spec.batch * spec.layers * spec.width * spec.width,
                         peak, 0, "", base_ms / m.median_step_ms,
                         "step peak " + workshop::mib(peak) + ", " + fixed(base_bytes / std::max(peak, 1.0), 2) +
                             "x lower",
                         "l4." + key, same_way});
  }
  c.peer->run("l4", "layers=" + std::to_string(spec.layers) + ",width=" + std::to_string(spec.width) + ",batch=" +
                        std::to_string(spec.batch) + ",timed=" + std::to_string(timed) + ",recipes=" + join(recipes, "+"));
  c.notes.push_back("Lesson 4, segments: " + std::to_string(spec.layers) + " layers in 6 segments are " +
                    split_of(spec.layers, 6, false) + " (ours) and " + split_of(spec.layers, 6, true) +
                    " (PyTorch's checkpoint_sequential), the last segment, after the bar, runs without checkpointing: "
                    "its activations stay, so the larger last segment keeps more bytes.");
  if (c.peer->available()) {
    const bench::PeerRow* r = c.peer->find("l4.0_6_0");
    if (r != nullptr && r->what.find("non-reentrant") == std::string::npos) {
      c.notes.push_back("Lesson 4, mode: this PyTorch's checkpoint_sequential is reentrant only, which gives the first "
                        "segment's parameters no gradient unless the segment input requires grad; the peer sets "
                        "requires_grad on the input, which adds the input gradient of layer 1 (one matmul) that ours "
                        "skips (its checkpoint takes the parameters explicitly).");
    }
  }
}

// ---- the GradScaler's own cost ------------------------------------------------------------------------------

// An optimizer whose step does nothing: what is timed is the scaler, not the parameter update.
class NoopOptimizer : public torch::optim::Optimizer {
 public:
  explicit NoopOptimizer(std::vector<torch::Tensor> params)
      : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                  std::make_unique<torch::optim::SGDOptions>(0.0)) {}
  torch::Tensor step(LossClosure /*closure*/) override { return {}; }
};

void bench_scaler(Context& c) {
  // 128 layers of (weight [width, width], bias [width]): 256 gradient tensors, as a deep model has.
  const int64_t layers = 128, width = c.device.is_cuda() ? 1024 : (c.quick ? 64 : 256);
  const int warmup = 3, repeats = c.quick ? 5 : 20;
  torch::manual_seed(0);
  std::vector<torch::Tensor> params;
  for (int64_t i = 0; i < layers; ++i) {
    params.push_back(torch::randn({width, width}, c.device).requires_grad_());
    params.push_back(torch::randn({width}, c.device).requires_grad_());
  }
  c.scaler_elements = 0;
  for (auto& p : params) {
    p.mutable_grad() = torch::randn_like(p);
    c.scaler_elements += p.numel();
  }
  c.scaler_tensors = static_cast<int64_t>(params.size());
  std::cout << "GradScaler cost: " << c.scaler_tensors << " gradient tensors, " << c.scaler_elements << " elements"
            << std::endl;
  NoopOptimizer optimizer(params);
  const auto loss = torch::ones({}, c.device);
  struct Path {
    std::string name;
    amp::KernelPath kernels;
    std::string note;
  };
  const std::vector<Path> paths{
      {"ours, plain ops (kPlain)", amp::KernelPath::kPlain,
       "5 ops per gradient (`isfinite`, `all`, `logical_not`, `masked_fill_`, `mul_`): " +
           std::to_string(5 * c.scaler_tensors) + " ops"},
      {"ours, fused ATen kernels (kFused)", amp::KernelPath::kFused,
       "one `_amp_foreach_non_finite_check_and_unscale_` over all gradients"}};
  for (const auto& path : paths) {
    ScalerRow row{path.name, {}, "", path.note};
    if (path.kernels == amp::KernelPath::kFused && !workshop::compat::has_fused_amp_kernels(c.device.type())) {
      row.unavailable = "not available in LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." +
                        std::to_string(TORCH_VERSION_MINOR) + " on CPU (CPU kernels arrived in 2.3)";
      c.scaler_rows.push_back(row);
      continue;
    }
    amp::GradScalerOptions options;
    // Scale 1: unscaling over and over keeps the gradients' values (no drift into subnormals, slow on CPUs);
    // the work per step is the same for any scale.
    options.init_scale = 1.0;
    options.kernels = path.kernels;
    amp::GradScaler scaler(options);
    row.timing = workshop::time_repeated(c.device, [&] {
      scaler.scale(loss);
      scaler.step(optimizer);  // unscale_, one .item() sync, the (no-op) step
      scaler.update();
    }, warmup, repeats);
    c.scaler_rows.push_back(row);
  }
  c.peer->run("scaler", "layers=" + std::to_string(layers) + ",width=" + std::to_string(width) + ",warmup=" +
                            std::to_string(warmup) + ",repeats=" + std::to_string(repeats));
  ScalerRow theirs{"PyTorch's GradScaler", {}, "", ""};
  const bench::PeerRow* r = c.peer->find("scaler.pytorch");
  if (!c.peer->available()) {
    theirs.unavailable = "PyTorch peer not run: " + c.peer->missing();
  } else if (r == nullptr) {
    theirs.unavailable = "the peer returned no row";
  } else if (!r->unavailable.empty()) {
    theirs.unavailable = r->unavailable + " (PyTorch " + c.peer->torch_version() + ")";
  } else {
    theirs.timing = workshop::Timing{r->median_ms, r->min_ms, r->max_ms, {}};
    theirs.note = r->what;
  }
  c.scaler_rows.push_back(theirs);
}

// ---- lesson 5: data parallel on N ranks (processes, Gloo over loopback) ----------------------------------------
// The ranks are processes of this binary (demo_ranks.h). Rows: per-parameter all-reduce, bucketed, bucketed +
// overlap, ZeRO-1, for each world size; the loopback ceiling is one large all-reduce timed in the same run.
// Seam for other data-parallel rows (e.g. PyTorch's DDP on the same model): add them to c.rows after these,
// with bench = "lesson 5: data parallel (N=<ranks>)" and the per-parameter row's median as the baseline.

void bench_lesson5(Context& c, const std::vector<int>& world_sizes) {
  for (int n : world_sizes) {
    const l5demo::Config config = l5demo::config_for(c.quick, n);
    std::cout << "lesson 5: " << n << " ranks, MLP " << config.depth << " x " << config.width << ", batch "
              << config.batch << ", bucket budget " << workshop::mib(static_cast<double>(config.bucket_bytes))
              << std::endl;
    double probe_ms = 0;
    int64_t probe_bytes = 0;
    const std::vector<l5demo::Result> results =
        l5demo::launch(config, c.quick, std::chrono::seconds(600), &probe_ms, &probe_bytes);
    const double ceiling = dist::ring_allreduce_wire_bytes(static_cast<double>(probe_bytes), n) / (probe_ms * 1e-3);
    c.loopback_ceilings.push_back({n, ceiling});
    const double base_ms = results.front().median_ms;
    // Forward + backward of one rank's share: 6 FLOPs per item per weight (the GFLOP/s column is per rank).
    const double flops_per_rank = 6.0 * (config.batch / n) * config.depth * config.width * config.width;
    for (const auto& r : results) {
      workshop::Timing t{r.median_ms, r.min_ms, r.max_ms, {}};
      // If the whole step were communication at the loopback ceiling, how long would the napkin bytes take?
      const double comm_floor_ms = r.napkin_bytes_per_step / ceiling * 1e3;
      c.rows.push_back(Row{"lesson 5: data parallel (N=" + std::to_string(n) + ")", r.variant, t, flops_per_rank,
                           r.napkin_bytes_per_step, 0, "", base_ms / r.median_ms,
                           std::to_string(r.collectives_per_step) + " calls/step, payload " +
                               workshop::mib(r.payload_bytes_per_step) + ", napkin " +
                               workshop::mib(r.napkin_bytes_per_step) + " sent/rank (" + fixed(comm_floor_ms, 2) +
                               " ms at the loopback ceiling); optimizer state " +
                               workshop::mib(static_cast<double>(r.optimizer_state_bytes)) + "/rank",
                           /*key=*/"", /*same_way_peak=*/-1});
    }
  }
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

// "1.12x (ours 12% slower)" / "0.80x (ours 20% faster)" for ours / theirs of a time; "less"/"more" for bytes.
std::string versus(double ours, double theirs, bool time) {
  if (ours <= 0 || theirs <= 0) return "-";
  const double r = ours / theirs;
  const double pct = std::abs(r - 1.0) * 100.0;
  std::string word = time ? (r > 1 ? "slower" : "faster") : (r > 1 ? "more" : "less");
  if (pct < 0.5) return fixed(r, 2) + "x (same)";
  return fixed(r, 2) + "x (ours " + fixed(pct, 0) + "% " + word + ")";
}

// The 1-minute load average ("" where /proc/loadavg is not readable): on a shared machine, how much else ran.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string first;
  return in >> first ? first : std::string();
}

// Whether a time difference is resolved by this run: the medians and the fastest steps must both put one side
// ahead by more than 10% (where only medians exist, lesson 4: the two sides' min..max ranges must not overlap).
// Anything else is "within noise": on a shared machine a bare median ratio is not evidence.
std::string time_verdict(const workshop::Timing& ours, const bench::PeerRow& theirs) {
  const double median = ours.median_ms / theirs.median_ms;
  if (ours.samples_ms.empty()) {
    if (ours.min_ms > theirs.max_ms) return "ours slower";
    if (ours.max_ms < theirs.min_ms) return "ours faster";
    return "within noise";
  }
  const double fastest = ours.min_ms / theirs.min_ms;
  if (median > 1.1 && fastest > 1.1) return "ours slower";
  if (median < 1 / 1.1 && fastest < 1 / 1.1) return "ours faster";
  return "within noise";
}

std::string peak_cell(int64_t bytes) { return bytes < 0 ? "-" : workshop::mib(static_cast<double>(bytes)); }

}  // namespace

int main(int argc, char** argv) {
  const int rank_exit = l5demo::maybe_run_as_rank(argc, argv);  // lesson 5 starts its ranks as copies of this binary
  if (rank_exit >= 0) return rank_exit;
  try {
    workshop::Flags flags(argc, argv, {{"device", "best (default), cpu, cuda"},
                                       {"quick", "small sizes (a smoke run)"},
                                       {"cases", "comma-separated: l1,l2,l3,l4,l5,scaler (default all)"},
                                       {"world_sizes", "lesson 5 ranks, comma-separated (default 2,4; --quick: 2)"},
                                       {"out_dir", "write bench_<device>.csv and .md there"},
                                       {"threads", "ATen intra-op threads, ours and the peer's (default: LibTorch's)"},
                                       {"peer", "on (default): run PyTorch's implementations beside ours; off"},
                                       {"rounds", "run each case (ours, then PyTorch's) this many times; medians of "
                                                  "the rounds' medians (default 1)"},
                                       {"peer_python", "the peer's interpreter (default $WORKSHOP_PEER_PYTHON, "
                                                       "else /usr/bin/python3)"},
                                       {"peer_script", "bench/peer.py (default: from the runfiles)"}});
    Context c;
    c.device = workshop::parse_device(flags.get("device", "best"));
    c.quick = flags.has("quick");
    const std::string cases = "," + flags.get("cases", "l1,l2,l3,l4,l5,scaler") + ",";
    const std::string peer_flag = flags.get("peer", "on");
    TORCH_CHECK(peer_flag == "on" || peer_flag == "off", "--peer must be on or off, got '", peer_flag, "'");
    const int rounds = static_cast<int>(flags.get_int("rounds", 1));
    TORCH_CHECK(rounds >= 1, "--rounds must be >= 1, got ", rounds);
    if (flags.has("threads")) {
      const int64_t threads = flags.get_int("threads", 0);
      TORCH_CHECK(threads >= 1, "--threads must be >= 1, got ", threads);
      at::set_num_threads(static_cast<int>(threads));
    }
    bench::PeerOptions peer_options;
    peer_options.enabled = peer_flag == "on";
    peer_options.python = bench::default_peer_python(flags.get("peer_python", ""));
    peer_options.script = bench::find_peer_script(argv[0], flags.get("peer_script", ""));
    peer_options.device = c.device;
    peer_options.threads = at::get_num_threads();
    c.peer = std::make_unique<bench::Peer>(peer_options);

    std::string command = "bazel run //bench --";
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    const std::string name = workshop::device_name(c.device);
    std::cout << "benchmarks on " << c.device << " (" << name << "), LibTorch " << TORCH_VERSION << ", "
              << at::get_num_threads() << " ATen thread(s)\n";
    if (!c.peer->missing().empty()) {
      std::cout << "PyTorch peer: NOT RUN: " << c.peer->missing() << " Our rows only.\n";
    }

    const std::string load_start = load_average();
    measure_ceilings(c);
    // Each case runs `rounds` times, ours and then PyTorch's each round, so that on a shared machine both sides
    // meet the same spells of other work; a row's time is the median of its rounds' medians.
    double highest_load = load_start.empty() ? 0 : std::stod(load_start);
    const auto run_case = [&](void (*bench_case)(Context&)) {
      const size_t begin = c.rows.size(), scaler_begin = c.scaler_rows.size();
      std::vector<std::vector<double>> medians, scaler_medians;
      for (int round = 0; round < rounds; ++round) {
        if (rounds > 1) std::cout << "round " << round + 1 << " of " << rounds << std::endl;
        const size_t here = c.rows.size(), scaler_here = c.scaler_rows.size();
        bench_case(c);
        medians.resize(c.rows.size() - here);
        scaler_medians.resize(c.scaler_rows.size() - scaler_here);
        for (size_t i = here; i < c.rows.size(); ++i) {
          Row& first = c.rows[begin + (i - here)];
          medians[i - here].push_back(c.rows[i].timing.median_ms);
          first.timing.min_ms = std::min(first.timing.min_ms, c.rows[i].timing.min_ms);
          first.timing.max_ms = std::max(first.timing.max_ms, c.rows[i].timing.max_ms);
        }
        for (size_t i = scaler_here; i < c.scaler_rows.size(); ++i) {
          ScalerRow& first = c.scaler_rows[scaler_begin + (i - scaler_here)];
          scaler_medians[i - scaler_here].push_back(c.scaler_rows[i].timing.median_ms);
          first.timing.min_ms = std::min(first.timing.min_ms, c.scaler_rows[i].timing.min_ms);
          first.timing.max_ms = std::max(first.timing.max_ms, c.scaler_rows[i].timing.max_ms);
        }
        if (round > 0) {
          c.rows.erase(c.rows.begin() + static_cast<std::ptrdiff_t>(here), c.rows.end());
          c.scaler_rows.erase(c.scaler_rows.begin() + static_cast<std::ptrdiff_t>(scaler_here), c.scaler_rows.end());
        }
      }
      const auto median_of = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        const size_t n = v.size();
        return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
      };
      for (size_t i = 0; i < medians.size(); ++i) c.rows[begin + i].timing.median_ms = median_of(medians[i]);
      for (size_t i = 0; i < scaler_medians.size(); ++i) {
        c.scaler_rows[scaler_begin + i].timing.median_ms = median_of(scaler_medians[i]);
      }
      const std::string load_now = load_average();
      if (!load_now.empty()) highest_load = std::max(highest_load, std::stod(load_now));
      // Speed-ups against the first row of the same benchmark, from the summarised medians.
      for (size_t i = begin; i < c.rows.size(); ++i) {
        size_t base = begin;
        while (c.rows[base].bench != c.rows[i].bench) ++base;
        c.rows[i].ratio = c.rows[base].timing.median_ms / c.rows[i].timing.median_ms;
      }
    };
    if (cases.find(",l1,") != std::string::npos) run_case(bench_lesson1);
    if (cases.find(",l2,") != std::string::npos) run_case(bench_lesson2);
    if (cases.find(",l3,") != std::string::npos) run_case(bench_lesson3);
    if (cases.find(",l4,") != std::string::npos) run_case(bench_lesson4);
    if (cases.find(",scaler,") != std::string::npos) {
      run_case(bench_scaler);
      const bench::PeerRow* r = c.peer->find("scaler.pytorch");  // the summary of all rounds
      for (auto& row : c.scaler_rows) {
        if (row.name == "PyTorch's GradScaler" && row.unavailable.empty() && r != nullptr) {
          row.timing = workshop::Timing{r->median_ms, r->min_ms, r->max_ms, {}};
        }
      }
    }
    if (cases.find(",l5,") != std::string::npos) {
      // Ranks are processes of this binary, each round would relaunch them: lesson 5 runs once, whatever --rounds.
      // PyTorch's DistributedDataParallel on the same ranks and sizes is still to come (bench/peer.py, "l5").
      std::vector<int> worlds;
      std::stringstream list(flags.get("world_sizes", c.quick ? "2" : "2,4"));
      for (std::string item; std::getline(list, item, ',');) worlds.push_back(std::stoi(item));
      bench_lesson5(c, worlds);
    }

    const bench::Peer& peer = *c.peer;
    {
      std::vector<std::string> unique;
      for (const auto& note : c.notes) {
        if (std::find(unique.begin(), unique.end(), note) == unique.end()) unique.push_back(note);
      }
      c.notes = unique;
    }
    const std::string load_end = load_average();
    const std::string load = load_start.empty() ? "unknown"
                                                : load_start + " at the start, " + load_end + " at the end, " +
                                                      fixed(highest_load, 2) + " at the highest between cases (" +
                                                      std::to_string(std::thread::hardware_concurrency()) +
                                                      " hardware threads)";
    if (!load_start.empty() && highest_load > static_cast<double>(std::thread::hardware_concurrency())) {
      c.notes.push_back("The machine was shared: a 1-minute load average up to " + fixed(highest_load, 2) + " on " +
                        std::to_string(std::thread::hardware_concurrency()) +
                        " hardware threads means other jobs ran during the measurements, so times move from run to "
                        "run (see the verdict column). Peak bytes do not depend on load.");
    }
    const std::string peer_state =
        peer.available() ? "PyTorch " + peer.torch_version() + " (" + peer.info().at("python") + ", " +
                               peer.info().at("threads") + " thread(s))"
                         : "PyTorch peer NOT RUN: " + (peer.missing().empty() ? peer.failure() : peer.missing());
    if (peer.available()) {
      const std::string libtorch = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
      if (peer.torch_version().rfind(libtorch + ".", 0) != 0) {
        c.notes.push_back("Versions differ: LibTorch " + std::string(TORCH_VERSION) + " against PyTorch " +
                          peer.torch_version() + "; the kernels under the two sides are not the same build.");
      } else {
        c.notes.push_back("Both sides run LibTorch " + libtorch + "'s kernels (PyTorch " + peer.torch_version() +
                          " wraps the same C++ library): what differs is the code around them, ours in C++, "
                          "PyTorch's in Python.");
      }
    }

    workshop::Table table("bench", {"benchmark", "variant", "median ms", "min..max ms", "GFLOP/s", "ceiling",
                                    "of ceiling", "speed-up", "note"});
    for (const auto& r : c.rows) {
      const double achieved = r.flops / (r.timing.median_ms * 1e-3);
      table.add({r.bench, r.variant, fixed(r.timing.median_ms, 2),
                 fixed(r.timing.min_ms, 2) + ".." + fixed(r.timing.max_ms, 2), fixed(achieved / 1e9, 1),
                 r.ceiling > 0 ? fixed(r.ceiling / 1e9, 1) + " (" + r.ceiling_name + ")" : "-",
                 r.ceiling > 0 ? fixed(100.0 * achieved / r.ceiling, 1) + "%" : "-", fixed(r.ratio, 2) + "x",
                 r.note});
    }
    // Ours and PyTorch's, one line per workload.
    workshop::Table versus_table("bench_vs_pytorch",
                                 {"benchmark", "variant", "ours ms", "PyTorch ms", "time ours/PyTorch",
                                  "fastest ours/PyTorch", "time verdict", "ours peak", "PyTorch peak",
                                  "peak ours/PyTorch", "PyTorch code"});
    for (const auto& r : c.rows) {
      if (r.key.empty()) continue;
      const bench::PeerRow* p = peer.find(r.key);
      std::string theirs_ms = "-", time_ratio = "-", min_ratio = "-", verdict = "-", theirs_peak = "-", peak_ratio = "-",
                  what;
      if (!peer.available() && p == nullptr) {
        what = "not run (" + (peer.missing().empty() ? std::string("peer failed") : std::string("peer not installed")) + ")";
      } else if (p == nullptr) {
        what = "no row from the peer";
      } else if (!p->unavailable.empty()) {
        what = p->unavailable;
      } else {
        theirs_ms = fixed(p->median_ms, 2);
        time_ratio = versus(r.timing.median_ms, p->median_ms, true);
        // Lesson 4's rows come from measure_training, which keeps only the median.
        if (!r.timing.samples_ms.empty()) min_ratio = fixed(r.timing.min_ms / p->min_ms, 2) + "x";
        verdict = time_verdict(r.timing, *p);
        theirs_peak = peak_cell(p->peak_bytes);
        if (r.same_way_peak >= 0 && p->peak_bytes >= 0) {
          peak_ratio = versus(static_cast<double>(r.same_way_peak), static_cast<double>(p->peak_bytes), false);
        }
        what = p->what;
      }
      versus_table.add({r.bench, r.variant, fixed(r.timing.median_ms, 2), theirs_ms, time_ratio, min_ratio, verdict,
                        peak_cell(r.same_way_peak), theirs_peak, peak_ratio, what});
    }
    // The scaler alone, with its napkin math: the least a pass over the gradients moves is one read and one
    // write of each (8 bytes per float32 element); at the copy ceiling that takes min_ms.
    const double min_bytes = 8.0 * static_cast<double>(c.scaler_elements);
    const double min_ms = c.copy_ceiling > 0 ? 1e3 * min_bytes / c.copy_ceiling : 0;
    workshop::Table scaler_table("bench_scaler", {"implementation", "median ms", "min..max ms", "vs ours plain",
                                                  "GB/s (8 B/element)", "of copy ceiling", "note"});
    double plain_ms = 0;
    for (const auto& s : c.scaler_rows) {
      if (!s.unavailable.empty()) {
        scaler_table.add({s.name, "-", "-", "-", "-", "-", s.unavailable});
        continue;
      }
      if (plain_ms == 0) plain_ms = s.timing.median_ms;
      const double rate = min_bytes / (s.timing.median_ms * 1e-3);
      scaler_table.add({s.name, fixed(s.timing.median_ms, 3),
                        fixed(s.timing.min_ms, 3) + ".." + fixed(s.timing.max_ms, 3),
                        fixed(plain_ms / s.timing.median_ms, 2) + "x", fixed(rate / 1e9, 1),
                        fixed(100.0 * rate / c.copy_ceiling, 1) + "%", s.note});
    }
    const std::string scaler_napkin =
        "GradScaler cost per step (scale + unscale_ + step with a no-op optimizer + update), " +
        std::to_string(c.scaler_tensors) + " float32 gradient tensors, " + fixed(c.scaler_elements / 1e6, 2) +
        " M elements (" + workshop::mib(4.0 * c.scaler_elements) + "). Napkin math: one pass reads and writes each "
        "gradient once, " + workshop::mib(min_bytes) + " per step; at the measured copy ceiling (" +
        fixed(c.copy_ceiling / 1e9, 1) + " GB/s) that is " + fixed(min_ms, 3) + " ms, the floor. The plain path "
        "makes three passes (`isfinite` reads 4 B and writes 1 B per element, `all` reads 1 B, `mul_` reads and "
        "writes 8 B: about 14 B per element) and launches 5 ops per gradient where the fused path launches one "
        "kernel for all of them.";

    workshop::Table ceilings("bench_ceilings", {"ceiling", "measured", "unit"});
    ceilings.add({"fp32 matmul", fixed(c.matmul_ceiling_fp32 / 1e9, 1), "GFLOP/s"});
    if (c.matmul_ceiling_tf32 > 0) ceilings.add({"tf32 matmul", fixed(c.matmul_ceiling_tf32 / 1e9, 1), "GFLOP/s"});
    ceilings.add({"bf16 matmul", fixed(c.matmul_ceiling_bf16 / 1e9, 1), "GFLOP/s"});
    if (c.matmul_ceiling_fp16 > 0) ceilings.add({"fp16 matmul", fixed(c.matmul_ceiling_fp16 / 1e9, 1), "GFLOP/s"});
    ceilings.add({"memory copy (read+write)", fixed(c.copy_ceiling / 1e9, 1), "GB/s"});
    for (const auto& [n, bytes_per_s] : c.loopback_ceilings) {
      ceilings.add({"all-reduce over loopback, " + std::to_string(n) + " ranks (Gloo, ring napkin bytes sent per rank)",
                    fixed(bytes_per_s / 1e9, 2), "GB/s"});
    }
    ceilings.emit("");
    table.emit("");
    std::cout << "\nOurs and PyTorch's, same workloads, same run: " << peer_state << "\n"
              << "peak: " << bench::same_way_peak_method(c.device) << "\n";
    versus_table.emit("");
    if (!c.scaler_rows.empty()) {
      std::cout << "\n" << scaler_napkin << "\n";
      scaler_table.emit("");
    }
    for (const auto& note : c.notes) std::cout << "note: " << note << "\n";

    std::string out_dir = flags.get("out_dir", "");
    const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");  // set by `bazel run`: where the user ran it
    if (!out_dir.empty() && out_dir[0] != '/' && cwd != nullptr) out_dir = std::string(cwd) + "/" + out_dir;
    if (!out_dir.empty()) {
      const std::string kind = c.device.is_cuda() ? "cuda" : "cpu";
      const std::string date = now_utc();
      const std::string pytorch = peer.available() ? peer.torch_version() : "not run";
      const std::string threads = std::to_string(at::get_num_threads());
      workshop::Table csv("bench_" + kind, {"benchmark", "variant", "impl", "median_ms", "min_ms", "max_ms", "flops",
                                            "peak_or_bytes", "same_way_peak_bytes", "ceiling_flops_per_s", "ceiling",
                                            "ratio", "ours_over_pytorch_time", "note", "device", "libtorch", "pytorch_version", "threads", "date",
                                            "command"});
      const auto add = [&](const std::vector<std::string>& cells) {
        std::vector<std::string> row = cells;
        for (const auto& s : {name, std::string(TORCH_VERSION), pytorch, threads, date, command}) row.push_back(s);
        csv.add(row);
      };
      for (const auto& r : c.rows) {
        add({r.bench, r.variant, "ours", fixed(r.timing.median_ms, 4), fixed(r.timing.min_ms, 4),
             fixed(r.timing.max_ms, 4), fixed(r.flops, 0), fixed(r.bytes, 0),
             r.same_way_peak < 0 ? "" : std::to_string(r.same_way_peak), fixed(r.ceiling, 0), r.ceiling_name,
             fixed(r.ratio, 4), "", r.note});
        const bench::PeerRow* p = r.key.empty() ? nullptr : peer.find(r.key);
        if (p == nullptr) continue;
        if (!p->unavailable.empty()) {
          add({r.bench, r.variant, "pytorch", "", "", "", "", "", "", "", "", "", "", p->unavailable});
        } else {
          add({r.bench, r.variant, "pytorch", fixed(p->median_ms, 4), fixed(p->min_ms, 4), fixed(p->max_ms, 4),
               fixed(r.flops, 0), p->peak_bytes < 0 ? "" : std::to_string(p->peak_bytes),
               p->peak_bytes < 0 ? "" : std::to_string(p->peak_bytes), "", "", "",
               fixed(r.timing.median_ms / p->median_ms, 4), p->what});
        }
      }
      for (const auto& s : c.scaler_rows) {
        const bool theirs = s.name.rfind("PyTorch", 0) == 0;
        if (!s.unavailable.empty()) {
          add({"GradScaler cost", s.name, theirs ? "pytorch" : "ours", "", "", "", "", fixed(min_bytes, 0), "",
               fixed(c.copy_ceiling, 0), "memory copy", "", "", s.unavailable});
        } else {
          add({"GradScaler cost", s.name, theirs ? "pytorch" : "ours", fixed(s.timing.median_ms, 4),
               fixed(s.timing.min_ms, 4), fixed(s.timing.max_ms, 4), "0", fixed(min_bytes, 0), "",
               fixed(c.copy_ceiling, 0), "memory copy", fixed(plain_ms / s.timing.median_ms, 4), "", s.note});
        }
      }
      csv.emit(out_dir, /*print=*/false);
      std::ofstream md(out_dir + "/bench_" + kind + ".md");
      const auto md_table = [&md](const std::vector<std::string>& header, const workshop::Table& t) {
        md << "|";
        for (const auto& h : header) md << " " << h << " |";
        md << "\n|";
        for (size_t i = 0; i < header.size(); ++i) md << "---|";
        md << "\n";
        for (const auto& row : t.rows()) {
          md << "|";
          for (const auto& cell : row) md << " " << cell << " |";
          md << "\n";
        }
      };
      md << "Device: " << name << "  \nLibTorch: " << TORCH_VERSION << ", " << threads
         << " ATen thread(s)  \nPeer: " << peer_state << "  \nLoad: " << load << "  \nDate: " << date << "  \nCommand: `" << command
         << "`  \nRounds: " << rounds << " (each case ours then PyTorch's, per round; times are medians of the rounds' "
            "medians, min..max over all rounds)\n\n";
      md << "| ceiling | measured |\n|---|---|\n";
      for (const auto& row : ceilings.rows()) md << "| " << row[0] << " | " << row[1] << " " << row[2] << " |\n";
      md << "\n";
      md_table({"benchmark", "variant", "median ms", "min..max ms", "GFLOP/s", "ceiling", "of ceiling", "speed-up",
                "note"},
               table);
      md << "\n<b>Ours and PyTorch's, same workloads, same run.</b> The PyTorch side is `bench/peer.py`, started by "
            "the bench with the same sizes, seeds, thread count and device. Time: median step, both sides timed "
            "the same way; the fastest step's ratio beside it is less sensitive to other work on a shared machine "
            "(lesson 4's measurement keeps only our median: no such ratio there). The verdict calls a difference "
            "resolved only when the median and the fastest-step ratios both exceed 10% the same way (lesson 4: when "
            "the two sides' min..max ranges do not overlap); otherwise it is within this run's noise. Peak: "
         << bench::same_way_peak_method(c.device)
         << " (our own meter's numbers are in the note column above). A ratio above 1 means ours is slower or "
            "holds more.\n\n";
      md_table({"benchmark", "variant", "ours ms", "PyTorch ms", "time ours/PyTorch", "fastest ours/PyTorch",
                "time verdict", "ours peak", "PyTorch peak", "peak ours/PyTorch", "PyTorch code"},
               versus_table);
      if (!c.scaler_rows.empty()) {
        md << "\n<b>The GradScaler's own cost.</b> " << scaler_napkin << "\n\n";
        md_table({"implementation", "median ms", "min..max ms", "vs ours plain", "GB/s (8 B/element)",
                  "of copy ceiling", "note"},
                 scaler_table);
      }
      if (!c.notes.empty()) {
        md << "\n<b>What differs in structure.</b>\n\n";
        for (const auto& note : c.notes) md << "- " << note << "\n";
      }
      std::cout << "wrote " << out_dir << "/bench_" << kind << ".{csv,md}\n";
    }
    if (!peer.failure().empty()) {
      std::cerr << "error: the PyTorch peer failed: " << peer.failure() << "\n";
      return 1;
    }
    return 0;
  } catch (const c10::Error& error) {
    std::cerr << "error: " << error.what_without_backtrace() << "\n";
    return 1;
  }
}
