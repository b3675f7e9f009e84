// Lesson 3, part 1 — your code. Replace each TODO with an implementation; the checks in stopwatch_test.cc
// tell you when it is right:  bazel test //lesson3_profiling:all --test_arg=--test-case='*step1*'
// Steps, hints and background: lesson3_profiling/README.md.
#include "lesson3_profiling/stopwatch.h"

#include <algorithm>

#include <c10/util/Exception.h>

#include "common/device.h"

namespace prof {

// [median]
double median(std::vector<double> values) {
  // TODO(lesson3, step 1): Reject an empty vector; sort the values and return the middle one, or the mean of the two
  // middle ones (about 4 lines)
  TORCH_CHECK(false, "TODO(lesson3, step 1): median() is not implemented yet");
}
// [median]

// [stopwatch]
void Stopwatch::start() {
  // TODO(lesson3, step 1): Wait for the device (workshop::synchronize), mark the stopwatch as running and read the
  // clock into started_ (about 3 lines)
  TORCH_CHECK(false, "TODO(lesson3, step 1): Stopwatch::start() is not implemented yet");
}

double Stopwatch::stop_ms() {
  // TODO(lesson3, step 1): Refuse a stopwatch that is not running; wait for the device, read the clock, stop running
  // and return the elapsed milliseconds (about 5 lines)
  TORCH_CHECK(false, "TODO(lesson3, step 1): Stopwatch::stop_ms() is not implemented yet");
}
// [stopwatch]

// [measure]
Measurement measure(c10::Device device, const std::function<void()>& work, int warmup, int repeats) {
  // TODO(lesson3, step 1): Check the arguments; run `work` `warmup` times untimed, then `repeats` times between a
  // Stopwatch's start() and stop_ms(); fill the Measurement (about 15 lines)
  TORCH_CHECK(false, "TODO(lesson3, step 1): measure() is not implemented yet");
}
// [measure]

}  // namespace prof
