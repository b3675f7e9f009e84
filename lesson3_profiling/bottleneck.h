// Lesson 3 — profile the bottleneck. Part 4: find what slows a training loop down, from one profile, and fix it.
//
// Trainer::slow_step() is a small classifier's training step with three classic problems planted in it: a
// host-device sync every step, data preparation inside the step, and many tiny ops. diagnose() names them
// from call counts and phase shares; prepare() and fast_step() are the fix. See lesson3_profiling/README.md,
// step 4.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "lesson3_profiling/profiler.h"

namespace prof {

/// The problems diagnose() recognises.
enum class Problem {
  kHostDeviceSync,  ///< the host reads a device value every step (.item(), printing a tensor)
  kDataInStep,      ///< the data phase takes a large share of the step
  kTinyOps,         ///< a phase launches many small ops per step
};

/// "host-device sync", "data preparation in the step", "many tiny ops".
std::string problem_name(Problem problem);

/// The op whose call count reveals a host-device sync: every .item() and every print of a tensor's values
/// reaches it (on CUDA it copies the value to the host and waits for the device).
constexpr const char* kSyncOp = "aten::_local_scalar_dense";

/// Bounds used by diagnose(); the defaults have wide margins for the lesson's loops.
struct DiagnoseOptions {
  double data_share = 0.3;        ///< a data phase above this step_share() is a problem
  double tiny_ops_per_step = 32;  ///< a phase with at least this many direct child ops per step is a problem
};

/// One problem found in a profile.
struct Finding {
  Problem problem;
  std::string phase;          ///< the phase label it was found in
  std::string op;             ///< the op that shows it: the sync op, or the phase's most-called direct child
  double calls_per_step = 0;  ///< how often `op` ran per step
  double phase_share = 0;     ///< Profile::step_share() of `phase`: on the device clock in a profile with
                              ///< device time (a GPU's), else on the host clock
};

/// Step 4. Names the problems in a profile of `steps` training steps:
///  - kHostDeviceSync when kSyncOp runs at least once per step (phase: where it ran);
///  - kDataInStep when the data phase's step_share() exceeds options.data_share (op: its most-called direct child);
///  - kTinyOps for each phase whose direct child ops number at least options.tiny_ops_per_step per step
///    (op: the most-called of them).
/// Sorted by phase_share, largest first; ties in the order of the Problem enum. The first finding is the
/// bottleneck to fix first. Errors: steps < 1, a profile with no phase ranges.
std::vector<Finding> diagnose(const Profile& profile, int64_t steps, const DiagnoseOptions& options = {});

/// Sizes of the training loop.
struct TrainerOptions {
  int64_t samples = 1024;  ///< dataset size; batches are taken in order and wrap around
  int64_t batch = 64;
  int64_t features = 32;
  int64_t hidden = 64;
  int64_t classes = 4;
  double learning_rate = 0.1;
  uint64_t seed = 0;
};

/// A two-layer classifier trained with plain SGD on a synthetic dataset of 8-bit "pixels" that must be
/// normalised (x / 255 - mean) / std with the dataset's per-feature mean and std before use.
class Trainer {
 public:
  /// Given. Builds the dataset (on the CPU, as a data loader would hold it) and the parameters on `device`.
  Trainer(TrainerOptions options, c10::Device device);

  /// Given: the planted loop. Runs one step with phases data, forward, backward, optimizer. In data it
  /// recomputes the dataset statistics and normalises the batch sample by sample; in forward it reads the
  /// loss on the host to check it is finite.
  void slow_step();

  /// Step 4. Does once what slow_step() does every step: normalises the whole dataset with the same
  /// statistics and puts it on the device. Afterwards fast_step() may run.
  void prepare();

  /// Step 4. The same training step as slow_step() — the same batches in the same order, the same
  /// parameters afterwards — without the three problems: the data phase only takes a slice of the prepared
  /// data, and the loss stays on the device (accumulated; read once with mean_loss()).
  /// An error if prepare() has not run.
  void fast_step();

  /// Given. All parameters flattened into one float32 CPU tensor (a sync; call it after the loop).
  at::Tensor parameters_flat() const;

  /// Given. The mean loss of the steps run so far (a sync; call it after the loop).
  double mean_loss() const;

  int64_t steps_done() const { return steps_; }
  const TrainerOptions& options() const { return options_; }
  c10::Device device() const { return device_; }

 private:
  // Given helpers shared by both steps.
  at::Tensor forward_loss(const at::Tensor& x, const at::Tensor& y);  // phase forward; returns the loss
  void backward(const at::Tensor& loss);                              // phase backward
  void sgd_update();                                                  // phase optimizer
  int64_t next_batch_start();                                         // first sample of this step's batch

  TrainerOptions options_;
  c10::Device device_;
  at::Tensor raw_;                // [samples, features] uint8, CPU
  at::Tensor labels_;             // [samples] int64, CPU
  at::Tensor w1_, b1_, w2_, b2_;  // parameters on device_, requires_grad
  at::Tensor prepared_;           // [samples, features] float32 on device_: filled by prepare()
  at::Tensor prepared_labels_;    // [samples] int64 on device_: filled by prepare()
  at::Tensor loss_sum_;           // [] float32 on device_
  int64_t steps_ = 0;
};

}  // namespace prof
