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

// A GPU-shaped profile of `steps` steps, made by hand: the data phase holds the host longest with 40 tiny ops of
// no device work; the forward phase returns fast but its matmul keeps the device busy for 400 us, and it reads
// the loss on the host once. `device` = false makes the same profile without device time (a CPU's).
prof::Profile gpu_shaped(int64_t steps, bool device) {
  std::vector<prof::Event> events;
  auto add = [&](const std::string& name, double start, double end, double device_us) {
    prof::Event e;
    e.name = name;
    e.thread = 1;
    e.start_us = start;
    e.end_us = end;
    e.self_device_us = device ? device_us : 0.0;
    events.push_back(e);
  };
  for (int64_t k = 0; k < steps; ++k) {
    const double t = 110.0 * static_cast<double>(k);
    add("phase:data", t, t + 80, 0);
    for (int i = 0; i < 40; ++i) add("aten::select", t + 2 * i, t + 2 * i + 1, 0);
    add("phase:forward", t + 80, t + 100, 0);
    add("aten::mm", t + 81, t + 85, 400);
    add(prof::kSyncOp, t + 90, t + 99, 0);
    add("phase:backward", t + 100, t + 105, 0);
    add("aten::mm", t + 101, t + 104, 20);
    add("phase:optimizer", t + 105, t + 110, 0);
    add("aten::sub_", t + 106, t + 109, 10);
  }
  return prof::Profile(events);
}

}  // namespace

TEST_CASE("[step4] on a GPU profile the diagnosis ranks by device time, on a CPU profile by host time") {
  constexpr int64_t steps = 3;
  const auto gpu = gpu_shaped(steps, true);
  REQUIRE(gpu.has_device_time());
  const auto on_gpu = prof::diagnose(gpu, steps);
  const std::string gpu_found = describe(on_gpu);
  CAPTURE(gpu_found);
  REQUIRE(!on_gpu.empty());
  // The device is busy in forward (400 of 430 us per step), idle in data: forward's sync comes first, and the
  // data phase, long only on the host, is no "data in step" problem there.
  CHECK(on_gpu.front().phase == "phase:forward");
  CHECK(on_gpu.front().problem == prof::Problem::kHostDeviceSync);
  CHECK(on_gpu.front().phase_share == doctest::Approx(400.0 / 430.0));
  CHECK(find(on_gpu, prof::Problem::kDataInStep) == nullptr);
  for (const auto& f : on_gpu) {
    CAPTURE(f.phase);
    for (const auto phase :
         {prof::Phase::kData, prof::Phase::kForward, prof::Phase::kBackward, prof::Phase::kOptimizer}) {
      if (prof::phase_label(phase) == f.phase) {
        CHECK(f.phase_share == doctest::Approx(gpu.step_share(phase, prof::Clock::kDevice)));
      }
    }
  }

  const auto cpu = gpu_shaped(steps, false);
  const auto on_cpu = prof::diagnose(cpu, steps);
  const std::string cpu_found = describe(on_cpu);
  CAPTURE(cpu_found);
  REQUIRE(!on_cpu.empty());
  CHECK(on_cpu.front().phase == "phase:data");
  CHECK(on_cpu.front().phase_share == doctest::Approx(80.0 / 110.0));
  REQUIRE(find(on_cpu, prof::Problem::kDataInStep) != nullptr);
}

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
