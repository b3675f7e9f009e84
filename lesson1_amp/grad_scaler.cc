// Lesson 1, part B — your code. Replace each TODO with an implementation; the checks in
// grad_scaler_step*_test.cc tell you when it is right:  bazel test //lesson1_amp:all
// Steps, hints and background: lesson1_amp/README.md. Already given (grad_scaler_given.cc):
// unscale_grads_fused, update_scale_fused, use_fused(), get_scale(), get_growth_tracker(), save(), load(),
// clip_grad_norm_().
#include "lesson1_amp/grad_scaler.h"

#include <cmath>
#include <string>

#include <ATen/core/grad_mode.h>   // at::NoGradGuard
#include <ATen/TensorOperators.h>  // Tensor with its methods and operators (+, *, &, ...)
#include <ATen/ops/full.h>         // at:: functions come one header each; add <ATen/ops/NAME.h> for others
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/optim/optimizer.h>

#include "lesson1_amp/autocast.h"

namespace amp {

// [constructor]
GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  // TODO(lesson1, step 3): Reject bad options with TORCH_CHECK and a message naming the option:
  // init_scale finite and > 0, growth_factor > 1, 0 < backoff_factor < 1, growth_interval > 0.
  TORCH_CHECK(false, "TODO(lesson1, step 3): GradScaler(options) is not implemented yet");
}
// [constructor]

// [scale]
at::Tensor GradScaler::scale(const at::Tensor& loss) {
  // TODO(lesson1, step 3): Check the loss (defined, floating point). Disabled: return it unchanged.
  // At the first call create scale_ ([1] float32, init_scale) and growth_tracker_ ([1] int32,
  // init_growth_tracker_) on the loss's device. Return loss * scale_.
  TORCH_CHECK(false, "TODO(lesson1, step 3): GradScaler::scale() is not implemented yet");
}
// [scale]

// [unscale_plain]
void unscale_grads_plain(const std::vector<at::Tensor>& grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  // TODO(lesson1, step 4): For every gradient: if it holds an inf or NaN, set found_inf to 1 (hint:
  // isfinite(), all(), masked_fill_ — no .item(), keep it on the device); multiply it in place by inv_scale.
  // Record no autograd history while doing so (at::NoGradGuard, <ATen/core/grad_mode.h>).
  TORCH_CHECK(false, "TODO(lesson1, step 4): unscale_grads_plain() is not implemented yet");
}
// [unscale_plain]

// [unscale]
void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  // TODO(lesson1, step 4): Disabled: do nothing. Errors: scale() never called; this optimizer already
  // unscaled or stepped since the last update() (per_optimizer_[&optimizer].stage); float16 gradients
  // (the master weights must stay float32); no gradient at all. Then found_inf = zeros({1}), inv_scale =
  // 1 / scale computed in float64 and rounded to float32, and unscale the gradients with the fused or the
  // plain function (use_fused()). Record found_inf and Stage::kUnscaled.
  TORCH_CHECK(false, "TODO(lesson1, step 4): GradScaler::unscale_() is not implemented yet");
}
// [unscale]

// [step]
bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  // TODO(lesson1, step 5): Disabled: optimizer.step() and return true. Errors: scale() never called, or
  // step() already called on this optimizer since the last update(). Unscale if not done yet by calling
  // unscale_(optimizer) (a subclass may override it, as lesson 5 does); step the optimizer only if the recorded
  // found_inf is 0; record Stage::kStepped; return whether it stepped.
  TORCH_CHECK(false, "TODO(lesson1, step 5): GradScaler::step() is not implemented yet");
}
// [step]

// [update_plain]
void update_scale_plain(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                        double growth_factor, double backoff_factor, int64_t growth_interval) {
  // TODO(lesson1, step 6): Overflow (found_inf != 0, NaN included): scale *= backoff_factor, tracker = 0.
  // Otherwise tracker + 1; when that equals growth_interval, scale *= growth_factor unless the result is inf,
  // and tracker = 0. Update both tensors in place (copy_ / fill_); at::where keeps it free of host syncs.
  TORCH_CHECK(false, "TODO(lesson1, step 6): update_scale_plain() is not implemented yet");
}
// [update_plain]

// [update]
void GradScaler::update() {
  // TODO(lesson1, step 6): Disabled: do nothing. Add up the found_inf of every optimizer that was unscaled
  // (an error if none was), update scale_ and growth_tracker_ (fused or plain), and forget the
  // per-optimizer states so the next iteration starts fresh.
  TORCH_CHECK(false, "TODO(lesson1, step 6): GradScaler::update() is not implemented yet");
}

void GradScaler::update(double new_scale) {
  // TODO(lesson1, step 6): Disabled: do nothing. An error before scale() and for a new_scale that is not
  // finite and > 0; fill scale_ with new_scale (leave the tracker) and forget the per-optimizer states.
  TORCH_CHECK(false, "TODO(lesson1, step 6): GradScaler::update(new_scale) is not implemented yet");
}
// [update]

// [state]
GradScalerState GradScaler::state_dict() const {
  // TODO(lesson1, step 6): Disabled: a GradScalerState with enabled = false. Otherwise the current scale
  // (get_scale()), the three options and the growth tracker.
  TORCH_CHECK(false, "TODO(lesson1, step 6): GradScaler::state_dict() is not implemented yet");
}

void GradScaler::load_state_dict(const GradScalerState& state) {
  // TODO(lesson1, step 6): Disabled scaler: do nothing. An error for a state saved from a disabled scaler
  // (state.enabled false: "saved from a disabled scaler"); validate like the constructor (and
  // 0 <= growth_tracker < growth_interval); take the values; if scale_ already exists, fill it too.
  TORCH_CHECK(false, "TODO(lesson1, step 6): GradScaler::load_state_dict() is not implemented yet");
}

// [state]

// [train_step]
StepResult train_step(torch::optim::Optimizer& optimizer, GradScaler& scaler,
                      const std::function<at::Tensor()>& forward_and_loss, const StepOptions& options) {
  // TODO(lesson1, step 7): zero the gradients; run forward_and_loss() inside an AutocastGuard(options.device,
  // options.dtype, options.autocast) scope — forward and loss only; backward on scaler.scale(loss) outside
  // it; if options.max_grad_norm > 0, unscale_ then clip_grad_norm_(optimizer, ...); scaler.step;
  // scaler.update; return the detached loss and whether the optimizer stepped.
  TORCH_CHECK(false, "TODO(lesson1, step 7): train_step() is not implemented yet");
}
// [train_step]

}  // namespace amp
