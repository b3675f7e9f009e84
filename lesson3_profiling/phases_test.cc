// Checks for lesson 3, part 2: named ranges in the profile (step 2).
// Run: bazel test //lesson3_profiling:all --test_arg=--test-case='*step2*'
#include "tests/torch_doctest.h"

#include <stdexcept>

#include <ATen/ATen.h>

#include "lesson3_profiling/phases.h"
#include "lesson3_profiling/profiler.h"

using doctest::Contains;

namespace {

std::vector<prof::Event> named(const std::vector<prof::Event>& events, const std::string& name) {
  std::vector<prof::Event> out;
  for (const auto& e : events) {
    if (e.name == name) out.push_back(e);
  }
  return out;
}

bool inside(const prof::Event& inner, const prof::Event& outer) {
  return inner.thread == outer.thread && inner.start_us >= outer.start_us && inner.end_us <= outer.end_us;
}

}  // namespace

TEST_CASE("[step2] a ScopedRange shows up once in the profile, around the ops run inside it") {
  const auto a = at::ones({8, 8});
  const auto events = prof::record_events([&] {
    prof::ScopedRange range(prof::Phase::kForward);
    at::mm(a, a);
    at::mm(a, a);
  });
  const auto ranges = named(events, "phase:forward");
  REQUIRE(ranges.size() == 1);
  const auto mms = named(events, "aten::mm");
  REQUIRE(mms.size() == 2);
  CHECK(inside(mms[0], ranges[0]));
  CHECK(inside(mms[1], ranges[0]));
}

TEST_CASE("[step2] nested ranges nest in the profile; sibling ranges do not overlap") {
  const auto events = prof::record_events([] {
    prof::ScopedRange outer("outer");
    {
      prof::ScopedRange first("first");
      at::ones({4}).sum();
    }
    {
      prof::ScopedRange second("second");
      at::ones({4}).sum();
    }
  });
  const auto outer = named(events, "outer");
  const auto first = named(events, "first");
  const auto second = named(events, "second");
  REQUIRE(outer.size() == 1);
  REQUIRE(first.size() == 1);
  REQUIRE(second.size() == 1);
  CHECK(inside(first[0], outer[0]));
  CHECK(inside(second[0], outer[0]));
  CHECK(first[0].end_us <= second[0].start_us);
}

TEST_CASE("[step2] a range closes when an exception leaves its scope") {
  const auto events = prof::record_events([] {
    try {
      prof::ScopedRange range("failing");
      throw std::runtime_error("boom");
    } catch (const std::runtime_error&) {
    }
    prof::ScopedRange after("after");
  });
  const auto failing = named(events, "failing");
  const auto after = named(events, "after");
  REQUIRE(failing.size() == 1);
  REQUIRE(after.size() == 1);
  CHECK(failing[0].end_us <= after[0].start_us);  // closed before "after" opened, not at the end of the profile
}

TEST_CASE("[step2] a ScopedRange opened while no profiler records leaves nothing in a later profile") {
  { prof::ScopedRange quiet("quiet"); }
  const auto events = prof::record_events([] { prof::ScopedRange seen("seen"); });
  CHECK(named(events, "quiet").empty());
  CHECK(named(events, "seen").size() == 1);
}

TEST_CASE("[step2] a ScopedRange needs a name") {
  CHECK_THROWS_WITH_AS(prof::ScopedRange(""), Contains("empty"), c10::Error);
}
