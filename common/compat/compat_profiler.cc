#include "common/compat/compat_profiler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#if WORKSHOP_HAS_CUDA
#if __has_include(<torch/csrc/profiler/stubs/base.h>)
#include <torch/csrc/profiler/stubs/base.h>  // LibTorch 2.x
#else
#include <torch/csrc/profiler/api.h>  // LibTorch 1.13
#endif
#endif

namespace workshop {
namespace compat {

namespace legacy = torch::autograd::profiler;

bool profiler_active() { return torch::profiler::impl::profilerEnabled(); }

void start_profiler() {
  TORCH_CHECK(!profiler_active(), "start_profiler: a LibTorch profiler is already active on this thread");
  legacy::enableProfilerLegacy(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU));
}

std::vector<ProfiledRange> stop_profiler() {
  TORCH_CHECK(profiler_active(), "stop_profiler: no LibTorch profiler is active on this thread");
  const legacy::thread_event_lists lists = legacy::disableProfilerLegacy();

  // The legacy profiler records a push and a pop event per range, both carrying the range's handle. A range
  // may close on another thread than it opened on, so pushes are matched across all threads.
  struct Open {
    const legacy::LegacyEvent* push;
  };
  std::unordered_map<uint64_t, Open> open;
  std::vector<ProfiledRange> ranges;
  // Times are taken relative to the first recorded event: differences of the profiler's integer nanoseconds
  // are exact, absolute values in double microseconds are not.
  const legacy::LegacyEvent* origin = nullptr;
  for (const auto& list : lists) {
    for (const auto& event : list) {
      if (origin == nullptr || origin->cpuElapsedUs(event) < 0) origin = &event;
    }
  }
  for (const auto& list : lists) {
    for (const auto& event : list) {
      if (event.kind() == legacy::EventKind::PushRange) open[event.handle()] = Open{&event};
    }
  }
  for (const auto& list : lists) {
    for (const auto& event : list) {
      if (event.kind() != legacy::EventKind::PopRange) continue;
      const auto it = open.find(event.handle());
      if (it == open.end()) continue;
      const legacy::LegacyEvent& push = *it->second.push;
      ProfiledRange range;
      range.name = push.name();
      range.thread = push.threadId();
      range.start_ns = std::llround(origin->cpuElapsedUs(push) * 1000.0);
      range.end_ns = std::llround(origin->cpuElapsedUs(event) * 1000.0);
      ranges.push_back(std::move(range));
      open.erase(it);
    }
  }
  std::stable_sort(ranges.begin(), ranges.end(), [](const ProfiledRange& a, const ProfiledRange& b) {
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    return a.end_ns > b.end_ns;
  });
  return ranges;
}

const char* profiler_backend() { return "legacy"; }

bool nvtx_available() {
#if WORKSHOP_HAS_CUDA
  return torch::profiler::impl::cudaStubs()->enabled();
#else
  return false;
#endif
}

void nvtx_range_push(const char* name) {
#if WORKSHOP_HAS_CUDA
  if (nvtx_available()) torch::profiler::impl::cudaStubs()->rangePush(name);
#else
  (void)name;
#endif
}

void nvtx_range_pop() {
#if WORKSHOP_HAS_CUDA
  if (nvtx_available()) torch::profiler::impl::cudaStubs()->rangePop();
#endif
}

}  // namespace compat
}  // namespace workshop
