// Checks for lesson 3, part 4: name the planted problems of a training loop, then fix them (step 4).
// Run: bazel test //lesson3_profiling:all --test_arg=--test-case='*step4*'
#include "tests/torch_doctest.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "lesson3_profiling/bottleneck.h"

using doctest::Contains;

namespace {

// Enough steps that the median step share shrugs off a few steps stretched by a busy machine.
constexpr int64_t kSteps = 16;

// The phase shares are ratios of measured times. With several intra-op threads, a tiny op that LibTorch splits
// across threads waits for every thread to reach the barrier: on a busy machine one descheduled thread stretches
// a 64x4 log_softmax backward from microseconds to ~18 ms (seen with LibTorch 2.6 beside other builds), and such
// waits, not the planted work, decide the shares. One thread measures the work the loop does.
class OneThread {
 public:
  OneThread() : previous_(at::get_num_threads()) { at::set_num_threads(1); }
  ~OneThread() { at::set_num_threads(previous_); }

 private:
  int previous_;
};

const prof::Finding* find(const std::vector<prof::Finding>& findings, prof::Problem problem) {
  for (const auto& f : findings) {
    if (f.problem == problem) return &f;
  }
  return nullptr;
}

std::string describe(const std::vector<prof::Finding>& findings) {
  std::string text;
  for (const auto& f : findings) {
    text += prof::problem_name(f.problem) + " in " + f.phase + " (" + f.op + ", " + std::to_string(f.calls_per_step) +
            "/step, share " + std::to_string(f.phase_share) + "); ";
  }
  return text;
}

}  // namespace

TEST_CASE("[step4] diagnose names the planted problems of the slow loop; the data phase is the bottleneck") {
  const OneThread one_thread;
  prof::Trainer trainer({}, c10::Device(c10::kCPU));
  const auto profile = prof::profile_steps(kSteps, [&] { trainer.slow_step(); });
  const auto findings = prof::diagnose(profile, kSteps);
  const std::string found = describe(findings);
  CAPTURE(found);
  CAPTURE(profile.format(12));
  REQUIRE(findings.size() == 3);

  const auto* sync = find(findings, prof::Problem::kHostDeviceSync);
  REQUIRE(sync != nullptr);
  CHECK(sync->phase == "phase:forward");  // the loss is read on the host there
  CHECK(sync->op == prof::kSyncOp);
  CHECK(sync->calls_per_step == 1.0);  // exactly one .item() per step

  const auto* data = find(findings, prof::Problem::kDataInStep);
  REQUIRE(data != nullptr);
  CHECK(data->phase == "phase:data");
  CHECK(data->phase_share > 0.5);

  const auto* tiny = find(findings, prof::Problem::kTinyOps);
  REQUIRE(tiny != nullptr);
  CHECK(tiny->phase == "phase:data");
  CHECK(tiny->calls_per_step >= static_cast<double>(trainer.options().batch));  // per-sample ops

  // The bottleneck to fix first: the largest share, the data phase.
  CHECK(findings.front().phase == "phase:data");
  CHECK(profile.step_share(prof::Phase::kData) == doctest::Approx(data->phase_share));
}

TEST_CASE("[step4] after the fix the data phase's share drops below 0.2 and nothing is found") {
  const OneThread one_thread;
  prof::Trainer trainer({}, c10::Device(c10::kCPU));
  trainer.prepare();
  const auto profile = prof::profile_steps(kSteps, [&] { trainer.fast_step(); });
  const auto findings = prof::diagnose(profile, kSteps);
  const std::string found = describe(findings);
  CAPTURE(found);
  CAPTURE(profile.format(12));
  CHECK(profile.step_share(prof::Phase::kData) < 0.2);
  CHECK(profile.calls(prof::kSyncOp) == 0);
  CHECK(findings.empty());
  // Every phase still ran once per step.
  for (const auto phase :
       {prof::Phase::kData, prof::Phase::kForward, prof::Phase::kBackward, prof::Phase::kOptimizer}) {
    CAPTURE(prof::phase_label(phase));
    CHECK(profile.calls(prof::phase_label(phase)) == kSteps);
  }
}

TEST_CASE("[step4] the fixed step trains exactly like the slow one") {
  prof::Trainer slow({}, c10::Device(c10::kCPU));
  prof::Trainer fast({}, c10::Device(c10::kCPU));
  fast.prepare();
  for (int i = 0; i < 20; ++i) {  // 20 steps wrap around the 16 batches of the dataset
    slow.slow_step();
    fast.fast_step();
  }
  const auto a = slow.parameters_flat();
  const auto b = fast.parameters_flat();
  const double max_diff = (a - b).abs().max().item<double>();
  CAPTURE(max_diff);
  CHECK(max_diff <= 1e-5);
  CHECK(fast.mean_loss() == doctest::Approx(slow.mean_loss()).epsilon(1e-5));
  CHECK(fast.steps_done() == 20);
}

TEST_CASE("[step4] bad input to the diagnosis and the fixed step gets a clear error") {
  prof::Trainer trainer({}, c10::Device(c10::kCPU));
  CHECK_THROWS_WITH_AS(trainer.fast_step(), Contains("prepare()"), c10::Error);
  const auto profile = prof::profile_steps(1, [&] { trainer.slow_step(); });
  CHECK_THROWS_WITH_AS(prof::diagnose(profile, 0), Contains("steps"), c10::Error);
  const auto no_phases = prof::profile_steps(1, [] { at::ones({2}).sum(); });
  CHECK_THROWS_WITH_AS(prof::diagnose(no_phases, 1), Contains("no phase"), c10::Error);
}

GPU_TEST_CASE("[step4] GPU: the same diagnosis and fix on CUDA") {
  const c10::Device cuda(c10::kCUDA, 0);
  prof::Trainer slow({}, cuda);
  const auto before = prof::profile_steps(kSteps, [&] { slow.slow_step(); });
  const auto findings = prof::diagnose(before, kSteps);
  const std::string found = describe(findings);
  CAPTURE(found);
  REQUIRE(find(findings, prof::Problem::kHostDeviceSync) != nullptr);
  CHECK(find(findings, prof::Problem::kHostDeviceSync)->calls_per_step == 1.0);
  REQUIRE(find(findings, prof::Problem::kDataInStep) != nullptr);
  prof::Trainer fast({}, cuda);
  fast.prepare();
  const auto after = prof::profile_steps(kSteps, [&] { fast.fast_step(); });
  CHECK(after.step_share(prof::Phase::kData) < 0.2);
  CHECK(after.calls(prof::kSyncOp) == 0);
}
