// Lesson 4 demo: peak bytes and step time of one training step of a deep MLP with the memory levers added one
// by one (plain, checkpointed, + 16-bit, + accumulation), then the planner picking a recipe for a budget.
//   bazel run //lesson4_memory:demo -- --quick            (small CPU settings, well under 30 s)
//   bazel run //lesson4_memory:demo -- --csv_dir=/tmp/l4  (also writes the tables as CSV for the docs' chart)
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "common/demo.h"
#include "common/device.h"
#include "common/report.h"
#include "lesson4_memory/planner.h"
#include "lesson4_memory/workload.h"

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

int run(const workshop::Demo& demo) {
  const workshop::Flags& flags = demo.flags;
  const bool quick = demo.quick;
  const c10::Device device = demo.device;
  const bool cuda = device.is_cuda();
  mem::MlpSpec spec;
  spec.layers = flags.get_int("layers", 32);
  spec.width = flags.get_int("width", quick ? 64 : (cuda ? 1024 : 128));
  spec.batch = flags.get_int("batch", quick ? 1024 : (cuda ? 8192 : 2048));
  const int steps = static_cast<int>(flags.get_int("steps", quick ? 5 : 10));
  const std::string& csv_dir = demo.csv_dir;
  const int64_t segments = std::max<int64_t>(2, std::llround(std::sqrt(static_cast<double>(spec.layers))));

  std::cout << "Lesson 4 — reduce memory use\n"
            << "device: " << workshop::device_name(device) << "\n"
            << "workload: " << spec.layers << "-layer MLP (Linear -> GELU), width " << spec.width << ", batch "
            << spec.batch << ", Adam; " << steps << " timed steps per recipe (median)\n"
            << "memory: "
            << (cuda ? "CUDA caching-allocator statistics (allocated bytes)"
                     : "bytes counted by the counting CPU allocator")
            << "\n\n";

  struct Row {
    std::string name;
    mem::Recipe recipe;
  };
  std::vector<Row> rows = {{"plain", {0, 1, false}},
                           {"checkpointed", {0, segments, false}},
                           {"+16-bit", {0, segments, true}},
                           {"+accumulation", {(spec.batch + 3) / 4, segments, true}}};
  workshop::Table table("lesson4_memory", {"recipe", "settings", "step peak MiB", "total peak MiB", "peak ratio",
                                           "step ms", "time vs plain %"});
  mem::StepMemory plain{}, last{};
  for (const Row& row : rows) {
    const mem::StepMemory m = mem::measure_training(spec, row.recipe, device, steps);
    if (row.name == "plain") plain = m;
    last = m;
    // Plain numbers in the cells, so that the CSV feeds the docs' bar chart directly.
    table.add({row.name, mem::describe(row.recipe), workshop::fixed(m.step_peak_bytes / kMiB, 2),
               workshop::fixed(m.total_peak_bytes / kMiB, 2),
               workshop::fixed(static_cast<double>(plain.step_peak_bytes) / m.step_peak_bytes, 2),
               workshop::fixed(m.median_step_ms, 1),
               workshop::fixed(100.0 * (m.median_step_ms / plain.median_step_ms - 1.0), 0)});
  }
  table.emit(csv_dir);
  std::cout << "step peak: the most one step allocates on top of parameters + batch + Adam state ("
            << workshop::mib(static_cast<double>(plain.resident_bytes)) << ").\n"
            << "peak ratio: plain step peak / this step peak. time vs plain: the price of recomputation "
               "(one extra forward per checkpointed segment), 16-bit casts and smaller micro-batches.\n\n";

  // The planner: half of what the plain recipe needs in total.
  const int64_t budget = plain.total_peak_bytes / 2;
  const mem::PeakProbe probe = [&](const mem::Recipe& r) {
    return mem::measure_training(spec, r, device, 1).total_peak_bytes;
  };
  workshop::Table planner("lesson4_planner", {"budget MiB", "chosen recipe", "probes",
                                              "measured total peak MiB (3 steps)", "under budget"});
  try {
    const mem::Plan plan = mem::plan_for_budget(budget, spec.batch, spec.layers, probe);
    const mem::StepMemory proof = mem::measure_training(spec, plan.recipe, device, 3);
    planner.add({workshop::fixed(budget / kMiB, 2), mem::describe(plan.recipe), std::to_string(plan.probes),
                 workshop::fixed(proof.total_peak_bytes / kMiB, 2), proof.total_peak_bytes <= budget ? "yes" : "NO"});
  } catch (const c10::Error& error) {
    planner.add({workshop::fixed(budget / kMiB, 2), error.what_without_backtrace(), "-", "-", "-"});
  }
  planner.emit(csv_dir);

  workshop::append_summary(csv_dir, {{"4 memory", "step peak (MiB), plain vs checkpointed + 16-bit + accumulation",
                                      plain.step_peak_bytes / kMiB, last.step_peak_bytes / kMiB,
                                      workshop::device_name(device)}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return workshop::demo_main(
      argc, argv,
      workshop::DemoOptions("Lesson 4 demo: peak bytes and step time of a deep MLP's training step with the memory "
                            "levers added one by one, then the planner picking a recipe for a budget.")
          .quick_device("cpu")
          .flags({{"layers", "MLP depth (default 32)"},
                  {"width", "MLP width (default 64 quick, 128 CPU, 1024 CUDA)"},
                  {"batch", "rows per batch (default 1024 quick, 2048 CPU, 8192 CUDA)"},
                  {"steps", "timed steps per recipe (default 5 quick, 10 otherwise)"}}),
      run);
}
