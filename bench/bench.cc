// Benchmarks, side by side: each case runs its baseline and its improved variants in one process on one
// device, warmed up, repeated, synchronised, on random (non-zero) inputs, and reports medians, spread and
// ratios — never a bare time. Beside each, the napkin math: FLOPs and bytes of the workload, the device's
// ceilings measured in the same run (matmul per dtype, memory copy), and the fraction achieved.
//
//   bazel run //bench -- [--device=best|cpu|cuda] [--quick] [--out_dir=DIR] [--cases=l1,l2,l3,l4,l5]
//
// With --out_dir it writes DIR/bench_<device kind>.csv (machine-readable) and DIR/bench_<device kind>.md
// (a Markdown table headed by device, LibTorch version, date and command), which docs/results/ keeps.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/Context.h>
#include <torch/torch.h>

#include "common/device.h"
#include "common/memory_meter.h"
#include "common/report.h"
#include "lesson1_amp/autocast.h"
#include "lesson1_amp/grad_scaler.h"
#include "lesson2_accumulation/accumulation.h"
#include "lesson3_profiling/bottleneck.h"
#include "lesson4_memory/planner.h"
#include "lesson4_memory/workload.h"
#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/demo_ranks.h"

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
};

struct Context {
  torch::Device device{torch::kCPU};
  bool quick = false;
  std::vector<Row> rows;
  double matmul_ceiling_fp32 = 0, matmul_ceiling_tf32 = 0, matmul_ceiling_bf16 = 0, matmul_ceiling_fp16 = 0;
  double copy_ceiling = 0;
  std::vector<std::pair<int, double>> loopback_ceilings;  // lesson 5: (ranks, B/s sent per rank, ring napkin)
};

void set_tf32(bool on) {
  // Present in LibTorch 1.13 and 2.x; only CUDA matmuls read it.
  at::globalContext().setAllowTF32CuBLAS(on);
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
  if (c.device.is_cuda()) {
    c.matmul_ceiling_tf32 = measure_matmul(c, torch::kFloat, true);
    c.matmul_ceiling_fp16 = measure_matmul(c, torch::kHalf, false);
  }
  c.copy_ceiling = measure_copy(c);
}

// ---- lesson 1: float32 vs TF32 vs autocast ----------------------------------------------------------------

void bench_lesson1(Context& c) {
  const bool cuda = c.device.is_cuda();
  const int64_t width = cuda ? 8192 : (c.quick ? 256 : 1024), depth = 4, batch = cuda ? 16384 : (c.quick ? 128 : 512);
  std::cout << "lesson 1: MLP " << depth << " x " << width << ", batch " << batch << std::endl;
  struct Variant {
    std::string name;
    bool autocast;
    torch::ScalarType dtype;
    bool tf32;
    double ceiling;
    std::string ceiling_name;
  };
  std::vector<Variant> variants{{"float32", false, torch::kFloat, false, c.matmul_ceiling_fp32, "fp32 matmul"}};
  if (cuda) variants.push_back({"TF32 matmuls", false, torch::kFloat, true, c.matmul_ceiling_tf32, "tf32 matmul"});
  variants.push_back({"autocast bfloat16", true, torch::kBFloat16, false, c.matmul_ceiling_bf16, "bf16 matmul"});
  if (cuda) {
    variants.push_back({"autocast float16 + GradScaler", true, torch::kHalf, false, c.matmul_ceiling_fp16,
                        "fp16 matmul"});
  }
  const double flops = 6.0 * batch * depth * width * width;  // forward 2, backward 4 FLOPs per weight per item
  double baseline_ms = 0;
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
    const auto t = workshop::time_repeated(c.device, [&] {
      amp::train_step(sgd, scaler, [&] { return torch::mse_loss(model->forward(x).to(torch::kFloat), y); }, options);
    }, 3, c.quick ? 5 : 15);
    set_tf32(false);
    if (baseline_ms == 0) baseline_ms = t.median_ms;
    Row row{"lesson 1: training step", v.name, t, flops, 0, v.ceiling, v.ceiling_name, baseline_ms / t.median_ms, ""};
    c.rows.push_back(row);
  }
}

// ---- lesson 2: memory and time vs K ---------------------------------------------------------------------

void bench_lesson2(Context& c) {
  const int64_t batch = c.quick ? 256 : 1024, width = c.device.is_cuda() ? 4096 : (c.quick ? 256 : 1024);
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
  for (int64_t k : {1, 4, 16}) {
    const auto micro = accum::split_batch(x, y, batch / k);
    accum::AccumulationOptions options;
    options.accumulation_steps = k;
    accum::train_accumulated(sgd, micro, loss, options);  // warm-up, allocates .grad
    workshop::MemoryMeter meter(c.device);
    accum::train_accumulated(sgd, micro, loss, options);
    const double peak = static_cast<double>(meter.peak_bytes());
    const auto t = workshop::time_repeated(c.device, [&] { accum::train_accumulated(sgd, micro, loss, options); },
                                           2, c.quick ? 3 : 10);
    if (k == 1) {
      baseline_ms = t.median_ms;
      baseline_bytes = peak;
    }
    Row row{"lesson 2: accumulation", "K=" + std::to_string(k) + " (micro-batch " + std::to_string(batch / k) + ")",
            t, 6.0 * batch * (256.0 * width + width * width + width * 16.0), peak, c.matmul_ceiling_fp32,
            "fp32 matmul", baseline_ms / t.median_ms,
            "peak " + workshop::mib(peak) + ", " + fixed(baseline_bytes / std::max(peak, 1.0), 2) + "x less than K=1"};
    c.rows.push_back(row);
  }
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
  c.rows.push_back(Row{"lesson 3: training loop", "planted problems (sync, data in step, tiny ops)", t_slow, flops, 0,
                       0, "", 1.0, ""});
  c.rows.push_back(Row{"lesson 3: training loop", "fixed", t_fast, flops, 0, 0, "", t_slow.median_ms / t_fast.median_ms,
                       ""});
}

// ---- lesson 4: peak bytes and time per technique ----------------------------------------------------------

void bench_lesson4(Context& c) {
  mem::MlpSpec spec;
  spec.layers = 32;
  spec.width = c.device.is_cuda() ? 1024 : (c.quick ? 64 : 128);
  spec.batch = c.device.is_cuda() ? 8192 : (c.quick ? 1024 : 2048);
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
  for (const auto& v : variants) {
    const mem::StepMemory m = mem::measure_training(spec, v.recipe, c.device, c.quick ? 3 : 10);
    const double peak = static_cast<double>(m.step_peak_bytes);
    if (base_ms == 0) {
      base_ms = m.median_step_ms;
      base_bytes = peak;
    }
    workshop::Timing timing{m.median_step_ms, m.median_step_ms, m.median_step_ms, {}};
    c.rows.push_back(Row{"lesson 4: memory", v.name, timing, 6.0 * spec.batch * spec.layers * spec.width * spec.width,
                         peak, 0, "", base_ms / m.median_step_ms,
                         "step peak " + workshop::mib(peak) + ", " + fixed(base_bytes / std::max(peak, 1.0), 2) +
                             "x lower; time " + fixed(m.median_step_ms / base_ms, 2) + "x plain"});
  }
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
                               workshop::mib(static_cast<double>(r.optimizer_state_bytes)) + "/rank"});
    }
  }
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const int rank_exit = l5demo::maybe_run_as_rank(argc, argv);  // lesson 5 starts its ranks as copies of this binary
  if (rank_exit >= 0) return rank_exit;
  try {
    workshop::Flags flags(argc, argv, {{"device", "best (default), cpu, cuda"},
                                       {"quick", "small sizes (a smoke run)"},
                                       {"cases", "comma-separated: l1,l2,l3,l4,l5 (default all)"},
                                       {"world_sizes", "lesson 5 ranks, comma-separated (default 2,4; --quick: 2)"},
                                       {"out_dir", "write bench_<device>.csv and .md there"}});
    Context c;
    c.device = workshop::parse_device(flags.get("device", "best"));
    c.quick = flags.has("quick");
    const std::string cases = "," + flags.get("cases", "l1,l2,l3,l4,l5") + ",";
    std::string command = "bazel run //bench --";
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    const std::string name = workshop::device_name(c.device);
    std::cout << "benchmarks on " << c.device << " (" << name << "), LibTorch " << TORCH_VERSION << "\n";

    measure_ceilings(c);
    if (cases.find(",l1,") != std::string::npos) bench_lesson1(c);
    if (cases.find(",l2,") != std::string::npos) bench_lesson2(c);
    if (cases.find(",l3,") != std::string::npos) bench_lesson3(c);
    if (cases.find(",l4,") != std::string::npos) bench_lesson4(c);
    if (cases.find(",l5,") != std::string::npos) {
      std::vector<int> worlds;
      std::stringstream list(flags.get("world_sizes", c.quick ? "2" : "2,4"));
      for (std::string item; std::getline(list, item, ',');) worlds.push_back(std::stoi(item));
      bench_lesson5(c, worlds);
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

    std::string out_dir = flags.get("out_dir", "");
    const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");  // set by `bazel run`: where the user ran it
    if (!out_dir.empty() && out_dir[0] != '/' && cwd != nullptr) out_dir = std::string(cwd) + "/" + out_dir;
    if (!out_dir.empty()) {
      const std::string kind = c.device.is_cuda() ? "cuda" : "cpu";
      workshop::Table csv("bench_" + kind, {"benchmark", "variant", "median_ms", "min_ms", "max_ms", "flops",
                                            "peak_or_bytes", "ceiling_flops_per_s", "ceiling", "ratio", "device",
                                            "libtorch", "date", "command"});
      for (const auto& r : c.rows) {
        csv.add({r.bench, r.variant, fixed(r.timing.median_ms, 4), fixed(r.timing.min_ms, 4),
                 fixed(r.timing.max_ms, 4), fixed(r.flops, 0), fixed(r.bytes, 0), fixed(r.ceiling, 0), r.ceiling_name,
                 fixed(r.ratio, 4), name, TORCH_VERSION, now_utc(), command});
      }
      csv.emit(out_dir, /*print=*/false);
      std::ofstream md(out_dir + "/bench_" + kind + ".md");
      md << "Device: " << name << "  \nLibTorch: " << TORCH_VERSION << "  \nDate: " << now_utc()
         << "  \nCommand: `" << command << "`\n\n";
      md << "| ceiling | measured |\n|---|---|\n";
      for (const auto& row : ceilings.rows()) md << "| " << row[0] << " | " << row[1] << " " << row[2] << " |\n";
      md << "\n| benchmark | variant | median ms | min..max ms | GFLOP/s | ceiling | of ceiling | speed-up | note |\n"
         << "|---|---|---|---|---|---|---|---|---|\n";
      for (const auto& row : table.rows()) {
        md << "|";
        for (const auto& cell : row) md << " " << cell << " |";
        md << "\n";
      }
      std::cout << "wrote " << out_dir << "/bench_" << kind << ".{csv,md}\n";
    }
    return 0;
  } catch (const c10::Error& error) {
    std::cerr << "error: " << error.what_without_backtrace() << "\n";
    return 1;
  }
}
