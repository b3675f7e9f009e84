// Lesson 3 demo: profile a training loop with planted problems, name them, fix them, and measure the gain.
//   bazel run //lesson3_profiling:demo -- --quick            (reference solution)
//   bazel run //lesson3_profiling:my_demo -- --quick         (your implementation)
// Flags: --device=best|cpu|cuda  --quick  --steps=N  --csv_dir=DIR (tables as CSV + summary.csv, traces there)
#include <cstdlib>
#include <iostream>

#include <ATen/ATen.h>

#include "common/demo.h"
#include "common/device.h"
#include "common/report.h"
#include "lesson3_profiling/bottleneck.h"
#include "lesson3_profiling/profiler.h"
#include "lesson3_profiling/stopwatch.h"
#include "common/compat/compat_profiler.h"

namespace {

using workshop::fixed;

void add_rows(workshop::Table& table, const std::string& loop, const std::vector<prof::Row>& rows, size_t max,
              bool device_and_bytes = false) {
  for (size_t i = 0; i < rows.size() && i < max; ++i) {
    const auto& r = rows[i];
    std::vector<std::string> cells{loop, r.name, std::to_string(r.calls)};
    cells.push_back(fixed(r.total_us / 1000.0, 3));
    cells.push_back(fixed(r.self_us / 1000.0, 3));
    cells.push_back(fixed(r.share, 3));
    if (device_and_bytes) {
      cells.push_back(fixed(r.self_device_us / 1000.0, 3));
      cells.push_back(fixed(static_cast<double>(r.bytes) / 1024.0, 1));
    }
    table.add(cells);
  }
}

std::vector<prof::Row> ops_only(const std::vector<prof::Row>& rows) {
  std::vector<prof::Row> out;
  for (const auto& r : rows) {
    if (!prof::is_phase_label(r.name)) out.push_back(r);
  }
  // An op table reads best by self time: where the time is spent, not what encloses it. On a GPU: the kernels'.
  bool device = false;
  for (const auto& r : out) device = device || r.self_device_us > 0;
  std::stable_sort(out.begin(), out.end(), [device](const prof::Row& a, const prof::Row& b) {
    return device ? a.self_device_us > b.self_device_us : a.self_us > b.self_us;
  });
  return out;
}

void print_findings(const std::vector<prof::Finding>& findings) {
  if (findings.empty()) std::cout << "  diagnosis: nothing found\n";
  for (size_t i = 0; i < findings.size(); ++i) {
    const auto& f = findings[i];
    std::cout << "  " << (i == 0 ? "bottleneck: " : "also:       ") << prof::problem_name(f.problem) << " in "
              << f.phase << " (share " << fixed(100 * f.phase_share, 1) << "%; " << f.op << " x "
              << fixed(f.calls_per_step, 1) << " per step)\n";
  }
}

int run(const workshop::Demo& demo) {
  const workshop::Flags& flags = demo.flags;
  const c10::Device device = demo.device;
  const bool quick = demo.quick;
  const int64_t steps = flags.get_int("steps", quick ? 8 : 20);
  const int repeats = quick ? 7 : 21;
  const std::string& csv_dir = demo.csv_dir;
  const char* tmp = std::getenv("TMPDIR");
  const std::string trace_dir = csv_dir.empty() ? std::string(tmp ? tmp : "/tmp") : csv_dir;

  prof::TrainerOptions options;
  if (!quick) {
    options.samples = 4096;
    options.batch = 128;
    options.features = 64;
    options.hidden = 256;
  }
  std::cout << "Lesson 3 — profile the bottleneck\n"
            << "device: " << workshop::device_name(device) << "\n"
            << "profiler: " << workshop::compat::profiler_backend()
            << ", NVTX ranges: " << (workshop::compat::nvtx_available() ? "yes" : "no") << "\n"
            << "model: " << options.features << " -> " << options.hidden << " -> " << options.classes << ", batch "
            << options.batch << ", " << steps << " profiled steps per loop\n\n";

  // 1. Timing: the host clock alone versus the stopwatch, on the same work.
  {
    const int64_t n = device.is_cuda() ? 4096 : 256;
    const auto a = at::randn({n, n}, at::TensorOptions().device(device));
    auto c = at::empty({n, n}, at::TensorOptions().device(device));
    const auto work = [&] {
      for (int i = 0; i < 10; ++i) at::mm_out(c, a, a);
    };
    const auto wrong = prof::measure_unsynchronized(device, work, 2, repeats);
    const auto right = prof::measure(device, work, 2, repeats);
    workshop::Table timing("lesson3_timing", {"timer", "median_ms", "min_ms", "max_ms"});
    timing.add({"host clock, no sync", fixed(wrong.median_ms, 3), fixed(wrong.min_ms, 3), fixed(wrong.max_ms, 3)});
    timing.add({"stopwatch (sync)", fixed(right.median_ms, 3), fixed(right.min_ms, 3), fixed(right.max_ms, 3)});
    std::cout << "10 matmuls " << n << "x" << n << ", " << repeats << " repeats:\n";
    timing.emit(csv_dir);
    std::cout << "\n";
  }

  // 2. Profile the slow loop and name its problems.
  prof::Trainer slow(options, device);
  const auto before = prof::profile_steps(steps, [&] { slow.slow_step(); });
  const auto slow_findings = prof::diagnose(before, steps);
  // 3. The fix: prepare the data once, keep the loss on the device.
  prof::Trainer fast(options, device);
  fast.prepare();
  const auto after = prof::profile_steps(steps, [&] { fast.fast_step(); });
  const auto fast_findings = prof::diagnose(after, steps);

  workshop::Table phases("lesson3_phases", {"loop", "name", "calls", "total_ms", "self_ms", "share"});
  add_rows(phases, "slow", before.phase_table(), 4);
  add_rows(phases, "fixed", after.phase_table(), 4);
  std::cout << "Phases (share = fraction of the profiled time):\n";
  phases.emit(csv_dir);
  std::cout << "\nslow loop:\n";
  print_findings(slow_findings);
  std::cout << "fixed loop:\n";
  print_findings(fast_findings);

  workshop::Table ops("lesson3_ops",
                      {"loop", "name", "calls", "total_ms", "self_ms", "share", "self_device_ms", "alloc_kib"});
  add_rows(ops, "slow", ops_only(before.table()), 8, true);
  add_rows(ops, "fixed", ops_only(after.table()), 8, true);
  std::cout << "\nTop ops by self time (on a GPU by self_device_ms, their kernels' time; alloc_kib: bytes they "
               "allocated):\n";
  ops.emit(csv_dir);

  const std::string slow_trace = trace_dir + "/lesson3_slow_trace.json";
  const std::string fast_trace = trace_dir + "/lesson3_fixed_trace.json";
  before.write_chrome_trace(slow_trace);
  after.write_chrome_trace(fast_trace);
  std::cout << "\ntraces (open in ui.perfetto.dev or chrome://tracing):\n  " << slow_trace << "\n  " << fast_trace
            << "\n";
  if (prof::backend_can_save_trace()) {  // Kineto's own trace of the fixed loop's recording, the last one
    const std::string kineto_trace = trace_dir + "/lesson3_fixed_kineto_trace.json";
    prof::save_backend_trace(kineto_trace);
    std::cout << "  " << kineto_trace << " (Kineto's own, same run as the line above)\n";
  }

  // 4. Step time, unprofiled, side by side in one run.
  const auto slow_time = prof::measure(
      device, [&] { slow.slow_step(); }, 2, repeats);
  const auto fast_time = prof::measure(
      device, [&] { fast.fast_step(); }, 2, repeats);
  workshop::Table step_time("lesson3_step_time", {"loop", "median_ms", "min_ms", "max_ms", "data_step_share"});
  step_time.add({"slow", fixed(slow_time.median_ms, 3), fixed(slow_time.min_ms, 3), fixed(slow_time.max_ms, 3),
                 fixed(before.step_share(prof::Phase::kData), 3)});
  step_time.add({"fixed", fixed(fast_time.median_ms, 3), fixed(fast_time.min_ms, 3), fixed(fast_time.max_ms, 3),
                 fixed(after.step_share(prof::Phase::kData), 3)});
  std::cout << "\nStep time (" << repeats << " repeats, median):\n";
  step_time.emit(csv_dir);
  std::cout << "speed-up: " << fixed(slow_time.median_ms / fast_time.median_ms, 2) << "x\n";
  workshop::append_summary(csv_dir, {{"3 profiling", "step time (ms)", slow_time.median_ms, fast_time.median_ms,
                                      workshop::device_name(device)}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return workshop::demo_main(argc, argv,
                             workshop::DemoOptions(
                                 "Lesson 3 demo: profile a training loop with planted problems, name them, fix them "
                                 "and measure the gain (with --csv_dir, the Chrome traces go there too).")
                                 .flags({{"steps", "profiled steps per loop (default 8 quick, 20 full)"}}),
                             run);
}
