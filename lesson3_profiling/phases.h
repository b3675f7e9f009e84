// Lesson 3 — profile the bottleneck. Part 2: named ranges that make a profile read like the code.
//
// A ScopedRange opens an at::RecordFunction (the mechanism behind RECORD_FUNCTION and every ATen op's entry in
// a profile) when it is constructed and closes it when it is destroyed. Every op run in between is nested
// inside it in the profile. On a CUDA LibTorch it also opens an NVTX range, which Nsight Systems shows on its
// timeline. See lesson3_profiling/README.md, step 2.
#pragma once

#include <memory>
#include <string>

namespace at {
struct RecordFunction;
}  // namespace at

namespace prof {

/// The phases of a training step.
enum class Phase { kData, kForward, kBackward, kOptimizer };

/// The profile name of a phase: "phase:data", "phase:forward", "phase:backward", "phase:optimizer".
std::string phase_label(Phase phase);

/// True for the four phase labels above.
bool is_phase_label(const std::string& name);

/// An RAII profiler range. Cheap when no profiler is recording (nothing is stored then).
/// Not copyable or movable: a range closes where its scope ends.
class ScopedRange {
 public:
  /// Step 2. Opens a range called `name` (non-empty: an error otherwise) if a profiler is recording, and an
  /// NVTX range where workshop::compat::nvtx_available().
  explicit ScopedRange(std::string name);

  /// Opens the range of a training-step phase: ScopedRange(phase_label(phase)).
  explicit ScopedRange(Phase phase);

  /// Step 2. Closes what the constructor opened, in reverse order. Never throws.
  ~ScopedRange();

  ScopedRange(const ScopedRange&) = delete;
  ScopedRange& operator=(const ScopedRange&) = delete;

  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::unique_ptr<at::RecordFunction> record_;  // null when no profiler was recording at construction
  bool nvtx_open_ = false;
};

}  // namespace prof
