// Lesson 6 — your code. Replace each TODO with an implementation; the checks in fused_adamw_step*_test.cc tell you
// when it is right:  bazel test //lesson6_fusion:all
// Steps, hints and background: lesson6_fusion/README.md.
#include "lesson6_fusion/fused_adamw.h"

#include <algorithm>
#include <cmath>

#include <ATen/Parallel.h>      // at::parallel_for
#include <ATen/core/Tensor.h>   // at::Tensor: data_ptr<T>(), numel(), sizes(), ...
#include <ATen/cpu/vec/vec.h>   // at::vec::Vectorized<float>
#include <c10/util/BFloat16.h>  // c10::BFloat16, c10::Half: convert to float and back (rounds to nearest)
#include <c10/util/Half.h>
#include <torch/library.h>  // TORCH_LIBRARY, TORCH_LIBRARY_IMPL, TORCH_FN

namespace fusion {

// [unfused_traffic]
Traffic unfused_adamw_traffic(int64_t numel, c10::ScalarType dtype, bool weight_decay) {
  // TODO(lesson6, step 1): Sum the tensors each op of unfused_adamw_step (fused_adamw.h) reads, writes and creates; one
  // tensor is numel * c10::elementSize(dtype) bytes; refuse bad input (about 35 lines).
  TORCH_CHECK(false, "TODO(lesson6, step 1): unfused_adamw_traffic() is not implemented yet");
}
// [unfused_traffic]

// [fused_traffic]
Traffic fused_adamw_traffic(int64_t numel, c10::ScalarType param_dtype) {
  // TODO(lesson6, step 1): One pass: read param, grad (param_dtype), exp_avg, exp_avg_sq (float32); write param,
  // exp_avg, exp_avg_sq; the same checks (about 10 lines).
  TORCH_CHECK(false, "TODO(lesson6, step 1): fused_adamw_traffic() is not implemented yet");
}
// [fused_traffic]

// [kernel]
void adamw_kernel_cpu(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                      const AdamWHyper& hyper, int64_t step, float grad_multiplier) {
  // TODO(lesson6, step 2): One AdamW step in one pass: at::parallel_for over fixed pieces, Vectorized<float> lanes,
  // unfused_adamw_step's order, 16-bit in float32; see Step 2's hints (about 110 lines).
  TORCH_CHECK(false, "TODO(lesson6, step 2): adamw_kernel_cpu() is not implemented yet");
}
// [kernel]

// [check_args]
void check_adamw_args(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                      const at::Tensor& exp_avg_sq, const AdamWHyper& hyper, int64_t step) {
  // TODO(lesson6, step 3): One TORCH_CHECK per rule of fused_adamw.h, with its message, in that order; tensors overlap
  // when [data_ptr(), data_ptr() + nbytes()) intersect (about 45 lines).
  TORCH_CHECK(false, "TODO(lesson6, step 3): check_adamw_args() is not implemented yet");
}
// [check_args]

void fused_adamw_cpu(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, double lr,
                     double beta1, double beta2, double eps, double weight_decay, int64_t step,
                     const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf,
                     const c10::optional<at::Tensor>& state_step) {
  const AdamWHyper hyper{lr, beta1, beta2, eps, weight_decay};
  const bool counted = is_given(state_step);  // step 5: the step's number is state_step + 1, so at least 1
  check_adamw_args(param, grad, exp_avg, exp_avg_sq, hyper, counted ? 1 : step);
  ScalerGate gate;  // step 5's scaler and counter, only when the caller passed one
  gate.step = step;
  if (is_given(grad_scale) || is_given(found_inf) || counted) {
    gate = scaler_gate_cpu("fused_adamw_", param.device(), step, grad_scale, found_inf, state_step);
  }
  if (gate.skip) return;  // a skipped step writes nothing, and does not count
  adamw_kernel_cpu(param, grad, exp_avg, exp_avg_sq, hyper, gate.step, gate.grad_multiplier);
  if (counted) *state_step->data_ptr<float>() += 1.0f;
}

}  // namespace fusion

// [register]
// TODO(lesson6, step 3): TORCH_LIBRARY(workshop, m) defines fusion::kOpSchema; TORCH_LIBRARY_IMPL(workshop, CPU, m)
// registers fusion::fused_adamw_cpu (about 2 lines).
// [register]

namespace fusion {

// [multi_kernel]
void adamw_multi_kernel_cpu(c10::ArrayRef<at::Tensor> params, c10::ArrayRef<at::Tensor> grads,
                            c10::ArrayRef<at::Tensor> exp_avgs, c10::ArrayRef<at::Tensor> exp_avg_sqs,
                            const AdamWHyper& hyper, int64_t step, float grad_multiplier) {
  // TODO(lesson6, step 4): ONE parallel region over all tensors end to end, in step 2's pieces; a piece finds its first
  // tensor by std::upper_bound on the offsets (about 45 lines).
  TORCH_CHECK(false, "TODO(lesson6, step 4): adamw_multi_kernel_cpu() is not implemented yet");
}
// [multi_kernel]

// [multi_check_args]
void check_adamw_multi_args(c10::ArrayRef<at::Tensor> params, c10::ArrayRef<at::Tensor> grads,
                            c10::ArrayRef<at::Tensor> exp_avgs, c10::ArrayRef<at::Tensor> exp_avg_sqs,
                            const AdamWHyper& hyper, int64_t step) {
  // TODO(lesson6, step 4): fused_adamw.h's rules in order: one length, each tuple's check ("tensor <i>: " first), one
  // device, no overlap across tuples (about 45 lines).
  TORCH_CHECK(false, "TODO(lesson6, step 4): check_adamw_multi_args() is not implemented yet");
}
// [multi_check_args]

void fused_adamw_multi_cpu(c10::ArrayRef<at::Tensor> params, c10::ArrayRef<at::Tensor> grads,
                           c10::ArrayRef<at::Tensor> exp_avgs, c10::ArrayRef<at::Tensor> exp_avg_sqs, double lr,
                           double beta1, double beta2, double eps, double weight_decay, int64_t step,
                           const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf,
                           const c10::optional<at::Tensor>& state_step) {
  const AdamWHyper hyper{lr, beta1, beta2, eps, weight_decay};
  const bool counted = is_given(state_step);  // step 5: the step's number is state_step + 1, so at least 1
  check_adamw_multi_args(params, grads, exp_avgs, exp_avg_sqs, hyper, counted ? 1 : step);
  ScalerGate gate;  // step 5's scaler and counter, only when the caller passed one
  gate.step = step;
  if (is_given(grad_scale) || is_given(found_inf) || counted) {
    // Held to tuple 0's device (step 4 checked that every tuple is on it); an empty list runs here, on the CPU.
    const c10::Device device = params.empty() ? c10::Device(c10::kCPU) : params[0].device();
    gate = scaler_gate_cpu("fused_adamw_multi_", device, step, grad_scale, found_inf, state_step);
  }
  if (gate.skip) return;  // a skipped step writes nothing, and does not count
  adamw_multi_kernel_cpu(params, grads, exp_avgs, exp_avg_sqs, hyper, gate.step, gate.grad_multiplier);
  if (counted) *state_step->data_ptr<float>() += 1.0f;
}

}  // namespace fusion

// [register_multi]
// TODO(lesson6, step 4): Add fusion::kMultiOpSchema with TORCH_LIBRARY_FRAGMENT(workshop, m) and register
// fusion::fused_adamw_multi_cpu for CPU (about 2 lines).
// [register_multi]

namespace fusion {

// [unscale_kernel]
void unscale_kernel_cpu(c10::ArrayRef<at::Tensor> grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  // TODO(lesson6, step 5): Step 4's walk: multiply every value by inv_scale (not when 1), note inf/NaN per piece, write
  // found_inf = 1 once at the end (about 55 lines).
  TORCH_CHECK(false, "TODO(lesson6, step 5): unscale_kernel_cpu() is not implemented yet");
}
// [unscale_kernel]

// [unscale_check_args]
void check_unscale_args(c10::ArrayRef<at::Tensor> grads, const at::Tensor& found_inf, const at::Tensor& inv_scale) {
  // TODO(lesson6, step 5): fused_adamw.h's rules in order: found_inf and inv_scale, each gradient (with its index),
  // then no overlap (sorted byte ranges) (about 25 lines).
  TORCH_CHECK(false, "TODO(lesson6, step 5): check_unscale_args() is not implemented yet");
}
// [unscale_check_args]

void fused_unscale_cpu(c10::ArrayRef<at::Tensor> grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  check_unscale_args(grads, found_inf, inv_scale);
  unscale_kernel_cpu(grads, found_inf, inv_scale);
}

// [scaler_gate]
void check_scaler_args(const char* op, c10::Device device, int64_t step, const c10::optional<at::Tensor>& grad_scale,
                       const c10::optional<at::Tensor>& found_inf, const c10::optional<at::Tensor>& state_step) {
  // TODO(lesson6, step 5): fused_adamw.h's rules for each of grad_scale, found_inf, state_step that is_given(), in
  // that order, then step 0 with state_step; messages starting with `op` (about 15 lines).
  TORCH_CHECK(false, "TODO(lesson6, step 5): check_scaler_args() is not implemented yet");
}

ScalerGate scaler_gate_cpu(const char* op, c10::Device device, int64_t step,
                           const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf,
                           const c10::optional<at::Tensor>& state_step) {
  // TODO(lesson6, step 5): check_scaler_args(); skip when found_inf is given and not 0; else the step's number from
  // state_step, then the scale's rules and multiplier float(1.0 / double(scale)) (about 20 lines).
  TORCH_CHECK(false, "TODO(lesson6, step 5): scaler_gate_cpu() is not implemented yet");
}
// [scaler_gate]

}  // namespace fusion

// [register_unscale]
// TODO(lesson6, step 5): Add fusion::kUnscaleOpSchema with one more TORCH_LIBRARY_FRAGMENT(workshop, m) and register
// fusion::fused_unscale_cpu for CPU (about 2 lines).
// [register_unscale]

namespace fusion {
namespace cuda {

// [launch_shape]
LaunchShape launch_shape(int64_t numel, int vector_width, int multiprocessors) {
  // TODO(lesson6, step 6): kernel_api.h's rules: check the arguments in order; kThreadsPerBlock threads, blocks rounded
  // UP, capped at multiprocessors * kBlocksPerMultiprocessor (about 12 lines).
  TORCH_CHECK(false, "TODO(lesson6, step 6): launch_shape() is not implemented yet");
}
// [launch_shape]

}  // namespace cuda
}  // namespace fusion
