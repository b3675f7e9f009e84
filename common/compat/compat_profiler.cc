#include "common/compat/compat_profiler.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <mutex>
#include <numeric>
#include <unordered_map>

#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/version.h>

#if WORKSHOP_HAS_CUDA
#if __has_include(<torch/csrc/profiler/stubs/base.h>)
#include <torch/csrc/profiler/stubs/base.h>  // LibTorch 2.x
#else
#include <torch/csrc/profiler/api.h>  // LibTorch 1.13
#endif
#endif

namespace workshop {
namespace compat {

namespace autograd_profiler = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

namespace {

// LibTorch 2.x (Debian 13's 2.6, the pip wheels) is built with libkineto; Debian 12's 1.13 is not (USE_KINETO=0:
// its ProfilerResult::save throws "Saving a trace requires using torch.profiler with Kineto support").
constexpr bool kLibkinetoLinked = TORCH_VERSION_MAJOR >= 2;

struct State {
  std::mutex mutex;
  bool started = false;  // a backend was chosen at least once
  Backend backend = Backend::kLegacy;
  std::unique_ptr<autograd_profiler::ProfilerResult> last_kineto;  // the last Kineto recording, for its trace
};

State& state() {
  static State s;
  return s;
}

bool gpu_present() { return at::hasCUDA(); }

struct RawMemory {
  uint64_t thread;
  int64_t time_ns;
  int64_t bytes;
};

struct RawDevice {
  DeviceActivity activity;
  uint64_t correlation;  // the correlation id of the op that launched it (0: none)
};

// Turns the backends' raw events into a Recording: times relative to the first range, ranges sorted, device
// activities linked to their op and their time charged to it, allocations charged to the innermost range open
// on their thread. `correlation[i]` is range i's correlation id (Kineto) or 0. With `inclusive_device` (legacy)
// a range's device_ns holds its whole span and becomes its own part here.
Recording finish(std::vector<ProfiledRange> raw, const std::vector<uint64_t>& correlation,
                 const std::vector<RawMemory>& memory, std::vector<RawDevice> device, bool inclusive_device) {
  Recording out;
  int64_t origin = 0;
  bool have_origin = false;
  for (const auto& r : raw) {
    if (!have_origin || r.start_ns < origin) origin = r.start_ns;
    have_origin = true;
  }
  for (const auto& d : device) {
    if (!have_origin || d.activity.start_ns < origin) origin = d.activity.start_ns;
    have_origin = true;
  }

  std::vector<size_t> order(raw.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (raw[a].start_ns != raw[b].start_ns) return raw[a].start_ns < raw[b].start_ns;
    return raw[a].end_ns > raw[b].end_ns;
  });
  std::unordered_map<uint64_t, int64_t> by_correlation;
  for (size_t i = 0; i < order.size(); ++i) {
    ProfiledRange r = raw[order[i]];
    r.start_ns -= origin;
    r.end_ns -= origin;
    if (!inclusive_device) r.device_ns = 0;  // filled from the device activities below
    if (correlation.size() == raw.size() && correlation[order[i]] != 0) {
      by_correlation[correlation[order[i]]] = static_cast<int64_t>(i);
    }
    out.ranges.push_back(std::move(r));
  }

  // Nesting by time on each thread, as the lesson nests events (a range that ends with its parent is inside it).
  std::vector<int64_t> parent(out.ranges.size(), -1);
  std::unordered_map<uint64_t, std::vector<int64_t>> stacks, per_thread;
  for (int64_t i = 0; i < static_cast<int64_t>(out.ranges.size()); ++i) {
    const ProfiledRange& r = out.ranges[i];
    auto& stack = stacks[r.thread];
    while (!stack.empty() && out.ranges[stack.back()].end_ns < r.end_ns) stack.pop_back();
    parent[i] = stack.empty() ? -1 : stack.back();
    stack.push_back(i);
    per_thread[r.thread].push_back(i);
  }
  if (inclusive_device) {  // legacy: a span from the range's first CUDA event to its last; keep its own part
    std::vector<int64_t> children(out.ranges.size(), 0);
    for (size_t i = 0; i < out.ranges.size(); ++i) {
      if (parent[i] >= 0) children[parent[i]] += out.ranges[i].device_ns;
    }
    for (size_t i = 0; i < out.ranges.size(); ++i) {
      out.ranges[i].device_ns = std::max<int64_t>(0, out.ranges[i].device_ns - children[i]);
    }
  }

  // An allocation belongs to the innermost range open on its thread at that time.
  for (const auto& m : memory) {
    if (m.bytes <= 0) continue;
    const auto it = per_thread.find(m.thread);
    if (it == per_thread.end()) continue;
    const auto& list = it->second;
    const int64_t t = m.time_ns - origin;
    auto pos = std::upper_bound(list.begin(), list.end(), t,
                                [&](int64_t time, int64_t index) { return time < out.ranges[index].start_ns; });
    if (pos == list.begin()) continue;
    int64_t index = *(pos - 1);
    while (index >= 0 && out.ranges[index].end_ns < t) index = parent[index];
    if (index >= 0) out.ranges[index].bytes += m.bytes;
  }

  for (auto& d : device) {
    DeviceActivity a = std::move(d.activity);
    a.start_ns -= origin;
    a.end_ns -= origin;
    const auto it = by_correlation.find(d.correlation);
    if (d.correlation != 0 && it != by_correlation.end()) {
      a.range = it->second;
      out.ranges[a.range].device_ns += a.end_ns - a.start_ns;
    }
    out.device.push_back(std::move(a));
  }
  std::stable_sort(out.device.begin(), out.device.end(),
                   [](const DeviceActivity& a, const DeviceActivity& b) { return a.start_ns < b.start_ns; });
  return out;
}

// ---- Kineto ------------------------------------------------------------------------------------------------

// Event times: nanoseconds in 2.x (startNs/endNs); whole microseconds in 1.13 (startUs/durationUs).
int64_t kineto_start_ns(const autograd_profiler::KinetoEvent& e) {
#if TORCH_VERSION_MAJOR >= 2
  return static_cast<int64_t>(e.startNs());
#else
  return static_cast<int64_t>(e.startUs()) * 1000;
#endif
}

int64_t kineto_end_ns(const autograd_profiler::KinetoEvent& e) {
#if TORCH_VERSION_MAJOR >= 2
  return static_cast<int64_t>(e.endNs());
#else
  return static_cast<int64_t>(e.startUs() + e.durationUs()) * 1000;
#endif
}

std::set<impl::ActivityType> kineto_activities() {
  std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
  if (gpu_present()) activities.insert(impl::ActivityType::CUDA);  // the kernels, with device start and end
  return activities;
}

void start_kineto() {
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/false,
                                    /*profile_memory=*/true);
  const auto activities = kineto_activities();
  autograd_profiler::prepareProfiler(config, activities);
  autograd_profiler::enableProfiler(config, activities);
}

Recording stop_kineto() {
  std::unique_ptr<autograd_profiler::ProfilerResult> result = autograd_profiler::disableProfiler();
  TORCH_CHECK(result != nullptr, "stop_profiler: Kineto returned no result");
  std::vector<ProfiledRange> ranges;
  std::vector<uint64_t> correlation;
  std::vector<RawMemory> memory;
  std::vector<RawDevice> device;
  for (const auto& e : result->events()) {
    const std::string name = e.name();
    if (name == "[memory]") {  // an allocation (bytes > 0) or a free (bytes < 0), on the host or a device
      memory.push_back({e.startThreadId(), kineto_start_ns(e), e.nBytes()});
      continue;
    }
    if (!name.empty() && name[0] == '[') continue;  // other instant events ([OutOfMemory], ...)
    if (e.deviceType() == c10::DeviceType::CPU) {
      // CUDA runtime calls (cudaLaunchKernel, ...) are linked to the op that made them: not ops themselves.
      if (e.isAsync() || e.linkedCorrelationId() != 0) continue;
      ProfiledRange r;
      r.name = name;
      r.thread = e.startThreadId();
      r.start_ns = kineto_start_ns(e);
      r.end_ns = std::max(r.start_ns, kineto_end_ns(e));
      ranges.push_back(std::move(r));
      correlation.push_back(e.correlationId());
    } else {  // a kernel, copy or memset on a device, linked to its op by the op's correlation id
      RawDevice d;
      d.activity.name = name;
      d.activity.device = static_cast<int>(e.deviceIndex());
      d.activity.stream = e.deviceResourceId();
      d.activity.start_ns = kineto_start_ns(e);
      d.activity.end_ns = std::max(d.activity.start_ns, kineto_end_ns(e));
      d.correlation = e.linkedCorrelationId();
      device.push_back(std::move(d));
    }
  }
  state().last_kineto = std::move(result);
  return finish(std::move(ranges), correlation, memory, std::move(device), /*inclusive_device=*/false);
}

// ---- legacy ------------------------------------------------------------------------------------------------

void start_legacy() {
  // ProfilerState::CUDA records a CUDA event at each range's start and end (needs a GPU); CPU the host clock.
  const auto mode = gpu_present() ? impl::ProfilerState::CUDA : impl::ProfilerState::CPU;
  autograd_profiler::enableProfilerLegacy(
      impl::ProfilerConfig(mode, /*report_input_shapes=*/false, /*profile_memory=*/true));
}

Recording stop_legacy() {
  const autograd_profiler::thread_event_lists lists = autograd_profiler::disableProfilerLegacy();
  using autograd_profiler::EventKind;
  using autograd_profiler::LegacyEvent;
  // The legacy profiler records a push and a pop event per range, both carrying the range's handle. A range
  // may close on another thread than it opened on, so pushes are matched across all threads. Times are taken
  // relative to the first recorded event: differences of the profiler's integer nanoseconds are exact,
  // absolute values in double microseconds are not.
  const LegacyEvent* origin = nullptr;
  for (const auto& list : lists) {
    for (const auto& event : list) {
      if (origin == nullptr || origin->cpuElapsedUs(event) < 0) origin = &event;
    }
  }
  std::unordered_map<uint64_t, const LegacyEvent*> open;
  std::vector<ProfiledRange> ranges;
  std::vector<RawMemory> memory;
  for (const auto& list : lists) {
    for (const auto& event : list) {
      if (event.kind() == EventKind::PushRange) open[event.handle()] = &event;
      if (event.kind() == EventKind::MemoryAlloc) {
        memory.push_back({event.threadId(), std::llround(origin->cpuElapsedUs(event) * 1000.0),
                          event.cpuMemoryUsage() + event.cudaMemoryUsage()});
      }
    }
  }
  for (const auto& list : lists) {
    for (const auto& event : list) {
      if (event.kind() != EventKind::PopRange) continue;
      const auto it = open.find(event.handle());
      if (it == open.end()) continue;
      const LegacyEvent& push = *it->second;
      ProfiledRange range;
      range.name = push.name();
      range.thread = push.threadId();
      range.start_ns = std::llround(origin->cpuElapsedUs(push) * 1000.0);
      range.end_ns = std::llround(origin->cpuElapsedUs(event) * 1000.0);
      if (push.hasCuda() && event.hasCuda()) range.device_ns = std::llround(push.cudaElapsedUs(event) * 1000.0);
      ranges.push_back(std::move(range));
      open.erase(it);
    }
  }
  state().last_kineto.reset();
  return finish(std::move(ranges), {}, memory, {}, /*inclusive_device=*/true);
}

}  // namespace

Backend default_backend() { return kLibkinetoLinked ? Backend::kKineto : Backend::kLegacy; }

const char* backend_name(Backend backend) { return backend == Backend::kKineto ? "kineto" : "legacy"; }

bool profiler_active() { return impl::profilerEnabled(); }

void start_profiler(Backend backend) {
  TORCH_CHECK(!profiler_active(), "start_profiler: a LibTorch profiler is already active on this thread");
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    state().started = true;
    state().backend = backend;
  }
  if (backend == Backend::kKineto) {
    start_kineto();
  } else {
    start_legacy();
  }
}

Recording stop_profiler() {
  TORCH_CHECK(profiler_active(), "stop_profiler: no LibTorch profiler is active on this thread");
  std::lock_guard<std::mutex> lock(state().mutex);
  // Stop whichever kind is running (one started by someone else included): the type says which.
  if (impl::profilerType() == impl::ActiveProfilerType::KINETO) return stop_kineto();
  return stop_legacy();
}

const char* profiler_backend() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return backend_name(state().started ? state().backend : default_backend());
}

bool backend_can_save() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return kLibkinetoLinked && state().last_kineto != nullptr;
}

void save_backend_trace(const std::string& path) {
  std::lock_guard<std::mutex> lock(state().mutex);
  TORCH_CHECK(state().last_kineto != nullptr, "save_backend_trace: the last recording was not made by Kineto (",
              backend_name(state().backend), " backend), so there is no backend trace to save");
  TORCH_CHECK(kLibkinetoLinked, "save_backend_trace: this LibTorch ", TORCH_VERSION,
              " has Kineto's C++ API but not libkineto (built with USE_KINETO=0): it cannot save a trace");
  {
    std::ofstream probe(path);
    TORCH_CHECK(probe.good(), "save_backend_trace: cannot open '", path, "' for writing");
  }
  state().last_kineto->save(path);
}

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
