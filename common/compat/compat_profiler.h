// The profiler part of the compatibility layer: which LibTorch profiler records the events, and how its raw
// events become plain ranges (name, thread, start, end). Lesson code sees only ProfiledRange and never a
// LibTorch profiler type, so the lessons compile against LibTorch 1.13 (Debian, no Kineto) and 2.x.
//
// Backend: the legacy profiler (torch::autograd::profiler::enableProfilerLegacy / disableProfilerLegacy). It is
// present in every LibTorch from 1.8 to 2.x, with or without Kineto, and records every at::RecordFunction
// (every dispatched ATen op, every autograd node, every user range) as a push/pop pair on the host clock.
// Kineto (the backend of Python's torch.profiler) would add GPU kernel timelines; Debian's build has none and
// LibTorch's C++ API gives no way to ask whether it is there, so it is not used here (see the lesson README).
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
  int64_t start_ns = 0;  ///< host clock, nanoseconds
  int64_t end_ns = 0;
};

/// True while a LibTorch profiler (of any kind) is enabled on this thread.
bool profiler_active();

/// Starts recording host-side ranges on this thread (and threads it launches work on).
/// An error if a profiler is already active.
void start_profiler();

/// Stops the profiler started by start_profiler() and returns every closed range, sorted by start time
/// (ties: the longer range first, so a parent precedes its children). An error if none is active.
std::vector<ProfiledRange> stop_profiler();

/// "legacy" (see above).
const char* profiler_backend();

/// Opens/closes an NVTX range (shown by Nsight Systems) through LibTorch's own CUDA profiler hooks, so no
/// NVTX library is linked here. No-ops without CUDA or where LibTorch's CUDA hooks are not loaded.
void nvtx_range_push(const char* name);
void nvtx_range_pop();

/// True where nvtx_range_push() reaches NVTX (a CUDA LibTorch with its CUDA library loaded).
bool nvtx_available();

}  // namespace compat
}  // namespace workshop
