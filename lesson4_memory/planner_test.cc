// Checks for lesson 4, step 4: the combined recipe (checkpointing + 16-bit + accumulation) and the planner.
// Run: bazel test //lesson4_memory:all --test_arg=--test-case='*step4*'
#include "tests/torch_doctest.h"

#include <cmath>

#include <torch/torch.h>

#include "lesson4_memory/planner.h"
#include "common/compat/compat.h"
#include "lesson4_memory/workload.h"
#include "tests/check_helpers.h"

using doctest::Contains;

namespace {

mem::MlpSpec spec_of(int64_t layers, int64_t width, int64_t batch) {
  mem::MlpSpec spec;
  spec.layers = layers;
  spec.width = width;
  spec.batch = batch;
  return spec;
}

mem::Recipe recipe(int64_t micro_batch, int64_t segments, bool low_precision) {
  mem::Recipe r;
  r.micro_batch = micro_batch;
  r.segments = segments;
  r.low_precision = low_precision;
  return r;
}

bool same(const mem::Recipe& a, const mem::Recipe& b) {
  return a.micro_batch == b.micro_batch && a.segments == b.segments && a.low_precision == b.low_precision;
}

// Gradients after one train_step with `r` (train_step leaves them in place until the next step).
std::vector<torch::Tensor> step_gradients(const mem::MlpSpec& spec, const mem::Recipe& r, double* loss) {
  auto model = mem::make_deep_mlp(spec, torch::kCPU);
  const auto batch = mem::make_batch(spec, torch::kCPU);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.0));  // lr 0: gradients only
  *loss = mem::train_step(model, sgd, batch.first, batch.second, r);
  return workshop::test::grads_of(model->parameters());
}

// Step peaks of plain, checkpointed (6 segments) and combined (+ bfloat16 + micro-batches of `micro_batch`)
// training of `spec` on `device`, and the two ratios plain / checkpointed and plain / combined.
struct PeakRatios {
  mem::StepMemory plain, checkpointed, combined;
  double checkpoint_ratio = 0, combined_ratio = 0;
};

PeakRatios measure_ratios(const mem::MlpSpec& spec, int64_t micro_batch, torch::Device device) {
  PeakRatios r;
  r.plain = mem::measure_training(spec, recipe(0, 1, false), device);
  r.checkpointed = mem::measure_training(spec, recipe(0, 6, false), device);
  r.combined = mem::measure_training(spec, recipe(micro_batch, 6, true), device);
  const auto plain = static_cast<double>(r.plain.step_peak_bytes);
  r.checkpoint_ratio = plain / static_cast<double>(r.checkpointed.step_peak_bytes);
  r.combined_ratio = plain / static_cast<double>(r.combined.step_peak_bytes);
  return r;
}

}  // namespace

TEST_CASE("[step4] accumulating uneven micro-batches gives the full batch's gradients and loss") {
  const auto spec = spec_of(6, 32, 250);
  double full_loss = 0, accumulated_loss = 0;
  const auto full = step_gradients(spec, recipe(0, 1, false), &full_loss);
  const auto accumulated = step_gradients(spec, recipe(64, 3, false), &accumulated_loss);  // 64+64+64+58 rows
  const double worst = workshop::test::rel_error(accumulated, full);
  CAPTURE(worst);
  CHECK(worst <= 1e-5);
  CHECK(accumulated_loss == doctest::Approx(full_loss).epsilon(1e-6));
}

TEST_CASE("[step4] each train_step starts from no gradients: two steps leave the last step's gradients") {
  const auto spec = spec_of(4, 16, 40);
  auto model = mem::make_deep_mlp(spec, torch::kCPU);
  const auto batch = mem::make_batch(spec, torch::kCPU);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.0));  // lr 0: the same gradients twice
  mem::train_step(model, sgd, batch.first, batch.second, recipe(16, 2, false));
  const auto once = workshop::test::grads_of(model->parameters());
  mem::train_step(model, sgd, batch.first, batch.second, recipe(16, 2, false));
  const double worst = workshop::test::rel_error(workshop::test::grads_of(model->parameters()), once);
  CAPTURE(worst);
  CHECK(worst <= 1e-6);  // accumulating onto last step's gradients would double them
}

TEST_CASE("[step4] train_step runs the forward under bfloat16 autocast exactly when the recipe is 16-bit") {
  const auto spec = spec_of(3, 16, 24);
  for (bool low_precision : {false, true}) {
    CAPTURE(low_precision);
    auto model = mem::make_deep_mlp(spec, torch::kCPU);
    std::vector<std::string> seen;  // the dtype of a matmul run in each forward, as autocast decides it
    model->push_back(torch::nn::Functional([&seen](const torch::Tensor& t) {
      seen.push_back(dtype_name(torch::mm(t.to(torch::kFloat), torch::eye(t.size(1))).scalar_type()));
      return t;
    }));
    const auto batch = mem::make_batch(spec, torch::kCPU);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.0));
    mem::train_step(model, sgd, batch.first, batch.second, recipe(8, 1, low_precision));  // 3 chunks
    CHECK(seen == std::vector<std::string>(3, low_precision ? "BFloat16" : "Float"));
    CHECK_FALSE(workshop::compat::autocast_enabled(torch::kCPU));
  }
}

TEST_CASE("[step4] the combined recipe (checkpointing + 16-bit + accumulation) beats checkpointing alone") {
  const PeakRatios r = measure_ratios(spec_of(32, 64, 1024), 256, torch::kCPU);
  const auto& plain = r.plain;
  const auto& checkpointed = r.checkpointed;
  const auto& combined = r.combined;
  const double checkpoint_ratio = r.checkpoint_ratio;
  const double combined_ratio = r.combined_ratio;
  CAPTURE(plain.step_peak_bytes);
  CAPTURE(checkpointed.step_peak_bytes);
  CAPTURE(combined.step_peak_bytes);
  MESSAGE("32-layer MLP, CPU counted step peak: plain ", plain.step_peak_bytes, ", checkpointed ",
          checkpointed.step_peak_bytes, " (ratio ", checkpoint_ratio, "), + bfloat16 + 4 micro-batches ",
          combined.step_peak_bytes, " (ratio ", combined_ratio, ")");
  CHECK(checkpoint_ratio >= 3.0);
  CHECK(combined_ratio >= 1.5 * checkpoint_ratio);
  CHECK(plain.resident_bytes == combined.resident_bytes);  // same model, batch and optimizer state
}

TEST_CASE("[step4] candidate recipes run from the fastest to the one using the least memory") {
  const auto recipes = mem::candidate_recipes(8, 32);
  REQUIRE(recipes.size() == 16);  // micro-batches 8, 4, 2, 1 × {plain, 16-bit, 6 segments, both}
  CHECK(same(recipes[0], recipe(0, 1, false)));
  CHECK(same(recipes[1], recipe(0, 1, true)));
  CHECK(same(recipes[2], recipe(0, 6, false)));
  CHECK(same(recipes[3], recipe(0, 6, true)));
  CHECK(same(recipes[4], recipe(4, 1, false)));
  CHECK(same(recipes.back(), recipe(1, 6, true)));
  const auto one_layer = mem::candidate_recipes(3, 1);  // micro-batches 3, 2, 1; no checkpointing possible
  REQUIRE(one_layer.size() == 6);
  CHECK(same(one_layer[2], recipe(2, 1, false)));
  CHECK(same(one_layer.back(), recipe(1, 1, true)));
}

TEST_CASE("[step4] with a made-up probe the planner returns the first candidate that fits, the last one included") {
  const auto recipes = mem::candidate_recipes(8, 32);
  REQUIRE(recipes.size() == 16);
  // Peak 1000 - (position in the list): each candidate uses a little less than the one before.
  const mem::PeakProbe probe = [&](const mem::Recipe& r) -> int64_t {
    for (size_t i = 0; i < recipes.size(); ++i) {
      if (same(recipes[i], r)) return 1000 - static_cast<int64_t>(i);
    }
    FAIL("the planner probed a recipe that is not a candidate: " << mem::describe(r));
    return 0;
  };
  const mem::Plan fifth = mem::plan_for_budget(996, 8, 32, probe);  // candidates 0..3 need 1000..997
  CHECK(same(fifth.recipe, recipes[4]));
  CHECK(fifth.peak_bytes == 996);
  CHECK(fifth.probes == 6);                                        // the least-memory one, then candidates 0..4
  const mem::Plan last = mem::plan_for_budget(985, 8, 32, probe);  // only the last candidate fits
  CHECK(same(last.recipe, recipes.back()));
  CHECK(last.peak_bytes == 985);
  CHECK(last.probes == 16);
}

TEST_CASE("[step4] the planner's choice really runs under its budget; a generous budget changes nothing") {
  const auto spec = spec_of(16, 32, 512);
  int probes = 0;
  const mem::PeakProbe probe = [&](const mem::Recipe& r) {
    ++probes;
    return mem::measure_training(spec, r, torch::kCPU).total_peak_bytes;
  };
  const int64_t plain_peak = mem::measure_training(spec, recipe(0, 1, false), torch::kCPU).total_peak_bytes;

  const mem::Plan generous = mem::plan_for_budget(2 * plain_peak, spec.batch, spec.layers, probe);
  CHECK(same(generous.recipe, recipe(0, 1, false)));
  CHECK(generous.probes == 2);  // the least-memory recipe first, then the first candidate fits

  const int64_t budget = plain_peak / 2;
  probes = 0;
  const mem::Plan plan = mem::plan_for_budget(budget, spec.batch, spec.layers, probe);
  CAPTURE(plain_peak);
  CAPTURE(budget);
  CAPTURE(mem::describe(plan.recipe));
  CAPTURE(plan.peak_bytes);
  CHECK(plan.probes == probes);
  CHECK(plan.peak_bytes <= budget);
  CHECK_FALSE(same(plan.recipe, recipe(0, 1, false)));
  // The proof: a fresh run of three steps with the chosen recipe stays under the budget.
  const auto proof = mem::measure_training(spec, plan.recipe, torch::kCPU, 3);
  CAPTURE(proof.total_peak_bytes);
  MESSAGE("planner: budget ", budget, " bytes (plain needs ", plain_peak, "): ", mem::describe(plan.recipe),
          ", measured ", proof.total_peak_bytes, " bytes over 3 steps");
  CHECK(proof.total_peak_bytes <= budget);
}

TEST_CASE("[step4] an impossible budget gets a clear error after a single probe") {
  int probes = 0;
  const mem::PeakProbe probe = [&](const mem::Recipe& r) {
    ++probes;
    return mem::measure_training(spec_of(8, 16, 64), r, torch::kCPU).total_peak_bytes;
  };
  CHECK_THROWS_WITH_AS(mem::plan_for_budget(1000, 64, 8, probe), Contains("no recipe fits the budget of 1000"),
                       c10::Error);
  CHECK(probes == 1);
}

TEST_CASE("[step4] bad input is rejected with a clear message") {
  const auto spec = spec_of(4, 8, 16);
  auto model = mem::make_deep_mlp(spec, torch::kCPU);
  const auto batch = mem::make_batch(spec, torch::kCPU);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  CHECK_THROWS_WITH_AS(mem::train_step(model, sgd, batch.first, batch.second, recipe(-1, 1, false)),
                       Contains("micro_batch"), c10::Error);
  CHECK_THROWS_WITH_AS(mem::train_step(model, sgd, batch.first, batch.second, recipe(0, 0, false)),
                       Contains("segments"), c10::Error);
  CHECK_THROWS_WITH_AS(mem::train_step(model, sgd, batch.first, batch.second.narrow(0, 0, 3), recipe(0, 1, false)),
                       Contains("rows"), c10::Error);
  CHECK_THROWS_WITH_AS(mem::candidate_recipes(0, 4), Contains("batch"), c10::Error);
  CHECK_THROWS_WITH_AS(mem::candidate_recipes(4, 0), Contains("layers"), c10::Error);
  const mem::PeakProbe never = [](const mem::Recipe&) -> int64_t { return 0; };
  CHECK_THROWS_WITH_AS(mem::plan_for_budget(0, 16, 4, never), Contains("budget_bytes"), c10::Error);
  CHECK_THROWS_WITH_AS(mem::plan_for_budget(100, 16, 4, mem::PeakProbe()), Contains("probe is empty"), c10::Error);
}

GPU_TEST_CASE("[step4] on CUDA the ratios repeat with the caching allocator's statistics") {
  const PeakRatios r = measure_ratios(spec_of(32, 256, 4096), 1024, torch::Device(torch::kCUDA, 0));
  const auto& plain = r.plain;
  const auto& checkpointed = r.checkpointed;
  const auto& combined = r.combined;
  const double checkpoint_ratio = r.checkpoint_ratio;
  const double combined_ratio = r.combined_ratio;
  CAPTURE(plain.step_peak_bytes);
  CAPTURE(checkpointed.step_peak_bytes);
  CAPTURE(combined.step_peak_bytes);
  MESSAGE("CUDA step peak: plain ", plain.step_peak_bytes, ", checkpointed ratio ", checkpoint_ratio,
          ", combined ratio ", combined_ratio);
  CHECK(checkpoint_ratio >= 2.5);
  CHECK(combined_ratio > checkpoint_ratio);
}
