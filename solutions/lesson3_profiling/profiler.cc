// Lesson 3, reference solution of part 3: nesting, aggregation, trace export, the profiler object.
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
  TORCH_CHECK(!events.empty(), "attribute: empty profile (no events were recorded)");
  // One stack of open events per thread. Events arrive sorted by start (parents before children), so the
  // parent of an event is the innermost open event that still contains it.
  std::unordered_map<uint64_t, std::vector<int64_t>> stacks;
  for (int64_t i = 0; i < static_cast<int64_t>(events.size()); ++i) {
    Event& event = events[i];
    auto& stack = stacks[event.thread];
    while (!stack.empty() && events[stack.back()].end_us < event.end_us) stack.pop_back();
    event.parent = stack.empty() ? -1 : stack.back();
    event.depth = static_cast<int>(stack.size());
    event.self_us = event.total_us();
    if (event.parent >= 0) {
      Event& parent = events[event.parent];
      parent.self_us -= event.total_us();  // the child's time is not the parent's own
      event.phase = parent.phase;
    } else {
      event.phase.clear();
    }
    if (is_phase_label(event.name)) event.phase = event.name;
    stack.push_back(i);
  }
  // Device time nests like host time: an event's kernels plus everything launched inside it. Children come
  // after their parent, so a backward pass has every child's total before its parent needs it.
  for (auto& event : events) event.device_us = event.self_device_us;
  for (int64_t i = static_cast<int64_t>(events.size()) - 1; i >= 0; --i) {
    if (events[i].parent >= 0) events[events[i].parent].device_us += events[i].device_us;
  }
}
// [attribute]

// [table]
std::vector<Row> Profile::table() const {
  TORCH_CHECK(!events_.empty(), "table: empty profile (no events were recorded)");
  std::map<std::string, Row> by_name;
  for (const auto& event : events_) {
    Row& row = by_name[event.name];
    row.name = event.name;
    row.calls += 1;
    row.total_us += event.total_us();
    row.self_us += event.self_us;
    row.device_us += event.device_us;
    row.self_device_us += event.self_device_us;
    row.bytes += event.self_bytes;
  }
  std::vector<Row> rows;
  rows.reserve(by_name.size());
  for (auto& entry : by_name) {
    entry.second.share = wall_us_ > 0 ? entry.second.total_us / wall_us_ : 0.0;
    rows.push_back(entry.second);
  }
  // On a GPU an op's host range is mostly its launch; its kernels are the work, so rank by device time there.
  const bool device = has_device_time();
  std::stable_sort(rows.begin(), rows.end(), [device](const Row& a, const Row& b) {
    const double ta = device ? a.device_us : a.total_us;
    const double tb = device ? b.device_us : b.total_us;
    if (ta != tb) return ta > tb;
    return a.name < b.name;
  });
  return rows;
}
// [table]

namespace {

std::string json_escape(const std::string& text) {
  std::string out;
  for (const unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof buffer, "\\u%04x", c);
          out += buffer;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

}  // namespace

// [trace]
void Profile::write_chrome_trace(const std::string& path) const {
  std::ofstream out(path);
  TORCH_CHECK(out.good(), "write_chrome_trace: cannot open '", path, "' for writing");
  out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [";
  char numbers[96];
  for (size_t i = 0; i < events_.size(); ++i) {
    const Event& e = events_[i];
    std::snprintf(numbers, sizeof numbers, "\"ts\": %.3f, \"dur\": %.3f", e.start_us, e.total_us());
    out << (i ? ",\n" : "\n") << "{\"name\": \"" << json_escape(e.name) << "\", \"cat\": \""
        << (is_phase_label(e.name) ? "phase" : "op") << "\", \"ph\": \"X\", " << numbers
        << ", \"pid\": 0, \"tid\": " << e.thread << "}";
  }
  for (size_t i = 0; i < kernels_.size(); ++i) {  // the device's own track: pid 1, one row per stream
    const Kernel& k = kernels_[i];
    std::snprintf(numbers, sizeof numbers, "\"ts\": %.3f, \"dur\": %.3f", k.start_us, k.end_us - k.start_us);
    out << (events_.empty() && i == 0 ? "\n" : ",\n") << "{\"name\": \"" << json_escape(k.name)
        << "\", \"cat\": \"kernel\", \"ph\": \"X\", " << numbers << ", \"pid\": 1, \"tid\": " << k.stream << "}";
  }
  out << "\n]}\n";
  out.close();
  TORCH_CHECK(!out.fail(), "write_chrome_trace: writing '", path, "' failed");
}
// [trace]

// [profiler]
Profiler::~Profiler() {
  if (recording_) {
    try {
      stop_recording();
    } catch (...) {
      // a destructor must not throw; the recording is dropped
    }
  }
}

void Profiler::start() {
  TORCH_CHECK(!recording_, "Profiler::start: already profiling (this profiler is recording)");
  TORCH_CHECK(!recording_active(), "Profiler::start: already profiling (another profiler is recording)");
  start_recording();
  recording_ = true;
}

Profile Profiler::stop() {
  TORCH_CHECK(recording_, "Profiler::stop: not profiling (start() was not called)");
  recording_ = false;
  std::vector<Kernel> kernels;
  std::vector<Event> events = stop_recording(&kernels);
  TORCH_CHECK(!events.empty(), "Profiler::stop: empty profile (nothing ran between start() and stop())");
  return Profile(std::move(events), std::move(kernels));
}
// [profiler]

}  // namespace prof
