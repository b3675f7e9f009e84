// Lesson 3, reference solution of part 1: the stopwatch.
#include "lesson3_profiling/stopwatch.h"

#include <algorithm>

#include <c10/util/Exception.h>

#include "common/device.h"

namespace prof {

// [median]
double median(std::vector<double> values) {
  TORCH_CHECK(!values.empty(), "median: no values (empty vector)");
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}
// [median]

// [stopwatch]
void Stopwatch::start() {
  // Work queued before start() must not be counted: wait for it first.
  workshop::synchronize(device_);
  running_ = true;
  started_ = std::chrono::steady_clock::now();
}

double Stopwatch::stop_ms() {
  TORCH_CHECK(running_, "Stopwatch::stop_ms: start() was not called");
  // The clock stops when the device has finished, not when the host has queued the work.
  workshop::synchronize(device_);
  const auto stopped = std::chrono::steady_clock::now();
  running_ = false;
  return std::chrono::duration<double, std::milli>(stopped - started_).count();
}
// [stopwatch]

// [measure]
Measurement measure(c10::Device device, const std::function<void()>& work, int warmup, int repeats) {
  TORCH_CHECK(repeats >= 1, "measure: repeats must be >= 1, got ", repeats);
  TORCH_CHECK(warmup >= 0, "measure: warmup must be >= 0, got ", warmup);
  TORCH_CHECK(static_cast<bool>(work), "measure: work is empty");
  for (int i = 0; i < warmup; ++i) work();
  Measurement m;
  Stopwatch stopwatch(device);
  for (int i = 0; i < repeats; ++i) {
    stopwatch.start();
    work();
    m.samples_ms.push_back(stopwatch.stop_ms());
  }
  m.min_ms = *std::min_element(m.samples_ms.begin(), m.samples_ms.end());
  m.max_ms = *std::max_element(m.samples_ms.begin(), m.samples_ms.end());
  m.median_ms = median(m.samples_ms);
  return m;
}
// [measure]

}  // namespace prof
