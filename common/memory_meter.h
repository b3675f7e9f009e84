// Peak-bytes meter shared by the lessons, their checks and the demos.
//
// On CPU it counts every byte LibTorch's CPU allocator hands out (a counting allocator wraps the default one
// the first time a meter is made); on CUDA it reads the caching allocator's statistics. Both count tensor
// storage only (parameters, gradients, optimizer state, activations), not the allocator's cache or BLAS
// scratch space, which is what the lessons reason about.
#pragma once

#include <cstdint>
#include <functional>

#include <c10/core/Device.h>

namespace workshop {

/// What a CPU meter counts: every thread's tensors, or only those allocated by the thread that made the meter
/// (still counted when another thread frees them). kThisThread is for measuring one rank of several that run as
/// threads of one process: another rank's frees then cannot land in this rank's figure.
enum class MeterScope { kProcess, kThisThread };

class MemoryMeter {
 public:
  /// Starts measuring on `device` (CPU or CUDA) from now: current and peak are counted relative to the bytes
  /// already allocated on that device (by this thread only, with MeterScope::kThisThread; CPU only).
  explicit MemoryMeter(c10::Device device = c10::Device(c10::kCPU), MeterScope scope = MeterScope::kProcess);

  /// Restarts: the baseline becomes what is allocated now and the peak is forgotten.
  void reset();

  /// Bytes allocated now, minus the baseline (negative when less is held than at the baseline).
  int64_t current_bytes() const;

  /// Highest bytes allocated since the last reset, minus the baseline.
  int64_t peak_bytes() const;

  c10::Device device() const { return device_; }
  MeterScope scope() const { return scope_; }

 private:
  c10::Device device_;
  MeterScope scope_;
  int64_t baseline_ = 0;
};

/// Bytes of tensor storage the CPU allocator holds right now (counting allocator; installs it if needed).
int64_t cpu_allocated_bytes();

/// Runs `fn` on a new thread and returns the bytes of CPU tensor storage that this thread allocated and still
/// holds when `fn` returns (a MeterScope::kThisThread meter on a thread that owns nothing older than the meter).
/// For "what does this step keep?" where other threads free tensors at times of their own: a per-thread meter
/// charges a free to the thread that ALLOCATED the tensor, so on a thread that ran earlier work (a rank that
/// handed buffers to Gloo, whose worker threads drop them after wait() has returned) such a free can land in the
/// window; on a fresh thread it cannot. An exception from `fn` is rethrown here.
int64_t cpu_bytes_kept_by(const std::function<void()>& fn);

}  // namespace workshop
