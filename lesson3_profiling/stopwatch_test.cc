// Checks for lesson 3, part 1: the stopwatch (step 1).
// Run: bazel test //lesson3_profiling:all --test_arg=--test-case='*step1*'
#include "tests/torch_doctest.h"

#include <chrono>
#include <thread>

#include <ATen/ATen.h>

#include "lesson3_profiling/stopwatch.h"

using doctest::Contains;

TEST_CASE("[step1] median picks the middle value, or the mean of the two middle values") {
  CHECK(prof::median({5.0, 1.0, 3.0}) == 3.0);
  CHECK(prof::median({4.0, 1.0, 3.0, 2.0}) == 2.5);
  CHECK(prof::median({7.0}) == 7.0);
  CHECK_THROWS_WITH_AS(prof::median({}), Contains("empty"), c10::Error);
}

TEST_CASE("[step1] measure runs the work warmup + repeats times and keeps one sample per repeat") {
  int calls = 0;
  const auto m = prof::measure(
      c10::Device(c10::kCPU), [&] { ++calls; }, 2, 5);
  CHECK(calls == 7);
  REQUIRE(m.samples_ms.size() == 5);
  CAPTURE(m.min_ms);
  CAPTURE(m.median_ms);
  CAPTURE(m.max_ms);
  CHECK(m.min_ms >= 0.0);
  CHECK(m.min_ms <= m.median_ms);
  CHECK(m.median_ms <= m.max_ms);
  CHECK(m.median_ms == prof::median(m.samples_ms));
}

TEST_CASE("[step1] the stopwatch measures at least the time the work surely takes") {
  // std::this_thread::sleep_for blocks for at least the given time: a lower bound, never a flaky threshold.
  prof::Stopwatch stopwatch{c10::Device(c10::kCPU)};
  stopwatch.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double ms = stopwatch.stop_ms();
  CAPTURE(ms);
  CHECK(ms >= 20.0);
  const auto m = prof::measure(
      c10::Device(c10::kCPU), [] { std::this_thread::sleep_for(std::chrono::milliseconds(5)); }, 0, 3);
  CHECK(m.min_ms >= 5.0);
}

TEST_CASE("[step1] bad input to the stopwatch gets a clear error") {
  const c10::Device cpu(c10::kCPU);
  CHECK_THROWS_WITH_AS(prof::measure(
                           cpu, [] {}, 1, 0),
                       Contains("repeats"), c10::Error);
  CHECK_THROWS_WITH_AS(prof::measure(
                           cpu, [] {}, -1, 3),
                       Contains("warmup"), c10::Error);
  CHECK_THROWS_WITH_AS(prof::measure(cpu, std::function<void()>(), 1, 3), Contains("work"), c10::Error);
  prof::Stopwatch stopwatch(cpu);
  CHECK_THROWS_WITH_AS(stopwatch.stop_ms(), Contains("start"), c10::Error);
  stopwatch.start();
  stopwatch.stop_ms();
  CHECK_THROWS_WITH_AS(stopwatch.stop_ms(), Contains("start"), c10::Error);  // one stop per start
}

// [gpu_underreport]
GPU_TEST_CASE("[step1] GPU: a host clock without synchronisation under-reports matmuls; the stopwatch does not") {
  // 10 float32 matmuls of 8192 x 8192: 2 * 8192^3 * 10 = 1.1e13 FLOP. No GPU does that in under 5.5 ms
  // (that would be 2 PFLOP/s, above any GPU's float32 peak), so 5.5 ms is a floor set by physics.
  const c10::Device cuda(c10::kCUDA, 0);
  const int64_t n = 8192;
  const auto a = at::randn({n, n}, at::TensorOptions().device(cuda));
  const auto b = at::randn({n, n}, at::TensorOptions().device(cuda));
  auto c = at::empty({n, n}, at::TensorOptions().device(cuda));
  const auto work = [&] {
    for (int i = 0; i < 10; ++i) at::mm_out(c, a, b);
  };
  const double floor_ms = 2.0 * n * n * n * 10 / 2e15 * 1e3;
  const auto wrong = prof::measure_unsynchronized(cuda, work, 1, 3);
  const auto right = prof::measure(cuda, work, 1, 3);
  CAPTURE(floor_ms);
  CAPTURE(wrong.median_ms);
  CAPTURE(right.median_ms);
  CHECK(wrong.median_ms < floor_ms);
  CHECK(right.median_ms > floor_ms);
}
// [gpu_underreport]
