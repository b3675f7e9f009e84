// Checks for lesson 2, step 4: choose the micro-batch for a memory budget.
// Run: bazel test //lesson2_accumulation:all   (this step only: bazel test //lesson2_accumulation:accumulation_step4_test)
// The shared problems and helpers are in accumulation_test_helpers.h.
#include "lesson2_accumulation/accumulation_test_helpers.h"

namespace accumulation_checks {

TEST_CASE("[step4] measure_memory recovers the bytes of a known workload") {
  torch::Tensor keep;  // something that persists once created, like gradients: must not count as per-item
  const auto run = [&](int64_t m) {
    if (!keep.defined()) keep = torch::empty({1000});
    const auto fixed = torch::empty({5000});           // 20000 bytes whatever m is
    const auto activations = torch::empty({m, 1000});  // 4000 bytes per item
    (void)fixed;
    (void)activations;
  };
  const auto model = accum::measure_memory(run, torch::kCPU, 4, 16);
  CHECK(model.bytes_per_item == doctest::Approx(4000.0));
  CHECK(model.fixed_bytes == doctest::Approx(20000.0));
}

TEST_CASE("[step4] plan_micro_batch picks the largest micro-batch that fits and keeps the effective batch") {
  const accum::MemoryModel model{1000.0, 100.0};
  const auto tight = accum::plan_micro_batch(model, 64, 1000.0 + 100.0 * 20);  // room for 20 items
  CHECK(tight.accumulation_steps == 4);                                        // ceil(64 / 20)
  CHECK(tight.micro_batch == 16);                                              // evened out: 4 x 16
  CHECK(tight.predicted_bytes == doctest::Approx(1000.0 + 100.0 * 16));
  const auto roomy = accum::plan_micro_batch(model, 64, 1e9);
  CHECK(roomy.micro_batch == 64);
  CHECK(roomy.accumulation_steps == 1);
  const auto one = accum::plan_micro_batch(model, 64, 1100.0);  // exactly one item fits
  CHECK(one.micro_batch == 1);
  CHECK(one.accumulation_steps == 64);
  for (double budget : {1500.0, 2345.0, 4000.0, 7000.0}) {
    const auto plan = accum::plan_micro_batch(model, 100, budget);
    CAPTURE(budget);
    CHECK(plan.predicted_bytes <= budget);
    CHECK(plan.micro_batch * plan.accumulation_steps >= 100);
    CHECK((plan.micro_batch - 1) * plan.accumulation_steps < 100);  // no micro-batch wasted
  }
}

TEST_CASE("[step4] a planned micro-batch keeps a real accumulated pass under the budget the full batch exceeds") {
  const int64_t effective = 256;
  WideProblem problem(effective);
  torch::optim::SGD sgd(problem.model->parameters(), torch::optim::SGDOptions(0.01));
  // Measure what will run: one window of two micro-batches of m (the second adds into existing gradients).
  const auto run = [&](int64_t m) {
    accum::AccumulationOptions options;
    options.accumulation_steps = 2;
    accum::train_accumulated(sgd, accum::split_batch(problem.x.narrow(0, 0, 2 * m), problem.y.narrow(0, 0, 2 * m), m),
                             problem.loss_fn(), options);
  };
  const auto model = accum::measure_memory(run, torch::kCPU, 8, 64);
  CAPTURE(model.fixed_bytes);
  CAPTURE(model.bytes_per_item);
  REQUIRE(model.bytes_per_item > 0);
  const double budget = model.fixed_bytes + model.bytes_per_item * effective / 5.0;  // a fifth of the batch fits
  const auto plan = accum::plan_micro_batch(model, effective, budget);
  CAPTURE(plan.micro_batch);
  CAPTURE(plan.accumulation_steps);
  CHECK(plan.accumulation_steps == 6);  // ceil(256 / floor(256 / 5)) = ceil(256 / 51)
  CHECK(plan.micro_batch * plan.accumulation_steps >= effective);
  const int64_t planned_peak = problem.peak_bytes(sgd, plan.micro_batch, plan.accumulation_steps);
  const int64_t full_peak = problem.peak_bytes(sgd, effective, 1);
  CAPTURE(budget);
  CAPTURE(planned_peak);
  CAPTURE(full_peak);
  CHECK(planned_peak <= budget);
  CHECK(full_peak > budget);
}

TEST_CASE("[step4] bad input gets a clear error") {
  const accum::MemoryModel model{1000.0, 100.0};
  CHECK_THROWS_WITH_AS(accum::plan_micro_batch(model, 0, 1e6), Contains("effective_batch"), c10::Error);
  CHECK_THROWS_WITH_AS(accum::plan_micro_batch(model, 64, 0.0), Contains("budget_bytes"), c10::Error);
  CHECK_THROWS_WITH_AS(accum::plan_micro_batch(model, 64, 1050.0), Contains("does not fit even one item"), c10::Error);
  const auto run = [](int64_t) {};
  CHECK_THROWS_WITH_AS(accum::measure_memory(run, torch::kCPU, 8, 8), Contains("small < large"), c10::Error);
  CHECK_THROWS_WITH_AS(accum::measure_memory(run, torch::kCPU, 0, 8), Contains("small < large"), c10::Error);
}

}  // namespace accumulation_checks
