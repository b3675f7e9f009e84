// Checks for lesson 3, part 3: nesting, the table, the trace and the profiler object (step 3).
// Run: bazel test //lesson3_profiling:all --test_arg=--test-case='*step3*'
#include "tests/torch_doctest.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <ATen/ATen.h>

#include "lesson3_profiling/phases.h"
#include "common/memory_meter.h"
#include "lesson3_profiling/profiler.h"

using doctest::Contains;

namespace {

// A known workload: per step, forward = 2 mm + one "custom" range with 1 add; backward = 1 sub.
void known_step(const at::Tensor& a) {
  {
    prof::ScopedRange range(prof::Phase::kForward);
    at::mm(a, a);
    at::mm(a, a);
    prof::ScopedRange custom("custom");
    at::add(a, a);
  }
  {
    prof::ScopedRange range(prof::Phase::kBackward);
    at::sub(a, a);
  }
}

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

// A small JSON reader: checks the syntax of the whole text and collects the values of every "name" key.
class JsonCheck {
 public:
  explicit JsonCheck(std::string text) : s_(std::move(text)) {}
  bool valid() {
    skip();
    if (!value()) return false;
    skip();
    return i_ == s_.size();
  }
  std::vector<std::string> names;
  // Every object's scalar fields (strings decoded, numbers and literals as written), innermost objects first.
  std::vector<std::map<std::string, std::string>> objects;

 private:
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool literal(const char* word) {
    const std::string w(word);
    if (s_.compare(i_, w.size(), w) != 0) return false;
    i_ += w.size();
    return true;
  }
  bool string(std::string* out) {
    if (i_ >= s_.size() || s_[i_] != '"') return false;
    ++i_;
    std::string text;
    while (i_ < s_.size() && s_[i_] != '"') {
      const char c = s_[i_++];
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        text += c;
        continue;
      }
      if (i_ >= s_.size()) return false;
      const char e = s_[i_++];
      if (e == 'u') {
        if (i_ + 4 > s_.size()) return false;
        for (int k = 0; k < 4; ++k) {
          if (!std::isxdigit(static_cast<unsigned char>(s_[i_ + k]))) return false;
        }
        text += static_cast<char>(std::stoi(s_.substr(i_, 4), nullptr, 16));
        i_ += 4;
      } else if (std::string("\"\\/bfnrt").find(e) != std::string::npos) {
        text += e == 'n' ? '\n' : e == 't' ? '\t' : e;
      } else {
        return false;
      }
    }
    if (i_ >= s_.size()) return false;
    ++i_;
    if (out) *out = text;
    return true;
  }
  bool number() {
    const size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.' || s_[i_] == 'e' ||
                              s_[i_] == 'E' || s_[i_] == '+' || s_[i_] == '-')) {
      ++i_;
    }
    return i_ > start;
  }
  bool value() {
    skip();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      skip();
      if (i_ < s_.size() && s_[i_] == '}') return ++i_, true;
      std::map<std::string, std::string> fields;
      while (true) {
        skip();
        std::string key;
        if (!string(&key)) return false;
        skip();
        if (i_ >= s_.size() || s_[i_++] != ':') return false;
        skip();
        if (i_ < s_.size() && s_[i_] == '"') {
          std::string text;
          if (!string(&text)) return false;
          if (key == "name") names.push_back(text);
          fields[key] = text;
        } else {
          const size_t begin = i_;
          if (!value()) return false;
          if (s_[begin] != '{' && s_[begin] != '[') fields[key] = s_.substr(begin, i_ - begin);
        }
        skip();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_++] == '}') {
          objects.push_back(std::move(fields));
          return true;
        }
        return false;
      }
    }
    if (c == '[') {
      ++i_;
      skip();
      if (i_ < s_.size() && s_[i_] == ']') return ++i_, true;
      while (true) {
        if (!value()) return false;
        skip();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        return i_ < s_.size() && s_[i_++] == ']';
      }
    }
    if (c == '"') return string(nullptr);
    if (literal("true") || literal("false") || literal("null")) return true;
    return number();
  }
  std::string s_;
  size_t i_ = 0;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// One complete event of a trace, as written.
struct TraceEvent {
  std::string name, ph, pid, tid;
  double ts = NAN, dur = NAN;
};

double number_or_nan(const std::map<std::string, std::string>& fields, const std::string& key) {
  const auto it = fields.find(key);
  if (it == fields.end()) return NAN;
  try {
    size_t used = 0;
    const double value = std::stod(it->second, &used);
    return used == it->second.size() ? value : NAN;
  } catch (...) {
    return NAN;
  }
}

// The trace's events: the objects with a "ph" field (Kineto's "args" objects and the top level are not events).
std::vector<TraceEvent> trace_events(const JsonCheck& json) {
  std::vector<TraceEvent> events;
  for (const auto& fields : json.objects) {
    if (!fields.count("ph")) continue;
    TraceEvent e;
    e.ph = fields.at("ph");
    e.name = fields.count("name") ? fields.at("name") : "";
    e.pid = fields.count("pid") ? fields.at("pid") : "";
    e.tid = fields.count("tid") ? fields.at("tid") : "";
    e.ts = number_or_nan(fields, "ts");
    e.dur = number_or_nan(fields, "dur");
    events.push_back(e);
  }
  return events;
}

// The trace-event format's rules for complete events: "ph" "X", a name, numeric ts and dur >= 0, pid and tid;
// and on each (pid, tid) the ranges nest by time (two ranges are disjoint or one holds the other). Returns the
// first broken rule, or "" for none. `slack_us` absorbs the rounding of ts and dur to the microseconds written.
std::string trace_format_problem(const std::vector<TraceEvent>& events, double slack_us = 0.0015) {
  if (events.empty()) return "no events";
  std::map<std::pair<std::string, std::string>, std::vector<TraceEvent>> tracks;
  for (const auto& e : events) {
    if (e.ph != "X") return "event '" + e.name + "' has ph '" + e.ph + "', not a complete event 'X'";
    if (e.name.empty()) return "an event without a name";
    if (std::isnan(e.ts) || std::isnan(e.dur)) return "event '" + e.name + "' lacks a numeric ts or dur";
    if (e.dur < 0) return "event '" + e.name + "' has a negative dur";
    if (e.pid.empty() || e.tid.empty()) return "event '" + e.name + "' lacks pid or tid";
    tracks[{e.pid, e.tid}].push_back(e);
  }
  for (auto& track : tracks) {
    auto& list = track.second;
    std::stable_sort(list.begin(), list.end(), [](const TraceEvent& a, const TraceEvent& b) {
      return a.ts != b.ts ? a.ts < b.ts : a.dur > b.dur;
    });
    std::vector<const TraceEvent*> open;
    for (const auto& e : list) {
      while (!open.empty() && open.back()->ts + open.back()->dur <= e.ts + slack_us) open.pop_back();
      if (!open.empty() && e.ts + e.dur > open.back()->ts + open.back()->dur + slack_us) {
        return "on pid " + track.first.first + " tid " + track.first.second + ", '" + e.name + "' starts inside '" +
               open.back()->name + "' and ends after it";
      }
      open.push_back(&e);
    }
  }
  return "";
}

// The trace's ranges are the profile's, in microseconds: the same names, starts and durations (to the
// rounding of the written numbers). A trace in milliseconds (or nanoseconds) fails here.
std::string trace_units_problem(std::vector<TraceEvent> written, const std::vector<prof::Event>& events,
                                double slack_us = 0.0015) {
  if (written.size() != events.size()) {
    return "the trace has " + std::to_string(written.size()) + " events, the profile " + std::to_string(events.size());
  }
  std::vector<TraceEvent> expected;
  for (const auto& e : events) {
    TraceEvent t;
    t.name = e.name;
    t.ts = e.start_us;
    t.dur = e.total_us();
    expected.push_back(t);
  }
  auto order = [](const TraceEvent& a, const TraceEvent& b) {
    if (a.ts != b.ts) return a.ts < b.ts;
    if (a.dur != b.dur) return a.dur > b.dur;
    return a.name < b.name;
  };
  std::stable_sort(written.begin(), written.end(), order);
  std::stable_sort(expected.begin(), expected.end(), order);
  for (size_t i = 0; i < written.size(); ++i) {
    const auto& w = written[i];
    const auto& x = expected[i];
    if (w.name != x.name || std::fabs(w.ts - x.ts) > slack_us || std::fabs(w.dur - x.dur) > slack_us) {
      return "trace event '" + w.name + "' ts " + std::to_string(w.ts) + " dur " + std::to_string(w.dur) +
             " but the profile's '" + x.name + "' starts at " + std::to_string(x.ts) + " us and lasts " +
             std::to_string(x.dur) + " us (ts and dur must be microseconds)";
    }
  }
  return "";
}

std::vector<TraceEvent> on_pid(const std::vector<TraceEvent>& events, const std::string& pid) {
  std::vector<TraceEvent> out;
  for (const auto& e : events) {
    if (e.pid == pid) out.push_back(e);
  }
  return out;
}

prof::Event made(const std::string& name, double start, double end, double self_device = 0, uint64_t thread = 1) {
  prof::Event e;
  e.name = name;
  e.thread = thread;
  e.start_us = start;
  e.end_us = end;
  e.self_device_us = self_device;
  return e;
}

}  // namespace

TEST_CASE("[step3] call counts are exact for a known workload") {
  const auto a = at::ones({16, 16});
  const auto profile = prof::profile_steps(3, [&] { known_step(a); });
  MESSAGE("profiler backend: " << prof::profiler_backend()
                               << std::string(prof::backend_can_save_trace() ? " (saves a trace of its own)" : ""));
  CHECK(profile.calls("phase:forward") == 3);
  CHECK(profile.calls("phase:backward") == 3);
  CHECK(profile.calls("custom") == 3);
  CHECK(profile.calls("aten::mm") == 6);
  CHECK(profile.calls("aten::add") == 3);
  CHECK(profile.calls("aten::sub") == 3);
  CHECK(profile.calls("phase:data") == 0);
}

TEST_CASE("[step3] self <= total everywhere, and the self times add up to the profiled time") {
  const auto a = at::ones({16, 16});
  const auto profile = prof::profile_steps(2, [&] { known_step(a); });
  double self_sum = 0;
  for (const auto& e : profile.events()) {
    CAPTURE(e.name);
    CHECK(e.self_us >= 0.0);
    CHECK(e.self_us <= e.total_us());
    self_sum += e.self_us;
  }
  CHECK(self_sum == doctest::Approx(profile.wall_us()).epsilon(1e-6));
  for (const auto& row : profile.table()) {
    CAPTURE(row.name);
    CHECK(row.self_us <= row.total_us * (1 + 1e-9));
  }
  // A phase's self time is its total minus its direct children's totals.
  for (size_t i = 0; i < profile.events().size(); ++i) {
    const auto& e = profile.events()[i];
    if (e.name != "phase:forward") continue;
    double children = 0;
    for (const auto& c : profile.events()) {
      if (c.parent == static_cast<int64_t>(i)) children += c.total_us();
    }
    CHECK(e.self_us == doctest::Approx(e.total_us() - children).epsilon(1e-9));
  }
}

TEST_CASE("[step3] nested ops are attributed to the phase that encloses them") {
  const auto a = at::ones({16, 16});
  const auto profile = prof::profile_steps(2, [&] { known_step(a); });
  int checked = 0;
  for (const auto& e : profile.events()) {
    CAPTURE(e.name);
    if (e.name == "aten::mm" || e.name == "custom") {
      CHECK(e.phase == "phase:forward");
      ++checked;
    }
    if (e.name == "aten::add") {  // inside "custom", inside the forward phase
      CHECK(e.phase == "phase:forward");
      CHECK(e.depth == 2);
      REQUIRE(e.parent >= 0);
      CHECK(profile.events()[e.parent].name == "custom");
      ++checked;
    }
    if (e.name == "aten::sub") {
      CHECK(e.phase == "phase:backward");
      CHECK(e.depth == 1);
      ++checked;
    }
    if (prof::is_phase_label(e.name)) {
      CHECK(e.depth == 0);
      CHECK(e.phase == e.name);
      ++checked;
    }
  }
  CHECK(checked == 2 * (2 + 1 + 1 + 1 + 2));
}

TEST_CASE("[step3] the table has one row per name, sorted by total time, with shares of the profiled time") {
  const auto a = at::ones({16, 16});
  const auto profile = prof::profile_steps(4, [&] { known_step(a); });
  const auto rows = profile.table();
  REQUIRE(rows.size() >= 6);
  std::set<std::string> names;
  for (size_t i = 0; i < rows.size(); ++i) {
    CAPTURE(rows[i].name);
    CHECK(names.insert(rows[i].name).second);
    if (i > 0) CHECK(rows[i - 1].total_us >= rows[i].total_us);
    CHECK(rows[i].share == doctest::Approx(rows[i].total_us / profile.wall_us()).epsilon(1e-9));
  }
  // Every top-level event is a phase here, so the phases' shares add up to 1.
  double phase_shares = 0;
  for (const auto& row : profile.phase_table()) phase_shares += row.share;
  CHECK(phase_shares == doctest::Approx(1.0).epsilon(1e-9));
  CHECK(profile.share(prof::Phase::kForward) > profile.row("custom").share);
  CHECK(profile.format().find("aten::mm") != std::string::npos);
  // Each row sums its events: calls, total and self time.
  for (const auto& row : rows) {
    CAPTURE(row.name);
    int64_t calls = 0;
    double total = 0, self = 0;
    for (const auto& e : profile.events()) {
      if (e.name != row.name) continue;
      ++calls;
      total += e.total_us();
      self += e.self_us;
    }
    CHECK(row.calls == calls);
    CHECK(row.total_us == doctest::Approx(total).epsilon(1e-9));
    CHECK(row.self_us == doctest::Approx(self).epsilon(1e-9));
  }
}

TEST_CASE(
    "[step3] attribute nests hand-made events by time: touching siblings, a child ending with its parent, two threads") {
  auto event = [](const std::string& name, uint64_t thread, double start, double end) {
    prof::Event e;
    e.name = name;
    e.thread = thread;
    e.start_us = start;
    e.end_us = end;
    return e;
  };
  // Sorted by start, as the recorder returns them.
  std::vector<prof::Event> events{event("phase:forward", 1, 0, 10), event("other_thread", 2, 1, 30),
                                  event("mm", 1, 2, 10), event("phase:backward", 1, 10, 20), event("sub", 1, 12, 15)};
  prof::attribute(events);
  CHECK(events[0].parent == -1);
  CHECK(events[1].parent == -1);  // on another thread: never a child of thread 1's ranges
  CHECK(events[1].depth == 0);
  CHECK(events[1].phase == "");
  CHECK(events[2].parent == 0);  // ends exactly when its parent ends: still inside
  CHECK(events[2].phase == "phase:forward");
  CHECK(events[3].parent == -1);  // starts exactly when the forward ends: a sibling, not a child
  CHECK(events[3].depth == 0);
  CHECK(events[4].parent == 3);
  CHECK(events[4].phase == "phase:backward");
  CHECK(events[0].self_us == doctest::Approx(2.0));  // 10 minus mm's 8
  CHECK(events[3].self_us == doctest::Approx(7.0));  // 10 minus sub's 3
  CHECK(events[1].self_us == doctest::Approx(29.0));
}

TEST_CASE("[step3] the trace is valid JSON with one complete event per range, phases included") {
  const auto a = at::ones({16, 16});
  const auto profile = prof::profile_steps(2, [&] {
    known_step(a);
    prof::ScopedRange odd("quote\" backslash\\ tab\t");
  });
  const std::string path = temp_path("lesson3_trace.json");
  profile.write_chrome_trace(path);
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  JsonCheck json(text.str());
  REQUIRE(json.valid());
  CHECK(json.names.size() == profile.events().size());
  CHECK(std::count(json.names.begin(), json.names.end(), "phase:forward") == 2);
  CHECK(std::count(json.names.begin(), json.names.end(), "phase:backward") == 2);
  CHECK(std::count(json.names.begin(), json.names.end(), "quote\" backslash\\ tab\t") == 2);
  CHECK(text.str().find("\"traceEvents\"") != std::string::npos);
  CHECK(text.str().find("\"ph\": \"X\"") != std::string::npos);
  CHECK_THROWS_WITH_AS(profile.write_chrome_trace("/nonexistent-dir/trace.json"), Contains("/nonexistent-dir"),
                       c10::Error);
}

TEST_CASE("[step3] profiling while already profiling, stopping twice and an empty profile get clear errors") {
  prof::Profiler first;
  first.start();
  prof::Profiler second;
  CHECK_THROWS_WITH_AS(first.start(), Contains("already profiling"), c10::Error);
  CHECK_THROWS_WITH_AS(second.start(), Contains("already profiling"), c10::Error);
  CHECK_THROWS_WITH_AS(first.stop(), Contains("empty profile"), c10::Error);  // nothing ran
  CHECK_THROWS_WITH_AS(first.stop(), Contains("not profiling"), c10::Error);
  CHECK_THROWS_WITH_AS(second.stop(), Contains("not profiling"), c10::Error);
  std::vector<prof::Event> none;
  CHECK_THROWS_WITH_AS(prof::attribute(none), Contains("empty profile"), c10::Error);
  CHECK_THROWS_WITH_AS(prof::Profile(std::vector<prof::Event>()), Contains("empty profile"), c10::Error);
  // After all that, profiling works again.
  const auto a = at::ones({2, 2});
  first.start();
  at::mm(a, a);
  CHECK(first.stop().calls("aten::mm") == 1);
}

TEST_CASE("[step3] a profiler destroyed while recording stops the recording") {
  {
    prof::Profiler abandoned;
    abandoned.start();
    at::ones({2}).sum();
  }
  CHECK_FALSE(prof::recording_active());
}

TEST_CASE("[step3] device time nests like host time, and the table sums both device columns") {
  // forward [0, 100] holds linear [1, 50] (2 us of kernels of its own) holding mm [2, 40] (30 us), and relu.
  std::vector<prof::Event> events{made("phase:forward", 0, 100), made("aten::linear", 1, 50, 2.0),
                                  made("aten::mm", 2, 40, 30.0), made("aten::relu", 50, 60, 5.0)};
  prof::attribute(events);
  CHECK(events[2].device_us == doctest::Approx(30.0));
  CHECK(events[1].device_us == doctest::Approx(32.0));  // its own 2 plus mm's 30
  CHECK(events[3].device_us == doctest::Approx(5.0));
  CHECK(events[0].device_us == doctest::Approx(37.0));  // nothing of its own: its children's
  const prof::Profile profile(events);
  REQUIRE(profile.has_device_time());
  CHECK(profile.row("aten::linear").device_us == doctest::Approx(32.0));
  CHECK(profile.row("aten::linear").self_device_us == doctest::Approx(2.0));
  CHECK(profile.row("phase:forward").device_us == doctest::Approx(37.0));
  CHECK(profile.row("phase:forward").self_device_us == doctest::Approx(0.0));
  CHECK(profile.row("aten::mm").self_device_us == doctest::Approx(30.0));
}

TEST_CASE("[step3] with device time the table ranks by device time; without, by host time") {
  // On a GPU a launch-bound op holds the host long while its kernels are short; a heavy op returns at once.
  const std::vector<prof::Event> gpu{made("aten::launchy", 0, 90, 1.0), made("aten::heavy", 90, 100, 500.0)};
  const auto gpu_rows = prof::Profile(gpu).table();
  REQUIRE(gpu_rows.size() == 2);
  CHECK(gpu_rows[0].name == "aten::heavy");
  CHECK(gpu_rows[0].device_us == doctest::Approx(500.0));
  const std::vector<prof::Event> cpu{made("aten::launchy", 0, 90), made("aten::heavy", 90, 100)};
  const auto cpu_rows = prof::Profile(cpu).table();
  REQUIRE(cpu_rows.size() == 2);
  CHECK(cpu_rows[0].name == "aten::launchy");
  CHECK_FALSE(prof::Profile(cpu).has_device_time());
}

TEST_CASE("[step3] the trace obeys the trace-event format: complete events in microseconds, pid/tid, nested") {
  const auto a = at::ones({16, 16});
  const auto profile = prof::profile_steps(2, [&] { known_step(a); });
  const std::string path = temp_path("lesson3_format.json");
  profile.write_chrome_trace(path);
  JsonCheck json(read_file(path));
  REQUIRE(json.valid());
  const auto events = trace_events(json);
  const std::string format = trace_format_problem(events);
  CAPTURE(format);
  CHECK(format.empty());
  const std::string units = trace_units_problem(on_pid(events, "0"), profile.events());
  CAPTURE(units);
  CHECK(units.empty());

  // The rules themselves: the same trace in milliseconds, a range crossing its parent's end, an instant event.
  auto in_ms = on_pid(events, "0");
  for (auto& e : in_ms) e.ts /= 1000.0, e.dur /= 1000.0;
  CHECK_FALSE(trace_units_problem(in_ms, profile.events()).empty());
  auto crossing = in_ms;
  crossing.resize(2);
  crossing[0] = {"parent", "X", "0", "1", 0.0, 10.0};
  crossing[1] = {"child", "X", "0", "1", 5.0, 10.0};
  CHECK(trace_format_problem(crossing).find("ends after it") != std::string::npos);
  crossing[1].tid = "2";  // on another thread: no nesting between them
  CHECK(trace_format_problem(crossing).empty());
  crossing[1].ph = "i";
  CHECK_FALSE(trace_format_problem(crossing).empty());
}

TEST_CASE("[step3] kernels go to the trace on the device's track (pid 1, one tid per stream)") {
  std::vector<prof::Event> events{made("phase:forward", 0, 100), made("aten::mm", 10, 20, 70.0)};
  std::vector<prof::Kernel> kernels(2);
  kernels[0] = {"gemm_kernel", 0, 7, 15.0, 60.0, 1};
  kernels[1] = {"gemm_kernel", 0, 7, 60.0, 85.0, 1};
  const prof::Profile profile(events, kernels);
  const std::string path = temp_path("lesson3_kernels.json");
  profile.write_chrome_trace(path);
  JsonCheck json(read_file(path));
  REQUIRE(json.valid());
  const auto written = trace_events(json);
  CHECK(trace_format_problem(written).empty());
  const auto device = on_pid(written, "1");
  REQUIRE(device.size() == 2);
  for (size_t i = 0; i < device.size(); ++i) {
    CHECK(device[i].name == "gemm_kernel");
    CHECK(device[i].tid == "7");
    CHECK(device[i].ts == doctest::Approx(kernels[i].start_us));
    CHECK(device[i].dur == doctest::Approx(kernels[i].end_us - kernels[i].start_us));
  }
  CHECK(on_pid(written, "0").size() == 2);
}

TEST_CASE("[step3] the trace's op ranges agree with the backend's own trace of the same run (Kineto)") {
  const auto a = at::ones({64, 64});
  const auto profile = prof::profile_steps(2, [&] { known_step(a); });
  const std::string ours = temp_path("lesson3_ours.json");
  profile.write_chrome_trace(ours);
  JsonCheck our_json(read_file(ours));
  REQUIRE(our_json.valid());
  if (!prof::backend_can_save_trace()) {
    MESSAGE("backend " << prof::profiler_backend() << " writes no trace of its own: nothing to compare with");
    CHECK_THROWS_AS(prof::save_backend_trace(temp_path("lesson3_backend.json")), c10::Error);
    return;
  }
  const std::string theirs = temp_path("lesson3_kineto.json");
  prof::save_backend_trace(theirs);
  JsonCheck kineto_json(read_file(theirs));
  REQUIRE(kineto_json.valid());
  // Per name, the i-th range of ours and of Kineto's: the same duration and the same start after one offset.
  std::map<std::string, std::vector<TraceEvent>> mine, kinetos;
  for (const auto& e : on_pid(trace_events(our_json), "0")) mine[e.name].push_back(e);
  for (const auto& e : trace_events(kineto_json)) {
    if (e.ph == "X" && mine.count(e.name)) kinetos[e.name].push_back(e);
  }
  auto by_ts = [](const TraceEvent& x, const TraceEvent& y) { return x.ts < y.ts; };
  REQUIRE(kinetos.count("phase:forward"));
  for (auto* m : {&mine, &kinetos}) {
    for (auto& entry : *m) std::stable_sort(entry.second.begin(), entry.second.end(), by_ts);
  }
  const double offset = kinetos["phase:forward"][0].ts - mine["phase:forward"][0].ts;
  int compared = 0;
  for (const char* name : {"phase:forward", "phase:backward", "custom", "aten::mm", "aten::add", "aten::sub"}) {
    CAPTURE(name);
    REQUIRE(mine[name].size() == kinetos[name].size());
    for (size_t i = 0; i < mine[name].size(); ++i) {
      CAPTURE(i);
      CHECK(std::fabs(mine[name][i].dur - kinetos[name][i].dur) <= 1.0);
      CHECK(std::fabs(mine[name][i].ts + offset - kinetos[name][i].ts) <= 1.0);
      ++compared;
    }
  }
  CHECK(compared == 2 * (2 + 1 + 2 + 1 + 1));
}

TEST_CASE("[step3] the table's bytes column counts what each op allocated, as lesson 4's meter does") {
  const auto a = at::ones({64, 64});
  at::Tensor x, y;
  int64_t mm_bytes = 0, all_bytes = 0;
  {
    workshop::MemoryMeter meter;
    x = at::mm(a, a);
    mm_bytes = meter.current_bytes();
    y = at::add(x, a);
    all_bytes = meter.current_bytes();
  }
  REQUIRE(mm_bytes == 64 * 64 * 4);
  x = y = at::Tensor();
  at::Tensor z;
  prof::Profiler profiler;
  profiler.start();
  x = at::mm(a, a);
  y = at::add(x, a);
  z = at::mm(a, a);  // a second call: the row adds both
  const auto profile = profiler.stop();
  REQUIRE(profile.calls("aten::mm") == 2);
  CHECK(profile.row("aten::mm").bytes == 2 * mm_bytes);
  int64_t sum = 0;
  for (const auto& row : profile.table()) sum += row.bytes;
  CHECK(sum == all_bytes + mm_bytes);
}

GPU_TEST_CASE("[step3] GPU: kernels appear, each linked to its op, and the table ranks by device time") {
  const auto a = at::ones({512, 512}, at::TensorOptions().device(c10::Device(c10::kCUDA, 0)));
  const auto profile = prof::profile_steps(2, [&] {
    prof::ScopedRange range(prof::Phase::kForward);
    at::mm(a, a);
  });
  MESSAGE("profiler backend on the GPU: " << prof::profiler_backend() << ", " << profile.kernels().size()
                                          << " device activities");
  REQUIRE(profile.has_device_time());
  CHECK(profile.row("aten::mm").device_us > 0);
  CHECK(profile.row("phase:forward").device_us >= profile.row("aten::mm").device_us);
  if (prof::profiler_backend() == "kineto") {
    REQUIRE(!profile.kernels().empty());
    int linked_to_mm = 0;
    for (const auto& k : profile.kernels()) {
      if (k.op < 0) continue;
      int64_t op = k.op;
      while (op >= 0 && profile.events()[op].name != "aten::mm") op = profile.events()[op].parent;
      linked_to_mm += op >= 0;
    }
    CHECK(linked_to_mm >= 2);  // one gemm per step at least
  }
}
