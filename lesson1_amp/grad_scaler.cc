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
  // TODO(lesson1, step 3): Reject bad options with TORCH_CHECK, each message naming the option (a helper you can reuse
  // in load_state_dict) (about 8 lines)
  TORCH_CHECK(false, "TODO(lesson1, step 3): GradScaler(options) is not implemented yet");
}
// [constructor]

// [scale]
at::Tensor GradScaler::scale(const at::Tensor& loss) {
  // TODO(lesson1, step 3): Check the loss; disabled: return it. At the first call create scale_ and growth_tracker_ on
  // the loss's device; return loss * scale_ (about 10 lines)
  TORCH_CHECK(false, "TODO(lesson1, step 3): GradScaler::scale() is not implemented yet");
}
// [scale]

// [unscale_plain]
void unscale_grads_plain(const std::vector<at::Tensor>& grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  // TODO(lesson1, step 4): For each gradient: set found_inf to 1 if it holds an inf or NaN (no .item()), then multiply
  // it in place by inv_scale, all under an at::NoGradGuard (about 12 lines)
  TORCH_CHECK(false, "TODO(lesson1, step 4): unscale_grads_plain() is not implemented yet");
}
// [unscale_plain]

// [unscale]
void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  // TODO(lesson1, step 4): Disabled: return. Refuse misuse (the errors in grad_scaler.h), unscale the gradients by
  // 1/scale with the fused or plain function (use_fused()), record found_inf and Stage::kUnscaled (about 40 lines)
  TORCH_CHECK(false, "TODO(lesson1, step 4): GradScaler::unscale_() is not implemented yet");
}
// [unscale]

// [step]
bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  // TODO(lesson1, step 5): Disabled: optimizer.step() and return true. Refuse misuse, unscale_ if not done, step only
  // if found_inf is 0, record Stage::kStepped, return whether it stepped (about 15 lines)
  TORCH_CHECK(false, "TODO(lesson1, step 5): GradScaler::step() is not implemented yet");
}
// [step]

// [update_plain]
void update_scale_plain(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                        double growth_factor, double backoff_factor, int64_t growth_interval) {
  // TODO(lesson1, step 6): Back off after an overflow (found_inf != 0, NaN too), else count a clean step and grow at
  // growth_interval; update both tensors in place, with no host sync (about 15 lines)
  TORCH_CHECK(false, "TODO(lesson1, step 6): update_scale_plain() is not implemented yet");
}
// [update_plain]

// [update]
void GradScaler::update() {
  // TODO(lesson1, step 6): Disabled: return. Add up the found_inf of every unscaled optimizer (an error if none),
  // update scale_ and growth_tracker_ (fused or plain), forget the per-optimizer states (about 15 lines)
  TORCH_CHECK(false, "TODO(lesson1, step 6): GradScaler::update() is not implemented yet");
}

void GradScaler::update(double new_scale) {
  // TODO(lesson1, step 6): Disabled: return. Refuse a call before scale() and a new_scale that is not finite and > 0;
  // fill scale_ with it (the tracker stays), forget the per-optimizer states (about 6 lines)
  TORCH_CHECK(false, "TODO(lesson1, step 6): GradScaler::update(new_scale) is not implemented yet");
}
// [update]

// [state]
GradScalerState GradScaler::state_dict() const {
  // TODO(lesson1, step 6): Disabled: a GradScalerState with enabled = false; otherwise the current scale (get_scale()),
  // the three options and the growth tracker (about 10 lines)
  TORCH_CHECK(false, "TODO(lesson1, step 6): GradScaler::state_dict() is not implemented yet");
}

void GradScaler::load_state_dict(const GradScalerState& state) {
  // TODO(lesson1, step 6): Disabled: return. Refuse a disabled scaler's state and what the constructor would refuse,
  // take the values, and fill scale_ and growth_tracker_ if they exist (about 15 lines)
  TORCH_CHECK(false, "TODO(lesson1, step 6): GradScaler::load_state_dict() is not implemented yet");
}

// [state]

// [train_step]
StepResult train_step(torch::optim::Optimizer& optimizer, GradScaler& scaler,
                      const std::function<at::Tensor()>& forward_and_loss, const StepOptions& options) {
  // TODO(lesson1, step 7): Zero the gradients; forward_and_loss() inside an AutocastGuard scope,
  // scaler.scale(loss).backward() outside it; unscale_ and clip if asked; step; update (about 15 lines)
  TORCH_CHECK(false, "TODO(lesson1, step 7): train_step() is not implemented yet");
}
// [train_step]

}  // namespace amp
