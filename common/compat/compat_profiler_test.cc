// Checks of the profiler part of the compatibility layer: both backends on this LibTorch, side by side, on a
// known workload. Its log says which backend is the default here and what the other one can do (on Debian 12's
// LibTorch 1.13: Kineto's API without libkineto; on 2.x: both). Run: bazel test //common/compat:all
#include "tests/torch_doctest.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/version.h>

#include "common/compat/compat_profiler.h"

using doctest::Contains;
using workshop::compat::Backend;

namespace {

// Two 64x64 matmuls inside a user range, and an add: 3 allocations of 16 KiB.
void workload(const at::Tensor& a, std::vector<at::Tensor>& keep) {
  RECORD_USER_SCOPE("workload");
  keep.push_back(at::mm(a, a));
  keep.push_back(at::mm(a, a));
  keep.push_back(at::add(keep[0], a));
}

std::map<std::string, std::vector<const workshop::compat::ProfiledRange*>> by_name(
    const workshop::compat::Recording& recording) {
  std::map<std::string, std::vector<const workshop::compat::ProfiledRange*>> out;
  for (const auto& r : recording.ranges) out[r.name].push_back(&r);
  return out;
}

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

}  // namespace

TEST_CASE("both backends record the same ops, ranges and bytes; only Kineto with libkineto saves a trace") {
  const auto a = at::ones({64, 64});
  MESSAGE("LibTorch " << TORCH_VERSION << ": default profiler backend "
                      << std::string(workshop::compat::backend_name(workshop::compat::default_backend())));
  for (const Backend backend : {Backend::kKineto, Backend::kLegacy}) {
    const std::string name = workshop::compat::backend_name(backend);
    CAPTURE(name);
    std::vector<at::Tensor> keep;
    workshop::compat::start_profiler(backend);
    CHECK(workshop::compat::profiler_active());
    CHECK(std::string(workshop::compat::profiler_backend()) == name);
    workload(a, keep);
    const auto recording = workshop::compat::stop_profiler();
    CHECK_FALSE(workshop::compat::profiler_active());
    auto ranges = by_name(recording);
    REQUIRE(ranges["workload"].size() == 1);
    REQUIRE(ranges["aten::mm"].size() == 2);
    REQUIRE(ranges["aten::add"].size() == 1);
    const auto& outer = *ranges["workload"][0];
    int64_t bytes = 0;
    for (const auto& r : recording.ranges) {
      CAPTURE(r.name);
      CHECK(r.end_ns >= r.start_ns);
      CHECK(r.start_ns >= 0);
      bytes += r.bytes;
    }
    for (const auto* mm : ranges["aten::mm"]) {
      CHECK(mm->start_ns >= outer.start_ns);
      CHECK(mm->end_ns <= outer.end_ns);
      CHECK(mm->bytes == 64 * 64 * 4);  // its output, charged to the op itself
    }
    CHECK(bytes == 3 * 64 * 64 * 4);
    CHECK(recording.device.empty());  // no GPU here, or nothing ran on it
    const std::string trace = temp_path("compat_" + name + ".json");
    if (workshop::compat::backend_can_save()) {
      workshop::compat::save_backend_trace(trace);
      std::ifstream in(trace);
      std::stringstream text;
      text << in.rdbuf();
      CHECK(text.str().find("\"aten::mm\"") != std::string::npos);
      MESSAGE(name << ": " << recording.ranges.size() << " ranges, " << bytes << " bytes, saved its own trace ("
                   << text.str().size() << " bytes)");
    } else {
      CHECK_THROWS_AS(workshop::compat::save_backend_trace(trace), c10::Error);
      MESSAGE(name << ": " << recording.ranges.size() << " ranges, " << bytes
                   << " bytes, no trace of its own on this LibTorch");
    }
  }
  CHECK(workshop::compat::backend_can_save() == false);  // the last recording was the legacy one
  CHECK_THROWS_WITH_AS(workshop::compat::save_backend_trace(temp_path("none.json")), Contains("not made by Kineto"),
                       c10::Error);
}

TEST_CASE("Kineto's trace of a recording goes only where it can be written, and stopping twice is an error") {
  const auto a = at::ones({8, 8});
  workshop::compat::start_profiler(Backend::kKineto);
  CHECK_THROWS_WITH_AS(workshop::compat::start_profiler(Backend::kLegacy), Contains("already active"), c10::Error);
  at::mm(a, a);
  workshop::compat::stop_profiler();
  CHECK_THROWS_WITH_AS(workshop::compat::stop_profiler(), Contains("no LibTorch profiler is active"), c10::Error);
  if (workshop::compat::backend_can_save()) {
    CHECK_THROWS_WITH_AS(workshop::compat::save_backend_trace("/nonexistent-dir/kineto.json"),
                         Contains("/nonexistent-dir"), c10::Error);
  } else {
    CHECK_THROWS_WITH_AS(workshop::compat::save_backend_trace("/nonexistent-dir/kineto.json"), Contains("USE_KINETO"),
                         c10::Error);
  }
}
