// Lesson 3, part 3 — your code: nesting, the table, the trace, the profiler object. Checks: profiler_test.cc,
//   bazel test //lesson3_profiling:all --test_arg=--test-case='*step3*'
// Steps, hints and background: lesson3_profiling/README.md.
#include "lesson3_profiling/profiler.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <unordered_map>

#include <c10/util/Exception.h>

namespace prof {

// [attribute]
void attribute(std::vector<Event>& events) {
  // TODO(lesson3, step 3): An error for an empty list (message with "empty profile"). Walk the events in
  // order with one stack of open events per thread: pop the events that end before this one ends; the top is
  // the parent. Set parent, depth (stack size), self_us (total minus the children's totals) and phase (the
  // event itself if is_phase_label(), else the parent's phase, else ""). Then device_us: the event's own
  // self_device_us plus its children's device_us (children come after their parent: walk backwards).
  TORCH_CHECK(false, "TODO(lesson3, step 3): attribute() is not implemented yet");
}
// [attribute]

// [table]
std::vector<Row> Profile::table() const {
  // TODO(lesson3, step 3): An error for an empty profile. Sum calls, total_us, self_us, device_us,
  // self_device_us and bytes (the events' self_bytes) per event name; share = total_us / wall_us(). Sort
  // largest first, ties by name: by device_us if has_device_time() (a GPU profile), else by total_us.
  TORCH_CHECK(false, "TODO(lesson3, step 3): Profile::table() is not implemented yet");
}
// [table]

// [trace]
void Profile::write_chrome_trace(const std::string& path) const {
  // TODO(lesson3, step 3): Open `path` (an error naming it if that fails) and write
  // {"traceEvents": [{"name": ..., "ph": "X", "ts": start_us, "dur": total_us(), "pid": 0, "tid": thread}, ...]}
  // with every name JSON-escaped (at least " and \ and control characters); ts and dur in microseconds. Then
  // one such event per kernel of kernels(), with "pid": 1 and "tid": its stream.
  TORCH_CHECK(false, "TODO(lesson3, step 3): Profile::write_chrome_trace() is not implemented yet");
}
// [trace]

// [profiler]
Profiler::~Profiler() {
  // TODO(lesson3, step 3): If still recording, stop_recording() and drop the result. Never throw.
}

void Profiler::start() {
  // TODO(lesson3, step 3): An error (message with "already profiling") if this profiler or any other is
  // recording (recording_active()). Then start_recording().
  TORCH_CHECK(false, "TODO(lesson3, step 3): Profiler::start() is not implemented yet");
}

Profile Profiler::stop() {
  // TODO(lesson3, step 3): An error (message with "not profiling") unless start() ran. stop_recording(&kernels);
  // an error (message with "empty profile") if no event was recorded; return Profile(events, kernels).
  TORCH_CHECK(false, "TODO(lesson3, step 3): Profiler::stop() is not implemented yet");
}
// [profiler]

}  // namespace prof
