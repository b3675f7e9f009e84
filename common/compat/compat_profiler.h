// The profiler part of the compatibility layer: which LibTorch profiler records the events, and how its raw
// events become plain ranges (name, thread, start, end, device time, bytes) and device activities (kernels,
// copies). Lesson code sees only these structs and never a LibTorch profiler type, so the lessons compile
// against LibTorch 1.13 (Debian 12) and 2.x, and the heavy profiler headers stay in compat_profiler.cc.
//
// Two backends, both present in every LibTorch from 1.13 to 2.x:
//  - Kineto (torch::autograd::profiler::enableProfiler with ProfilerState::KINETO, the recorder behind Python's
//    torch.profiler): op ranges, allocations, and on a GPU the kernels themselves (device start and end, each
//    linked to the op that launched it through Kineto's correlation ids), and a trace of its own
//    (ProfilerResult::save). The default on LibTorch 2.x, whose builds (Debian 13's, the pip wheels) link libkineto.
//  - legacy (enableProfilerLegacy): op ranges and allocations on the host clock; on a GPU
//    (ProfilerState::CUDA) a CUDA event at each range's start and end, so a range's device time is the span
//    between the two, not the kernels. The default on LibTorch 1.13: Debian's build has Kineto's C++ API but not
//    libkineto itself (USE_KINETO=0): its Kineto path records ops and allocations with whole-microsecond
//    times, cannot record CUDA activity and cannot save a trace ("requires ... USE_KINETO=1").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace workshop {
namespace compat {

/// One recorded range on the host clock: an ATen op, an autograd node or a user range.
struct ProfiledRange {
  std::string name;
  uint64_t thread = 0;   ///< the thread that opened the range
  int64_t start_ns = 0;  ///< host clock, nanoseconds since the first recorded range
  int64_t end_ns = 0;
  int64_t device_ns = 0;  ///< device time of this range itself, not of the ranges inside it (0 on a CPU)
  int64_t bytes = 0;      ///< bytes allocated by this range itself, not by the ranges inside it (frees ignored)
};

/// One activity on a device (a kernel, a copy, a memset), recorded by Kineto on a GPU.
struct DeviceActivity {
  std::string name;
  int device = 0;
  int64_t stream = 0;
  int64_t start_ns = 0;  ///< the host clock of the ranges, nanoseconds since the first recorded range
  int64_t end_ns = 0;
  int64_t range = -1;  ///< index in Recording::ranges of the op that launched it, -1 if none was recorded
};

/// What one recording holds. `ranges` are sorted by start (ties: the longer first, so a parent precedes its
/// children).
struct Recording {
  std::vector<ProfiledRange> ranges;
  std::vector<DeviceActivity> device;
};

enum class Backend { kLegacy, kKineto };

/// Kineto on LibTorch 2.x, legacy on 1.13 (see above).
Backend default_backend();

/// "kineto" or "legacy".
const char* backend_name(Backend backend);

/// True while a LibTorch profiler (of any kind) is enabled on this thread.
bool profiler_active();

/// Starts recording on this thread: host ranges and allocations, and on a machine with a GPU the device side
/// too (Kineto's CUDA activity; the legacy profiler's CUDA events). An error if a profiler is already active.
void start_profiler(Backend backend = default_backend());

/// Stops the profiler started by start_profiler() and returns what it recorded. An error if none is active.
Recording stop_profiler();

/// The backend of the running recording, else of the last one, else the default: "kineto" or "legacy".
const char* profiler_backend();

/// True where the last recording can be saved by its backend (Kineto with libkineto linked).
bool backend_can_save();

/// Writes the last recording's trace as its backend writes it (Kineto's ProfilerResult::save: a Chrome trace).
/// An error naming the reason where backend_can_save() is false, or naming the path if it cannot be written.
void save_backend_trace(const std::string& path);

/// Opens/closes an NVTX range (shown by Nsight Systems) through LibTorch's own CUDA profiler hooks, so no
/// NVTX library is linked here. No-ops without CUDA or where LibTorch's CUDA hooks are not loaded.
void nvtx_range_push(const char* name);
void nvtx_range_pop();

/// True where nvtx_range_push() reaches NVTX (a CUDA LibTorch with its CUDA library loaded).
bool nvtx_available();

}  // namespace compat
}  // namespace workshop
