// Reference solution of lesson 1, part B (lesson1_amp/grad_scaler.h).
#include "lesson1_amp/grad_scaler.h"

#include <cmath>
#include <string>

#include <ATen/core/grad_mode.h>
#include <ATen/TensorOperators.h>  // Tensor with its methods and operators (+, *, &, ...)
#include <ATen/ops/full.h>         // at:: functions come one header each; add <ATen/ops/NAME.h> for others
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/optim/optimizer.h>

#include "lesson1_amp/autocast.h"
#include "common/compat/compat.h"

namespace amp {
namespace {

void check_options(double scale, double growth_factor, double backoff_factor, int64_t growth_interval) {
  TORCH_CHECK(std::isfinite(scale) && scale > 0, "GradScaler: the scale must be finite and > 0, got ", scale);
  TORCH_CHECK(growth_factor > 1.0, "GradScaler: growth_factor must be > 1, got ", growth_factor);
  TORCH_CHECK(backoff_factor > 0.0 && backoff_factor < 1.0, "GradScaler: backoff_factor must be in (0, 1), got ",
              backoff_factor);
  TORCH_CHECK(growth_interval > 0, "GradScaler: growth_interval must be > 0, got ", growth_interval);
}

// The gradients of every parameter of `optimizer` that has one, checked for what the scaler can handle.
std::vector<at::Tensor> gradients_of(torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> grads;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      TORCH_CHECK(grad.scalar_type() != c10::ScalarType::Half,
                  "GradScaler: attempting to unscale float16 gradients. Keep the parameters (master weights) in "
                  "float32 and let autocast make the 16-bit copies.");
      TORCH_CHECK(!grad.is_sparse(), "GradScaler: sparse gradients are not supported");
      grads.push_back(grad);
    }
  }
  TORCH_CHECK(!grads.empty(),
              "GradScaler: no parameter of this optimizer has a gradient. Did backward() run on the scaled loss "
              "(and were the gradients not zeroed to none after it)?");
  return grads;
}

}  // namespace

// [constructor]
GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  check_options(options.init_scale, options.growth_factor, options.backoff_factor, options.growth_interval);
}
// [constructor]

// [scale]
at::Tensor GradScaler::scale(const at::Tensor& loss) {
  TORCH_CHECK(loss.defined(), "GradScaler::scale: the loss is an undefined tensor");
  TORCH_CHECK(loss.is_floating_point(), "GradScaler::scale: the loss must be floating point, got ", loss.scalar_type());
  if (!options_.enabled) return loss;
  if (!scale_.defined()) {
    const auto on_device = at::TensorOptions().device(loss.device());
    scale_ = at::full({1}, options_.init_scale, on_device.dtype(at::kFloat));
    growth_tracker_ = at::full({1}, init_growth_tracker_, on_device.dtype(at::kInt));
  }
  TORCH_CHECK(loss.device() == scale_.device(), "GradScaler::scale: the loss is on ", loss.device(),
              " but this scaler's scale lives on ", scale_.device());
  return loss * scale_;
}
// [scale]

// [unscale_plain]
void unscale_grads_plain(const std::vector<at::Tensor>& grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  TORCH_CHECK(found_inf.numel() == 1 && found_inf.scalar_type() == c10::ScalarType::Float,
              "unscale_grads_plain: found_inf must be a one-element float32 tensor");
  TORCH_CHECK(inv_scale.numel() == 1 && inv_scale.scalar_type() == c10::ScalarType::Float,
              "unscale_grads_plain: inv_scale must be a one-element float32 tensor");
  at::NoGradGuard no_grad;  // unscaling is bookkeeping, not part of the model's graph
  for (const at::Tensor& grad : grads) {
    TORCH_CHECK(grad.device() == found_inf.device() && grad.device() == inv_scale.device(),
                "unscale_grads_plain: all tensors must be on one device; a gradient is on ", grad.device(),
                ", found_inf on ", found_inf.device());
    // No .item() here: the check stays on the device, so the GPU never waits for the host.
    found_inf.masked_fill_(grad.isfinite().all().logical_not(), 1.0);
    grad.mul_(inv_scale);
  }
}
// [unscale_plain]

// [unscale]
void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  TORCH_CHECK(scale_.defined(),
              "GradScaler::unscale_: called before scale(); run scaler.scale(loss).backward() "
              "first in this iteration");
  PerOptimizer& state = per_optimizer_[&optimizer];
  TORCH_CHECK(state.stage != Stage::kUnscaled,
              "GradScaler::unscale_: has already been called on this optimizer since the last update()");
  TORCH_CHECK(state.stage != Stage::kStepped, "GradScaler::unscale_: is being called after step()");

  std::vector<at::Tensor> grads = gradients_of(optimizer);
  for (const at::Tensor& grad : grads) {
    TORCH_CHECK(grad.device() == scale_.device(), "GradScaler: a gradient is on ", grad.device(),
                " but the scale is on ", scale_.device(), "; one device per scaler");
  }
  // The inverse is computed in float64 and then rounded once, as PyTorch does.
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  at::Tensor found_inf = at::zeros({1}, scale_.options());
  at::NoGradGuard no_grad;  // the fused kernel too: unscaling is not part of the model's graph
  if (use_fused(scale_.device().type())) {
    unscale_grads_fused(grads, found_inf, inv_scale);
  } else {
    unscale_grads_plain(grads, found_inf, inv_scale);
  }
  state.found_inf = found_inf;
  state.stage = Stage::kUnscaled;
}
// [unscale]

// [step]
bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  TORCH_CHECK(scale_.defined(),
              "GradScaler::step: called before scale(); run scaler.scale(loss).backward() "
              "first in this iteration");
  PerOptimizer& state = per_optimizer_[&optimizer];
  TORCH_CHECK(state.stage != Stage::kStepped,
              "GradScaler::step: has already been called on this optimizer since the last update()");
  if (state.stage == Stage::kReady) unscale_(optimizer);
  // The one host-device sync of the iteration: the host must know whether to step.
  const bool skip = state.found_inf.item<float>() != 0.0f;
  if (!skip) optimizer.step();
  state.stage = Stage::kStepped;
  return !skip;
}
// [step]

// [update_plain]
void update_scale_plain(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                        double growth_factor, double backoff_factor, int64_t growth_interval) {
  TORCH_CHECK(scale.numel() == 1 && scale.scalar_type() == c10::ScalarType::Float,
              "update_scale_plain: scale must be a one-element float32 tensor");
  TORCH_CHECK(growth_tracker.numel() == 1 && growth_tracker.scalar_type() == c10::ScalarType::Int,
              "update_scale_plain: growth_tracker must be a one-element int32 tensor");
  TORCH_CHECK(found_inf.numel() == 1, "update_scale_plain: found_inf must have one element");
  TORCH_CHECK(growth_interval > 0, "update_scale_plain: growth_interval must be > 0, got ", growth_interval);
  const at::Tensor overflow = found_inf.ne(0);        // [1] bool; NaN != 0 counts as overflow
  const at::Tensor clean_steps = growth_tracker + 1;  // [1] int32
  const at::Tensor grow = clean_steps.eq(growth_interval) & overflow.logical_not();
  at::Tensor grown = scale * growth_factor;
  grown = at::where(grown.isfinite(), grown, scale);  // never grow into inf
  const at::Tensor new_scale = at::where(overflow, scale * backoff_factor, at::where(grow, grown, scale));
  const at::Tensor new_tracker = at::where(overflow | grow, at::zeros_like(clean_steps), clean_steps);
  scale.copy_(new_scale);
  growth_tracker.copy_(new_tracker);
}
// [update_plain]

// [update]
void GradScaler::update() {
  if (!options_.enabled) return;
  TORCH_CHECK(scale_.defined(), "GradScaler::update: called before scale()");
  at::Tensor found_inf;
  for (const auto& entry : per_optimizer_) {
    if (!entry.second.found_inf.defined()) continue;
    found_inf = found_inf.defined() ? found_inf + entry.second.found_inf : entry.second.found_inf.clone();
  }
  TORCH_CHECK(found_inf.defined(),
              "GradScaler::update: no inf checks were recorded; call step(optimizer) before update()");
  if (use_fused(scale_.device().type())) {
    update_scale_fused(scale_, growth_tracker_, found_inf, options_.growth_factor, options_.backoff_factor,
                       options_.growth_interval);
  } else {
    update_scale_plain(scale_, growth_tracker_, found_inf, options_.growth_factor, options_.backoff_factor,
                       options_.growth_interval);
  }
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  TORCH_CHECK(scale_.defined(), "GradScaler::update: called before scale()");
  TORCH_CHECK(std::isfinite(new_scale) && new_scale > 0, "GradScaler::update: new_scale must be finite and > 0, got ",
              new_scale);
  scale_.fill_(new_scale);  // the tracker stays: PyTorch's update(new_scale) leaves it alone too
  per_optimizer_.clear();
}
// [update]

// [state]
GradScalerState GradScaler::state_dict() const {
  if (!options_.enabled) {
    GradScalerState none;
    none.enabled = false;  // a disabled scaler has no state to save
    return none;
  }
  return GradScalerState{true,
                         get_scale(),
                         options_.growth_factor,
                         options_.backoff_factor,
                         options_.growth_interval,
                         get_growth_tracker()};
}

void GradScaler::load_state_dict(const GradScalerState& state) {
  if (!options_.enabled) return;  // a pass-through has nothing to restore
  TORCH_CHECK(state.enabled,
              "GradScaler::load_state_dict: the state was saved from a disabled scaler and holds no "
              "scale; loading it would reset this scaler's scale");
  check_options(state.scale, state.growth_factor, state.backoff_factor, state.growth_interval);
  TORCH_CHECK(state.growth_tracker >= 0 && state.growth_tracker < state.growth_interval,
              "GradScaler::load_state_dict: growth_tracker must be in [0, growth_interval), got ",
              state.growth_tracker);
  options_.init_scale = state.scale;
  options_.growth_factor = state.growth_factor;
  options_.backoff_factor = state.backoff_factor;
  options_.growth_interval = state.growth_interval;
  init_growth_tracker_ = state.growth_tracker;
  if (scale_.defined()) {
    scale_.fill_(state.scale);
    growth_tracker_.fill_(state.growth_tracker);
  }
}

// [state]

// [train_step]
StepResult train_step(torch::optim::Optimizer& optimizer, GradScaler& scaler,
                      const std::function<at::Tensor()>& forward_and_loss, const StepOptions& options) {
  TORCH_CHECK(forward_and_loss, "train_step: forward_and_loss is empty");
  optimizer.zero_grad();
  at::Tensor loss;
  {
    // Forward and loss only: backward must run outside autocast (it mirrors the forward's dtypes itself).
    AutocastGuard autocast(options.device, options.dtype, options.autocast);
    loss = forward_and_loss();
  }
  TORCH_CHECK(loss.defined() && loss.numel() == 1, "train_step: forward_and_loss must return a scalar loss");
  scaler.scale(loss).backward();
  if (options.max_grad_norm > 0) {
    scaler.unscale_(optimizer);  // clip the true gradients, not the scaled ones
    clip_grad_norm_(optimizer, options.max_grad_norm);
  }
  const bool stepped = scaler.step(optimizer);
  scaler.update();
  return StepResult{loss.detach(), stepped};
}
// [train_step]

}  // namespace amp
