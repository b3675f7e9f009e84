// Lesson 3, given code: recording ranges through the compatibility layer, and the Profile's small helpers.
#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include <c10/util/Exception.h>

#include "lesson3_profiling/profiler.h"
#include "common/compat/compat_profiler.h"

namespace prof {

namespace {

std::vector<Event> to_events(const std::vector<workshop::compat::ProfiledRange>& ranges) {
  std::vector<Event> events;
  events.reserve(ranges.size());
  for (const auto& range : ranges) {
    Event event;
    event.name = range.name;
    event.thread = range.thread;
    event.start_us = static_cast<double>(range.start_ns) / 1000.0;
    event.end_us = static_cast<double>(range.end_ns) / 1000.0;
    event.self_device_us = static_cast<double>(range.device_ns) / 1000.0;
    event.self_bytes = range.bytes;
    events.push_back(std::move(event));
  }
  return events;
}

std::vector<Kernel> to_kernels(const std::vector<workshop::compat::DeviceActivity>& activities) {
  std::vector<Kernel> kernels;
  kernels.reserve(activities.size());
  for (const auto& a : activities) {
    Kernel kernel;
    kernel.name = a.name;
    kernel.device = a.device;
    kernel.stream = a.stream;
    kernel.start_us = static_cast<double>(a.start_ns) / 1000.0;
    kernel.end_us = static_cast<double>(a.end_ns) / 1000.0;
    kernel.op = a.range;
    kernels.push_back(std::move(kernel));
  }
  return kernels;
}

}  // namespace

std::string profiler_backend() { return workshop::compat::profiler_backend(); }

bool backend_can_save_trace() { return workshop::compat::backend_can_save(); }

void save_backend_trace(const std::string& path) { workshop::compat::save_backend_trace(path); }

bool recording_active() { return workshop::compat::profiler_active(); }

void start_recording() {
  TORCH_CHECK(!recording_active(), "start_recording: already profiling (a profiler is recording on this thread)");
  workshop::compat::start_profiler();
}

std::vector<Event> stop_recording(std::vector<Kernel>* kernels) {
  TORCH_CHECK(recording_active(), "stop_recording: not profiling (no profiler is recording on this thread)");
  const auto recording = workshop::compat::stop_profiler();
  if (kernels != nullptr) *kernels = to_kernels(recording.device);
  return to_events(recording.ranges);
}

std::vector<Event> record_events(const std::function<void()>& work) {
  TORCH_CHECK(static_cast<bool>(work), "record_events: work is empty");
  start_recording();
  try {
    work();
  } catch (...) {
    stop_recording();
    throw;
  }
  return stop_recording();
}

Profile::Profile(std::vector<Event> events, std::vector<Kernel> kernels)
    : events_(std::move(events)), kernels_(std::move(kernels)) {
  attribute(events_);
  for (const auto& event : events_) {
    if (event.depth == 0) wall_us_ += event.total_us();
  }
  for (const auto& kernel : kernels_) {
    TORCH_CHECK(kernel.op >= -1 && kernel.op < static_cast<int64_t>(events_.size()), "Profile: kernel ", kernel.name,
                " names op ", kernel.op, " but the profile has ", events_.size(), " events");
    TORCH_CHECK(kernel.end_us >= kernel.start_us, "Profile: kernel ", kernel.name, " ends before it starts");
  }
}

bool Profile::has_device_time() const {
  for (const auto& event : events_) {
    if (event.self_device_us > 0) return true;
  }
  return false;
}

std::vector<Row> Profile::phase_table() const {
  std::vector<Row> rows;
  for (const auto& row : table()) {
    if (is_phase_label(row.name)) rows.push_back(row);
  }
  return rows;
}

Row Profile::row(const std::string& name) const {
  for (const auto& row : table()) {
    if (row.name == name) return row;
  }
  Row none;
  none.name = name;
  return none;
}

std::string Profile::format(size_t max_rows) const {
  const auto rows = table();
  const bool device = has_device_time();
  size_t width = 4;
  for (size_t i = 0; i < rows.size() && i < max_rows; ++i) width = std::max(width, rows[i].name.size());
  width = std::min<size_t>(width, 60);
  std::ostringstream out;
  char line[320];
  std::snprintf(line, sizeof line, "%-*s %8s %12s %12s %7s %12s", static_cast<int>(width), "name", "calls",
                "total (ms)", "self (ms)", "share", "alloc (KiB)");
  out << line;
  if (device) {
    std::snprintf(line, sizeof line, " %13s %13s", "device (ms)", "self dev (ms)");
    out << line;
  }
  out << "\n";
  for (size_t i = 0; i < rows.size() && i < max_rows; ++i) {
    const Row& r = rows[i];
    const std::string name = r.name.size() > width ? r.name.substr(0, width - 3) + "..." : r.name;
    std::snprintf(line, sizeof line, "%-*s %8lld %12.3f %12.3f %6.1f%% %12.1f", static_cast<int>(width), name.c_str(),
                  static_cast<long long>(r.calls), r.total_us / 1000.0, r.self_us / 1000.0, 100.0 * r.share,
                  static_cast<double>(r.bytes) / 1024.0);
    out << line;
    if (device) {
      std::snprintf(line, sizeof line, " %13.3f %13.3f", r.device_us / 1000.0, r.self_device_us / 1000.0);
      out << line;
    }
    out << "\n";
  }
  if (rows.size() > max_rows) out << "... " << rows.size() - max_rows << " more rows\n";
  return out.str();
}

double Profile::step_share(Phase phase, Clock clock) const {
  const std::string label = phase_label(phase);
  std::map<std::string, std::vector<double>> durations;  // phase label -> total_us (device_us) of each occurrence
  for (const auto& event : events_) {
    if (event.depth == 0 && is_phase_label(event.name)) {
      durations[event.name].push_back(clock == Clock::kDevice ? event.device_us : event.total_us());
    }
  }
  TORCH_CHECK(durations.count(label), "step_share: the profile has no ", label, " range");
  const size_t steps = durations[label].size();
  for (const auto& entry : durations) {
    TORCH_CHECK(entry.second.size() == steps, "step_share: ", entry.first, " ran ", entry.second.size(), " times but ",
                label, " ", steps, " times; profile whole steps");
  }
  std::vector<double> shares;
  for (size_t k = 0; k < steps; ++k) {
    double step_us = 0;
    for (const auto& entry : durations) step_us += entry.second[k];
    shares.push_back(step_us > 0 ? durations[label][k] / step_us : 0.0);
  }
  std::sort(shares.begin(), shares.end());
  return steps % 2 ? shares[steps / 2] : 0.5 * (shares[steps / 2 - 1] + shares[steps / 2]);
}

Profile profile_steps(int64_t steps, const std::function<void()>& step, int64_t warmup) {
  TORCH_CHECK(steps >= 1, "profile_steps: steps must be >= 1, got ", steps);
  TORCH_CHECK(warmup >= 0, "profile_steps: warmup must be >= 0, got ", warmup);
  TORCH_CHECK(static_cast<bool>(step), "profile_steps: step is empty");
  for (int64_t i = 0; i < warmup; ++i) step();
  Profiler profiler;
  profiler.start();
  for (int64_t i = 0; i < steps; ++i) step();
  return profiler.stop();
}

}  // namespace prof
