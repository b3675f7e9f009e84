// Lesson 3 — profile the bottleneck. Part 3: profile N steps, aggregate the events into a table, export a trace.
//
// Python has `prof.key_averages().table()`; LibTorch's C++ API has no such thing. Here the profiler's raw
// ranges (one per op, autograd node or ScopedRange) are nested by time, given their self time and their
// phase, aggregated by name into a sorted table and written as a Chrome/Perfetto trace.
// See lesson3_profiling/README.md, step 3.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lesson3_profiling/phases.h"

namespace prof {

/// One profiled range. The recorder fills name, thread, start_us, end_us, self_device_us and self_bytes;
/// attribute() fills the rest.
struct Event {
  std::string name;
  uint64_t thread = 0;
  double start_us = 0;  ///< host clock, microseconds since the first event of the profile
  double end_us = 0;
  double self_device_us = 0;  ///< device time of the kernels this event launched itself (0 on a CPU)
  int64_t self_bytes = 0;     ///< bytes allocated by this event itself, not inside its children
  int64_t parent = -1;        ///< index (in the profile) of the innermost enclosing event, -1 for none
  int depth = -1;             ///< 0 for a range with no enclosing range on its thread, else parent's depth + 1
  double self_us = 0;         ///< total_us() minus the total of its direct children
  double device_us = 0;       ///< self_device_us plus the device_us of its direct children
  std::string phase;          ///< the nearest enclosing phase label (itself if it is one), or "" outside phases

  double total_us() const { return end_us - start_us; }
};

/// One activity on a device (a kernel, a copy), recorded where the backend sees the device (Kineto on a GPU).
struct Kernel {
  std::string name;
  int device = 0;
  int64_t stream = 0;
  double start_us = 0;  ///< the events' clock, microseconds
  double end_us = 0;
  int64_t op = -1;  ///< index (in the profile's events) of the op that launched it, -1 if unknown
};

/// Given. The profiler backend that records (common/compat/compat_profiler.h): "kineto" or "legacy".
std::string profiler_backend();

/// Given. Whether the backend can write a trace of its own (Kineto with libkineto: LibTorch 2.x).
bool backend_can_save_trace();

/// Given. Writes the last recording's trace as the backend writes it (Kineto's ProfilerResult::save). An error
/// where backend_can_save_trace() is false.
void save_backend_trace(const std::string& path);

/// Given. Whether a LibTorch profiler is recording on this thread (this lesson's or anyone's).
bool recording_active();

/// Given. Starts the LibTorch profiler through the compatibility layer (common/compat/compat_profiler.h).
/// An error if one is already recording.
void start_recording();

/// Given. Stops the profiler started by start_recording() and returns its ranges as events sorted by start
/// time (a parent before its children), not yet attributed. An error if none is recording. `kernels`, if
/// given, receives the device activities (empty on a CPU).
std::vector<Event> stop_recording(std::vector<Kernel>* kernels = nullptr);

/// Given. Runs `work` under the LibTorch profiler and returns its ranges sorted by start time (a parent
/// before its children), not yet attributed. An error if a profiler is already recording.
std::vector<Event> record_events(const std::function<void()>& work);

/// Step 3. Fills parent, depth, self_us, device_us and phase of every event. Nesting is by time on each thread: an event is a
/// child of the innermost earlier event on the same thread whose interval contains it. `events` must be sorted
/// as record_events() returns them. An error for an empty list ("empty profile").
void attribute(std::vector<Event>& events);

/// One line of the table: every event of one name together.
struct Row {
  std::string name;
  int64_t calls = 0;
  double total_us = 0;        ///< sum of the events' total_us()
  double self_us = 0;         ///< sum of the events' self_us
  double share = 0;           ///< total_us / Profile::wall_us(): the fraction of the profiled time spent inside
  double device_us = 0;       ///< sum of the events' device_us
  double self_device_us = 0;  ///< sum of the events' self_device_us
  int64_t bytes = 0;          ///< sum of the events' self_bytes: bytes these ops allocated themselves
};

/// Which clock a share is measured on: the host's (the ops' ranges) or the device's (their kernels).
enum class Clock { kHost, kDevice };

/// A finished, attributed profile.
class Profile {
 public:
  /// Given. Takes the recorded events (and device activities) and attributes them (see attribute()).
  explicit Profile(std::vector<Event> events, std::vector<Kernel> kernels = {});

  const std::vector<Event>& events() const { return events_; }
  const std::vector<Kernel>& kernels() const { return kernels_; }

  /// Given. Whether the profile holds device time (a GPU profile): some event has self_device_us > 0.
  bool has_device_time() const;

  /// Given. The profiled time: the sum of the totals of the top-level (depth 0) events.
  double wall_us() const { return wall_us_; }

  /// Step 3. One row per event name, sorted by the time that matters, largest first (ties: by name): device_us
  /// in a profile with device time (on a GPU an op's host range times its launch, its kernels the work),
  /// else total_us.
  std::vector<Row> table() const;

  /// Given. The rows of the phase labels only, in table order.
  std::vector<Row> phase_table() const;

  /// Given. The row called `name`, or a row with 0 calls if there is none.
  Row row(const std::string& name) const;

  /// Given. How often an event called `name` was recorded.
  int64_t calls(const std::string& name) const { return row(name).calls; }

  /// Given. share of the phase's row: the fraction of the profiled time spent in that phase.
  double share(Phase phase) const { return row(phase_label(phase)).share; }

  /// Given. The median over the profiled steps of the phase's share of its step (step k: the k-th range of
  /// each top-level phase), measured on `clock` (kHost: total_us, kDevice: device_us). Unlike share(), one
  /// step stretched by the operating system (a preempted thread) barely moves it. Errors: no such phase in
  /// the profile, or phases that ran unequal numbers of times.
  double step_share(Phase phase, Clock clock = Clock::kHost) const;

  /// Given. The table as aligned text, at most `max_rows` rows.
  std::string format(size_t max_rows = 20) const;

  /// Step 3. Writes the events as a Chrome trace ({"traceEvents": [...]} with one complete event, "ph": "X",
  /// per range, "pid" 0 and "tid" its thread; then one per kernel, "pid" 1 and "tid" its stream; ts and dur in
  /// microseconds) that chrome://tracing and ui.perfetto.dev open. Names are JSON escaped. An error naming the
  /// path if the file cannot be written.
  void write_chrome_trace(const std::string& path) const;

 private:
  std::vector<Event> events_;
  std::vector<Kernel> kernels_;
  double wall_us_ = 0;
};

/// Step 3. Records a profile of the work run between start() and stop(). One recording at a time per
/// thread: start() is an error ("already profiling") while this or any other profiler records; stop() is an
/// error ("not profiling") when this one is not recording, and ("empty profile") when nothing was recorded.
/// The destructor stops a recording that is still running and drops it.
class Profiler {
 public:
  Profiler() = default;
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  void start();
  Profile stop();
  bool recording() const { return recording_; }

 private:
  bool recording_ = false;
};

/// Given. Runs `step` `warmup` times unprofiled, then profiles `steps` runs of it. An error for steps < 1.
Profile profile_steps(int64_t steps, const std::function<void()>& step, int64_t warmup = 1);

}  // namespace prof
