// Lesson 1 — mixed precision. Part B: a gradient scaler and the full AMP training step.
//
// LibTorch's C++ API has no GradScaler. This one follows the behaviour of PyTorch's torch.amp.GradScaler:
// multiply the loss by a large scale so that small gradients survive a 16-bit backward pass, divide the
// gradients by it before the optimizer uses them, skip the step when any gradient is inf/NaN, and adapt
// the scale. See lesson1_amp/README.md for the steps.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace torch {
namespace optim {
class Optimizer;
}  // namespace optim
namespace serialize {
class InputArchive;
class OutputArchive;
}  // namespace serialize
}  // namespace torch

namespace amp {

/// Which implementation unscales gradients and updates the scale.
enum class KernelPath {
  kAuto,   ///< the fused kernels where the device has them (fused_unscale_kernel() is not empty), else plain ops
  kFused,  ///< always the fused kernels (an error where the device has none)
  kPlain,  ///< always the plain tensor-op versions you write in steps 4 and 6
};

/// Options of a GradScaler; the defaults are PyTorch's.
struct GradScalerOptions {
  double init_scale = 65536.0;     ///< first scale (2^16)
  double growth_factor = 2.0;      ///< scale *= growth_factor after growth_interval clean steps; must be > 1
  double backoff_factor = 0.5;     ///< scale *= backoff_factor after a step with inf/NaN; must be in (0, 1)
  int64_t growth_interval = 2000;  ///< clean steps in a row before the scale grows; must be > 0
  bool enabled = true;             ///< false: every method is a pass-through and the scale is 1
  KernelPath kernels = KernelPath::kAuto;
};

/// What a GradScaler must remember across a checkpoint.
struct GradScalerState {
  /// false: saved from a disabled scaler, which has no state (as PyTorch's empty state dict); every other field
  /// is then meaningless, and an enabled scaler refuses to load it.
  bool enabled = true;
  double scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t growth_tracker = 0;  ///< clean steps since the scale last changed
};

/// Step 4. Multiplies every gradient in `grads` in place by `inv_scale` (a one-element float32 tensor) and
/// sets `found_inf` (a one-element float32 tensor) to 1 if any gradient holds an inf or NaN; leaves it
/// unchanged otherwise. Works for non-contiguous gradients. All tensors on one device. Plain tensor ops only
/// (no ATen AMP kernel), so it runs on every device and LibTorch version. Runs without recording autograd
/// history (as under torch::NoGradGuard), so gradients that require grad (a leaf, or after a backward with
/// create_graph) are unscaled in place like any other.
void unscale_grads_plain(const std::vector<at::Tensor>& grads, at::Tensor& found_inf, const at::Tensor& inv_scale);

/// The same as unscale_grads_plain in one fused kernel. Given (not an exercise). The kernel, in this order:
/// lesson 6's operator `workshop::fused_unscale_` where a kernel of it is registered for the device (in any
/// binary that links lesson 6, step 5; it takes contiguous float32, bfloat16 and float16 gradients, so with a
/// non-contiguous or a float64 one this falls through), else ATen's `_amp_foreach_non_finite_check_and_unscale_` where the device has it (CUDA; CPU from
/// LibTorch 2.3), else unscale_grads_plain when lesson 6's operator was chosen but cannot take these
/// gradients; throws c10::Error where the device has neither kernel.
void unscale_grads_fused(const std::vector<at::Tensor>& grads, at::Tensor& found_inf, const at::Tensor& inv_scale);

/// Which fused unscale kernel unscale_grads_fused uses on `device`: "workshop::fused_unscale_" (lesson 6),
/// "aten::_amp_foreach_non_finite_check_and_unscale_", or "" where there is none. Given.
std::string fused_unscale_kernel(c10::DeviceType device);

/// Step 6. Updates `scale` (one-element float32) and `growth_tracker` (one-element int32) in place, exactly as
/// ATen's `_amp_update_scale_`: if found_inf is non-zero (NaN included: the kernel tests `if (found_inf)`),
/// scale *= backoff_factor and the tracker resets to 0; otherwise the tracker counts one more clean step, and
/// when the count equals growth_interval the scale is multiplied by growth_factor (only if the result is
/// finite) and the tracker resets to 0. (A tracker already past growth_interval, which a GradScaler never
/// produces, keeps counting without growth, as in the kernel.)
void update_scale_plain(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                        double growth_factor, double backoff_factor, int64_t growth_interval);

/// The same as update_scale_plain through ATen's fused `_amp_update_scale_` where the device has it; else (a
/// fused unscale from lesson 6 on a LibTorch without ATen's kernels) update_scale_plain itself: the scale is one
/// number, there is no pass over memory to fuse. Given (not an exercise).
void update_scale_fused(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                        double growth_factor, double backoff_factor, int64_t growth_interval);

/// A gradient scaler for one or more optimizers. Per iteration: scale(loss).backward(), optionally
/// unscale_(optimizer) (to clip or inspect gradients), step(optimizer), then update() once.
/// Misuse (calling out of order, float16 master weights, bad options) throws c10::Error with a message
/// saying what was wrong.
class GradScaler {
 public:
  /// Step 3. Validates the options (init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1,
  /// growth_interval > 0).
  explicit GradScaler(GradScalerOptions options = {});
  virtual ~GradScaler() = default;
  GradScaler(const GradScaler&) = default;
  GradScaler(GradScaler&&) = default;
  GradScaler& operator=(const GradScaler&) = default;
  GradScaler& operator=(GradScaler&&) = default;

  /// Step 3. Returns `loss * scale` (the same tensor when disabled). The scale tensor is created on the
  /// loss's device at the first call. `loss` must be a floating-point tensor.
  at::Tensor scale(const at::Tensor& loss);

  /// Step 4. Divides the optimizer's gradients by the scale in place and records whether any is inf/NaN.
  /// At most once per optimizer between update()s, and never after step(). Errors, each message saying
  /// what happened: called before scale() ("before scale"); called again for this optimizer since the last
  /// update() ("already been called"); called after step() ("after step"); float16 gradients ("float16":
  /// the master weights must stay float32); no parameter of the optimizer has a gradient ("no parameter").
  /// A disabled scaler does nothing. Virtual, as in PyTorch, where ShardedGradScaler overrides it to agree on
  /// found_inf across the ranks (lesson 5's ddp::ShardedGradScaler); step() unscales through it.
  virtual void unscale_(torch::optim::Optimizer& optimizer);

  /// Step 5. Unscales (by calling unscale_(), which a subclass may override) if unscale_() was not called, then runs optimizer.step() unless an inf/NaN was found.
  /// Returns true if the optimizer stepped. At most once per optimizer between update()s. Errors: called
  /// before scale() ("before scale"); called again for this optimizer since the last update() ("already
  /// been called"); and those of unscale_() when it unscales here (e.g. "no parameter" has a gradient).
  /// A disabled scaler just runs optimizer.step().
  bool step(torch::optim::Optimizer& optimizer);

  /// Step 6. Backs the scale off if any optimizer saw an inf/NaN since the last update, else counts a clean
  /// step towards growth. Call once per iteration, after step(). Errors: called before scale() ("before
  /// scale"); no optimizer was unscaled or stepped since the last update(), so there are "no inf checks" to
  /// combine. A disabled scaler does nothing.
  void update();

  /// Step 6. Sets the scale to `new_scale` (finite and > 0) instead of adapting it, as PyTorch's
  /// update(new_scale); the growth tracker is left as it is, and the per-optimizer states are reset like
  /// update(). Needs no inf check (no step() before it), but a scale (scale() was called). No-op when disabled.
  void update(double new_scale);

  /// The current scale (1.0 when disabled). Reads the device tensor: a host-device sync on CUDA.
  double get_scale() const;

  /// Clean steps counted towards the next growth (0 when disabled).
  int64_t get_growth_tracker() const;

  bool is_enabled() const { return options_.enabled; }

  /// Step 6. The state to checkpoint with the model and optimizer: the current scale (also after it changed),
  /// the three options and the tracker. A disabled scaler returns a state with enabled = false.
  GradScalerState state_dict() const;

  /// Step 6. Restores a state (validated like the options), also into a scaler that has already scaled: the
  /// next scale() uses the loaded scale. A disabled scaler ignores it (a pass-through, as in PyTorch). A
  /// state with enabled = false is an error ("saved from a disabled scaler"): loading it would silently reset
  /// the scale.
  void load_state_dict(const GradScalerState& state);

  /// Writes/reads state_dict() through a torch::serialize archive, so `torch::save(scaler, path)` and
  /// `torch::load(scaler, path)` work. Given (built on your state_dict/load_state_dict).
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 protected:
  /// The inf/NaN flag unscale_() recorded for `optimizer` ([1] float32, the tensor step() and update() read), or
  /// an undefined tensor when it has not been unscaled since the last update(). A subclass's unscale_ may change
  /// it in place (lesson 5 agrees on it across the ranks). Given (not an exercise).
  at::Tensor recorded_found_inf(const torch::optim::Optimizer& optimizer) const {
    const auto it = per_optimizer_.find(&optimizer);
    return it == per_optimizer_.end() ? at::Tensor() : it->second.found_inf;
  }

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct PerOptimizer {
    Stage stage = Stage::kReady;
    at::Tensor found_inf;  // [1] float32, on the scale's device; defined once unscaled
  };

  bool use_fused(c10::DeviceType device) const;

  GradScalerOptions options_;
  at::Tensor scale_;           // [1] float32 on the loss's device; undefined until the first scale()
  at::Tensor growth_tracker_;  // [1] int32 beside scale_
  int64_t init_growth_tracker_ = 0;
  std::unordered_map<const torch::optim::Optimizer*, PerOptimizer> per_optimizer_;
};

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive, const GradScaler& scaler);
torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive, GradScaler& scaler);

/// Clips the total L2 norm of the gradients of all the optimizer's parameters to `max_norm` (in place, as
/// torch::nn::utils::clip_grad_norm_) and returns the norm before clipping. Given (not an exercise).
double clip_grad_norm_(torch::optim::Optimizer& optimizer, double max_norm);

/// How train_step runs the forward pass.
struct StepOptions {
  c10::DeviceType device = c10::DeviceType::CPU;  ///< the device autocast applies to
  c10::ScalarType dtype = c10::ScalarType::BFloat16;
  bool autocast = true;        ///< false: the forward runs as written (float32, or your own casts)
  double max_grad_norm = 0.0;  ///< > 0: unscale, then clip the gradients' total norm to this before stepping
};

/// What one training step did.
struct StepResult {
  at::Tensor loss;  ///< the unscaled loss, detached (reading it with .item() syncs the device)
  bool stepped;     ///< false when the scaler skipped the step (inf/NaN gradients)
};

/// Step 7. One mixed-precision iteration in the order the lesson teaches: zero the gradients; run
/// `forward_and_loss` under autocast (forward and loss only); backward on the scaled loss outside autocast;
/// unscale and clip if asked; scaler step; scaler update. `forward_and_loss` must return a scalar loss.
StepResult train_step(torch::optim::Optimizer& optimizer, GradScaler& scaler,
                      const std::function<at::Tensor()>& forward_and_loss, const StepOptions& options = {});

}  // namespace amp
