// Lesson 7's demo, --what_fits: step 7's table (what_fits.h: arithmetic, nothing runs), one per published model on
// 8 to 64 H200s: bytes per GPU and whether they fit, with and without activation checkpointing, the napkin
// communication per step, and lesson 4's planner on the napkin probe.
//
//   bazel run //lesson7_fsdp:demo -- --what_fits                     (reference solution)
//   bazel run //lesson7_fsdp:my_demo -- --what_fits                  (your what_fits.cc)
//   bazel run //lesson7_fsdp:demo -- --what_fits --csv_dir=/tmp/out  (one CSV file per model)
#include <iostream>
#include <string>
#include <utility>

#include <c10/util/Exception.h>

#include "common/report.h"
#include "lesson4_memory/planner.h"
#include "lesson7_fsdp/demo_parts.h"
#include "lesson7_fsdp/what_fits.h"

namespace l7demo {

namespace {

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

}  // namespace

void print_what_fits(const std::string& csv_dir) {
  const fsdp::Cluster cluster;
  const auto gb = [](double bytes) { return workshop::fixed(bytes / 1e9, 1); };
  std::cout << "Step 7 — what fits: bytes per GPU and napkin communication per step (what_fits.h)\n"
            << "Assumptions: " << cluster.gpu_bytes / 1000000000 << " GB per GPU (H200), " << cluster.gpus_per_node
            << " GPUs per node, NVLink " << workshop::fixed(cluster.nvlink_gigabytes_per_s, 0)
            << " GB/s per GPU and direction inside a node, " << workshop::fixed(cluster.network_gigabits_per_s, 0)
            << " Gb/s per GPU between nodes; Adam in mixed precision, 2 + 2 + 12 bytes per parameter; "
            << "activations in 16-bit, counted from each model's own block (GPT-3: Korthikanti et al.'s "
            << "34 s b h + 5 a s^2 b); GB = 1e9 bytes.\n";
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

}  // namespace l7demo
