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
  // TODO(lesson3, step 1): Reject an empty vector (TORCH_CHECK, a message with "empty"). Sort the values and
  // return the middle one, or the mean of the two middle ones for an even count.
  TORCH_CHECK(false, "TODO(lesson3, step 1): median() is not implemented yet");
}
// [median]

// [stopwatch]
void Stopwatch::start() {
  // TODO(lesson3, step 1): Wait for the device (workshop::synchronize), remember that the stopwatch runs and
  // read the clock into started_.
  TORCH_CHECK(false, "TODO(lesson3, step 1): Stopwatch::start() is not implemented yet");
}

double Stopwatch::stop_ms() {
  // TODO(lesson3, step 1): An error (message with "start") if the stopwatch is not running. Wait for the
  // device, read the clock, stop running, return the elapsed milliseconds.
  TORCH_CHECK(false, "TODO(lesson3, step 1): Stopwatch::stop_ms() is not implemented yet");
}
// [stopwatch]

// [measure]
Measurement measure(c10::Device device, const std::function<void()>& work, int warmup, int repeats) {
  // TODO(lesson3, step 1): Check the arguments (messages naming "repeats", "warmup", "work"). Run `work`
  // `warmup` times untimed, then `repeats` times between a Stopwatch's start() and stop_ms(). Fill samples_ms,
  // min_ms, max_ms and median_ms.
  TORCH_CHECK(false, "TODO(lesson3, step 1): measure() is not implemented yet");
}
// [measure]

}  // namespace prof
