// Lesson 3 — profile the bottleneck. Part 1: a stopwatch that tells the truth on CPU and on CUDA.
//
// CUDA work is asynchronous: an op returns to the host as soon as its kernel is queued. A host clock read
// around GPU work measures the launch, not the work, unless the device is synchronised (or device events are
// timed) before each reading. See lesson3_profiling/README.md, step 1.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include <c10/core/Device.h>

namespace prof {

/// Repeated timings of one piece of work, in milliseconds.
struct Measurement {
  double median_ms = 0;
  double min_ms = 0;
  double max_ms = 0;
  std::vector<double> samples_ms;  ///< one per repeat, in the order they ran
};

/// Step 1. The median of `values`: the middle value, or the mean of the two middle values for an even count.
/// An error for an empty vector.
double median(std::vector<double> values);

/// Step 1. Measures intervals of work on one device. start() and stop_ms() each wait until all work queued on
/// the device is done before reading the host clock, so the interval holds the device's work, not only its
/// launch. On CPU there is nothing to wait for.
class Stopwatch {
 public:
  explicit Stopwatch(c10::Device device) : device_(device) {}

  /// Waits for the device, then starts the clock.
  void start();

  /// Waits for the device, then returns the milliseconds since start(). An error if start() was not called
  /// since the last stop_ms().
  double stop_ms();

  c10::Device device() const { return device_; }

 private:
  c10::Device device_;
  bool running_ = false;
  std::chrono::steady_clock::time_point started_;
};

/// Step 1. Runs `work` `warmup` times untimed (first calls pay for allocation, library handles, caches), then
/// `repeats` times, each timed with a Stopwatch. Errors: repeats < 1, warmup < 0, an empty `work`.
Measurement measure(c10::Device device, const std::function<void()>& work, int warmup, int repeats);

/// Given (the mistake to avoid): like measure(), but reads the host clock around `work` without waiting for
/// the device. On CUDA it reports the time to queue the work. Same argument checks as measure().
Measurement measure_unsynchronized(c10::Device device, const std::function<void()>& work, int warmup, int repeats);

}  // namespace prof
