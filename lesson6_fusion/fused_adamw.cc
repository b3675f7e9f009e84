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
  // TODO(lesson6, step 1): Count, for each tensor op of torch::optim::AdamW's step (the list in
  // fused_adamw.h, above unfused_adamw_step), the tensors it reads and writes, and the new tensors it makes.
  // One tensor = numel * c10::elementSize(dtype) bytes. Reject a negative numel and a non-floating dtype.
  TORCH_CHECK(false, "TODO(lesson6, step 1): unfused_adamw_traffic() is not implemented yet");
}
// [unfused_traffic]

// [fused_traffic]
Traffic fused_adamw_traffic(int64_t numel, c10::ScalarType param_dtype) {
  // TODO(lesson6, step 1): One pass: read param, grad (param_dtype) and exp_avg, exp_avg_sq (float32), write
  // param, exp_avg and exp_avg_sq. Same input checks as above.
  TORCH_CHECK(false, "TODO(lesson6, step 1): fused_adamw_traffic() is not implemented yet");
}
// [fused_traffic]

// [kernel]
void adamw_kernel_cpu(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                      const AdamWHyper& hyper, int64_t step, float grad_multiplier) {
  // TODO(lesson6, step 2): Compute the scalars once in double (bias corrections 1 - beta^step, the step size
  // lr / bias_correction1, the decay 1 - lr * weight_decay), then cast them to float. Cut the elements into
  // pieces of a fixed size (say 32768) and hand the pieces out with at::parallel_for(0, pieces, 1, ...); in
  // each piece go Vectorized<float>::size() lanes at a time: load p, g, m, v, multiply the gradient's lanes by
  // grad_multiplier (skip that when it is 1; never store the gradient), update them in torch::optim::AdamW's order (see unfused_adamw_step in fused_adamw.h), store p, m, v.
  // The last vector of a piece may be partial (loadu(ptr, count), store(ptr, count)); use those only
  // there, they copy a run-time number of bytes. For bfloat16 and float16
  // parameters convert the lanes to float and back (c10::BFloat16(float) rounds to nearest); that is enough to
  // pass. The reference (optional for you; the page explains it and what it changed) converts a block of a few
  // hundred elements into float arrays first, runs the float32 loop on them, and converts the block back.
  // It also compiles its loop twice, for the baseline and for AVX2 (given: cpu_isa() says which runs); optional too.
  TORCH_CHECK(false, "TODO(lesson6, step 2): adamw_kernel_cpu() is not implemented yet");
}
// [kernel]

// [check_args]
void check_adamw_args(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                      const at::Tensor& exp_avg_sq, const AdamWHyper& hyper, int64_t step) {
  // TODO(lesson6, step 3): One TORCH_CHECK per rule listed in fused_adamw.h, each with its message, in that
  // order. Overlap: two non-empty contiguous tensors share memory when their byte ranges
  // [data_ptr(), data_ptr() + nbytes()) intersect.
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
// TODO(lesson6, step 3): Define the operator's schema (fusion::kOpSchema) with TORCH_LIBRARY(workshop, m) and
// register fusion::fused_adamw_cpu as its CPU kernel with TORCH_LIBRARY_IMPL(workshop, CPU, m).
// [register]

namespace fusion {

// [multi_kernel]
void adamw_multi_kernel_cpu(c10::ArrayRef<at::Tensor> params, c10::ArrayRef<at::Tensor> grads,
                            c10::ArrayRef<at::Tensor> exp_avgs, c10::ArrayRef<at::Tensor> exp_avg_sqs,
                            const AdamWHyper& hyper, int64_t step, float grad_multiplier) {
  // TODO(lesson6, step 4): Lay the tensors end to end: offsets[i] = elements of tensors 0..i-1. Run ONE
  // parallel region over all of them, in pieces of a fixed size (as in step 2); a piece [begin, end) finds its
  // first tensor with std::upper_bound on the offsets and updates the part of each tensor it covers, with
  // step 2's loop for that tensor's dtype (and grad_multiplier).
  TORCH_CHECK(false, "TODO(lesson6, step 4): adamw_multi_kernel_cpu() is not implemented yet");
}
// [multi_kernel]

// [multi_check_args]
void check_adamw_multi_args(c10::ArrayRef<at::Tensor> params, c10::ArrayRef<at::Tensor> grads,
                            c10::ArrayRef<at::Tensor> exp_avgs, c10::ArrayRef<at::Tensor> exp_avg_sqs,
                            const AdamWHyper& hyper, int64_t step) {
  // TODO(lesson6, step 4): The rules of fused_adamw.h: one length; check_adamw_args() for each tuple, its error
  // prefixed with "tensor <i>: "; every tuple on tuple 0's device; then no overlap between tensors of different
  // tuples (sort the byte ranges by start address: two overlap somewhere only if two neighbours in that order do;
  // name the two tensors only when the check fails, a call that passes should format no string).
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
// TODO(lesson6, step 4): Add fusion::kMultiOpSchema to the namespace with TORCH_LIBRARY_FRAGMENT(workshop, m)
// (a namespace has one TORCH_LIBRARY, and any number of fragments) and register fusion::fused_adamw_multi_cpu
// as its CPU kernel.
// [register_multi]

namespace fusion {

// [unscale_kernel]
void unscale_kernel_cpu(c10::ArrayRef<at::Tensor> grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  // TODO(lesson6, step 5): Read the scalar inv_scale once. Lay the gradients end to end and run ONE parallel
  // region over them in step 4's pieces; in each, go Vectorized<float>::size() lanes at a time: load (as float),
  // note whether any lane is inf or NaN, multiply by inv_scale (skip it when inv_scale is 1), store in the
  // gradient's own dtype. Let each piece keep its own flag and write found_inf = 1 once at the end if any flag is
  // set (many threads writing one float in the loop would fight over its cache line).
  TORCH_CHECK(false, "TODO(lesson6, step 5): unscale_kernel_cpu() is not implemented yet");
}
// [unscale_kernel]

// [unscale_check_args]
void check_unscale_args(c10::ArrayRef<at::Tensor> grads, const at::Tensor& found_inf, const at::Tensor& inv_scale) {
  // TODO(lesson6, step 5): The rules of fused_adamw.h, in that order: found_inf and inv_scale first, then each
  // gradient (with its index), then no two gradients overlapping in memory (step 4's sorted byte ranges).
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
// TODO(lesson6, step 5): Add fusion::kUnscaleOpSchema with one more TORCH_LIBRARY_FRAGMENT(workshop, m) and
// register fusion::fused_unscale_cpu as its CPU kernel. Lesson 1's GradScaler then finds it by name.
// [register_unscale]

namespace fusion {
namespace cuda {

// [launch_shape]
LaunchShape launch_shape(int64_t numel, int vector_width, int multiprocessors) {
  // TODO(lesson6, step 6): The rules of kernel_api.h: check the three arguments (in that order), then
  // kThreadsPerBlock threads and blocks = packs / threads rounded UP (packs = numel / vector_width, rounded up),
  // but no more than multiprocessors * kBlocksPerMultiprocessor. This is C++ (the .cu file calls it): it runs and
  // is checked on any machine.
  TORCH_CHECK(false, "TODO(lesson6, step 6): launch_shape() is not implemented yet");
}
// [launch_shape]

}  // namespace cuda
}  // namespace fusion
