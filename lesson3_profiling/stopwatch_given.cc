// Lesson 3, given code: the wrong way to time GPU work, kept for comparison (the demo and a GPU check use it).
#include <algorithm>
#include <chrono>

#include <c10/util/Exception.h>

#include "lesson3_profiling/stopwatch.h"

namespace prof {

Measurement measure_unsynchronized(c10::Device device, const std::function<void()>& work, int warmup, int repeats) {
  TORCH_CHECK(repeats >= 1, "measure_unsynchronized: repeats must be >= 1, got ", repeats);
  TORCH_CHECK(warmup >= 0, "measure_unsynchronized: warmup must be >= 0, got ", warmup);
  TORCH_CHECK(static_cast<bool>(work), "measure_unsynchronized: work is empty");
  (void)device;  // deliberately unused: nothing waits for the device
  for (int i = 0; i < warmup; ++i) work();
  Measurement m;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    work();  // on CUDA this returns once the kernels are queued
    const auto stop = std::chrono::steady_clock::now();
    m.samples_ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  auto sorted = m.samples_ms;
  std::sort(sorted.begin(), sorted.end());
  m.min_ms = sorted.front();
  m.max_ms = sorted.back();
  const size_t n = sorted.size();
  m.median_ms = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  return m;
}

}  // namespace prof
