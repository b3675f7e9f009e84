// Checks for lesson 3, part 3: nesting, the table, the trace and the profiler object (step 3).
// Run: bazel test //lesson3_profiling:all --test_arg=--test-case='*step3*'
#include "tests/torch_doctest.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <ATen/ATen.h>

#include "lesson3_profiling/phases.h"
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
      while (true) {
        skip();
        std::string key;
        if (!string(&key)) return false;
        skip();
        if (i_ >= s_.size() || s_[i_++] != ':') return false;
        skip();
        if (key == "name" && i_ < s_.size() && s_[i_] == '"') {
          std::string name;
          if (!string(&name)) return false;
          names.push_back(name);
        } else if (!value()) {
          return false;
        }
        skip();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        return i_ < s_.size() && s_[i_++] == '}';
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

}  // namespace

TEST_CASE("[step3] call counts are exact for a known workload") {
  const auto a = at::ones({16, 16});
  const auto profile = prof::profile_steps(3, [&] { known_step(a); });
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
