// Given code for lesson 1: nothing to do here. These wrap what LibTorch already has (the fused ATen AMP
// kernels, gradient clipping, archives); both the skeleton and the reference solution link this file.
#include "lesson1_amp/grad_scaler.h"

#include <algorithm>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/types.h>  // clip_grad.h needs torch::Tensor declared first
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include "common/compat/compat.h"

namespace amp {

namespace {

constexpr const char* kWorkshopUnscale = "workshop::fused_unscale_";  // lesson 6, step 5
constexpr const char* kAtenUnscale = "aten::_amp_foreach_non_finite_check_and_unscale_";

// Lesson 6's operator, where a binary links it and it has a kernel for the device. Looked up on every call: an
// operator may be registered after the first one (a library loaded later).
std::optional<c10::OperatorHandle> workshop_unscale(c10::DeviceType device) {
  const auto op = c10::Dispatcher::singleton().findOp(c10::OperatorName(kWorkshopUnscale, ""));
  if (!op) return std::nullopt;
  const bool has_kernel = (device == c10::DeviceType::CPU && op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) ||
                          (device == c10::DeviceType::CUDA && op->hasKernelForDispatchKey(c10::DispatchKey::CUDA));
  return has_kernel ? std::optional<c10::OperatorHandle>(*op) : std::nullopt;
}

}  // namespace

std::string fused_unscale_kernel(c10::DeviceType device) {
  if (workshop_unscale(device)) return kWorkshopUnscale;
  return workshop::compat::has_fused_amp_kernels(device) ? kAtenUnscale : "";
}

void unscale_grads_fused(const std::vector<at::Tensor>& grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  TORCH_CHECK(found_inf.defined() && inv_scale.defined(), "unscale_grads_fused: undefined found_inf or inv_scale");
  const c10::DeviceType device = found_inf.device().type();
  const bool aten = workshop::compat::has_fused_amp_kernels(device);
  if (const auto op = workshop_unscale(device)) {
    // Lesson 6's operator takes contiguous float32, bfloat16 and float16 gradients (ATen's also takes float64).
    const bool takes = std::all_of(grads.begin(), grads.end(), [](const at::Tensor& g) {
      const c10::ScalarType dtype = g.defined() ? g.scalar_type() : c10::ScalarType::Undefined;
      return g.defined() && g.layout() == c10::kStrided && g.is_contiguous() &&
             (dtype == c10::ScalarType::Float || dtype == c10::ScalarType::BFloat16 || dtype == c10::ScalarType::Half);
    });
    if (takes) {
      op->typed<void(at::TensorList, at::Tensor&, const at::Tensor&)>().call(grads, found_inf, inv_scale);
      return;
    }
    if (!aten) {  // a gradient lesson 6's kernel refuses; without ATen's kernel, the plain ops
      unscale_grads_plain(grads, found_inf, inv_scale);
      return;
    }
  }
  TORCH_CHECK(aten, "unscale_grads_fused: no fused unscale kernel for ", found_inf.device(),
              " (ATen's CPU kernels arrived in LibTorch 2.3; lesson 6's workshop::fused_unscale_ is not linked "
              "in); use unscale_grads_plain");
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
}

void update_scale_fused(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                        double growth_factor, double backoff_factor, int64_t growth_interval) {
  TORCH_CHECK(scale.defined() && growth_tracker.defined() && found_inf.defined(),
              "update_scale_fused: undefined input");
  const c10::DeviceType device = scale.device().type();
  if (!workshop::compat::has_fused_amp_kernels(device)) {
    // Only with lesson 6's fused unscale on a LibTorch without ATen's kernels: one number to update, nothing
    // to fuse.
    TORCH_CHECK(workshop_unscale(device).has_value(), "update_scale_fused: this LibTorch has no fused AMP kernel for ",
                scale.device(), " (CPU kernels arrived in LibTorch 2.3); use update_scale_plain");
    update_scale_plain(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval);
    return;
  }
  at::_amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval);
}

double clip_grad_norm_(torch::optim::Optimizer& optimizer, double max_norm) {
  TORCH_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be > 0, got ", max_norm);
  std::vector<at::Tensor> params;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) params.push_back(param);
  }
  return torch::nn::utils::clip_grad_norm_(params, max_norm);
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  const GradScalerState state = state_dict();
  archive.write("enabled", c10::IValue(state.enabled));
  archive.write("scale", c10::IValue(state.scale));
  archive.write("growth_factor", c10::IValue(state.growth_factor));
  archive.write("backoff_factor", c10::IValue(state.backoff_factor));
  archive.write("growth_interval", c10::IValue(state.growth_interval));
  archive.write("growth_tracker", c10::IValue(state.growth_tracker));
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  GradScalerState state;
  c10::IValue value;
  if (archive.try_read("enabled", value)) state.enabled = value.toBool();  // older archives: enabled
  archive.read("scale", value);
  state.scale = value.toDouble();
  archive.read("growth_factor", value);
  state.growth_factor = value.toDouble();
  archive.read("backoff_factor", value);
  state.backoff_factor = value.toDouble();
  archive.read("growth_interval", value);
  state.growth_interval = value.toInt();
  archive.read("growth_tracker", value);
  state.growth_tracker = value.toInt();
  load_state_dict(state);
}

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive, const GradScaler& scaler) {
  scaler.save(archive);
  return archive;
}

torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive, GradScaler& scaler) {
  scaler.load(archive);
  return archive;
}

}  // namespace amp

namespace amp {

bool GradScaler::use_fused(c10::DeviceType device) const {
  switch (options_.kernels) {
    case KernelPath::kPlain:
      return false;
    case KernelPath::kFused:
      TORCH_CHECK(!fused_unscale_kernel(device).empty(),
                  "GradScaler: KernelPath::kFused requested, "
                  "but this LibTorch has no fused AMP kernels for ",
                  device, " (and lesson 6's workshop::fused_unscale_ is not linked in)");
      return true;
    case KernelPath::kAuto:
    default:
      return !fused_unscale_kernel(device).empty();
  }
}

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  return scale_.defined() ? scale_.item<double>() : options_.init_scale;
}

int64_t GradScaler::get_growth_tracker() const {
  if (!options_.enabled) return 0;
  return growth_tracker_.defined() ? growth_tracker_.item<int64_t>() : init_growth_tracker_;
}

}  // namespace amp
