// Given code for lesson 6, step 6: nothing to do here. The CUDA kernels of the three operators: each checks its
// tensors with your checks of steps 3-5, then queues your kernels (fused_adamw_cuda.cu) on the current CUDA
// stream of the tensors' device. Built only where LibTorch has CUDA and nvcc was found (lesson6_fusion/BUILD).
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "lesson6_fusion/fused_adamw.h"

namespace fusion {
namespace {

cuda::Dtype cuda_dtype(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return cuda::Dtype::Float32;
    case c10::ScalarType::BFloat16:
      return cuda::Dtype::BFloat16;
    case c10::ScalarType::Half:
      return cuda::Dtype::Float16;
    default:
      TORCH_CHECK(false, "fused kernels (CUDA): unsupported dtype ", dtype);
  }
}

// The GPU of `t`, on its current CUDA stream.
cuda::Target target_of(const at::Tensor& t) {
  cuda::Target target;
  target.stream = c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
  return target;
}

// Step 5's scaler tensors as the kernel reads them: device pointers, or nullptr where one is not given.
struct ScalerPointers {
  const float* grad_scale = nullptr;
  const float* found_inf = nullptr;
};

ScalerPointers scaler_pointers(const c10::optional<at::Tensor>& grad_scale,
                               const c10::optional<at::Tensor>& found_inf) {
  ScalerPointers pointers;
  if (is_given(grad_scale)) pointers.grad_scale = grad_scale->data_ptr<float>();
  if (is_given(found_inf)) pointers.found_inf = found_inf->data_ptr<float>();
  return pointers;
}

void adamw_one(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
               const AdamWHyper& hyper, int64_t step, const ScalerPointers& scaler) {
  if (param.numel() == 0) return;
  const char* error = cuda::launch_adamw(cuda_dtype(param.scalar_type()), param.data_ptr(), grad.data_ptr(),
                                         exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(), param.numel(), hyper,
                                         step, target_of(param), scaler.grad_scale, scaler.found_inf);
  TORCH_CHECK(error == nullptr, "fused_adamw_ (CUDA): ", error);
}

void fused_adamw_cuda(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, double lr,
                      double beta1, double beta2, double eps, double weight_decay, int64_t step,
                      const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf) {
  const AdamWHyper hyper{lr, beta1, beta2, eps, weight_decay};
  check_adamw_args(param, grad, exp_avg, exp_avg_sq, hyper, step);  // step 3, the same rules on every device
  check_scaler_args("fused_adamw_", param, grad_scale, found_inf);  // step 5; the values stay on the GPU
  const c10::cuda::CUDAGuard device(param.device());                // launch on the tensors' GPU
  adamw_one(param, grad, exp_avg, exp_avg_sq, hyper, step, scaler_pointers(grad_scale, found_inf));
}

// Your multi-tensor launches (launch_adamw_multi), one series per dtype in the list's order: a model of many small
// tensors costs a few launches instead of one per tensor (a launch costs microseconds, a small tensor's traffic
// less), as PyTorch's _fused_adamw_ does with multi_tensor_apply.
void fused_adamw_multi_cuda(c10::ArrayRef<at::Tensor> params, c10::ArrayRef<at::Tensor> grads,
                            c10::ArrayRef<at::Tensor> exp_avgs, c10::ArrayRef<at::Tensor> exp_avg_sqs, double lr,
                            double beta1, double beta2, double eps, double weight_decay, int64_t step,
                            const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf) {
  const AdamWHyper hyper{lr, beta1, beta2, eps, weight_decay};
  check_adamw_multi_args(params, grads, exp_avgs, exp_avg_sqs, hyper, step);  // step 4
  if (params.empty()) return;
  check_scaler_args("fused_adamw_multi_", params[0], grad_scale, found_inf);  // step 5
  const ScalerPointers scaler = scaler_pointers(grad_scale, found_inf);
  const c10::cuda::CUDAGuard device(params[0].device());  // step 4 checked that every tuple is on it
  for (c10::ScalarType dtype : {c10::ScalarType::Float, c10::ScalarType::BFloat16, c10::ScalarType::Half}) {
    std::vector<cuda::TensorPointers> tensors;
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].scalar_type() != dtype) continue;
      cuda::TensorPointers t;
      t.param = params[i].data_ptr();
      t.grad = grads[i].data_ptr();
      t.exp_avg = exp_avgs[i].data_ptr<float>();
      t.exp_avg_sq = exp_avg_sqs[i].data_ptr<float>();
      t.numel = params[i].numel();
      tensors.push_back(t);
    }
    if (tensors.empty()) continue;
    const char* error =
        cuda::launch_adamw_multi(cuda_dtype(dtype), tensors.data(), static_cast<int64_t>(tensors.size()), hyper, step,
                                 target_of(params[0]), scaler.grad_scale, scaler.found_inf, nullptr);
    TORCH_CHECK(error == nullptr, "fused_adamw_multi_ (CUDA): ", error);
  }
}

void fused_unscale_cuda(c10::ArrayRef<at::Tensor> grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  check_unscale_args(grads, found_inf, inv_scale);  // step 5: every gradient on found_inf's device
  const c10::cuda::CUDAGuard device(found_inf.device());
  for (const at::Tensor& g : grads) {
    if (g.numel() == 0) continue;
    const char* error = cuda::launch_unscale(cuda_dtype(g.scalar_type()), g.data_ptr(), g.numel(),
                                             found_inf.data_ptr<float>(), inv_scale.data_ptr<float>(), target_of(g));
    TORCH_CHECK(error == nullptr, "fused_unscale_ (CUDA): ", error);
  }
}

}  // namespace
}  // namespace fusion

// [register_cuda]
// The CUDA kernels behind the names your TORCH_LIBRARY defined: the dispatcher picks them for CUDA tensors.
TORCH_LIBRARY_IMPL(workshop, CUDA, m) {
  m.impl("fused_adamw_", TORCH_FN(fusion::fused_adamw_cuda));
  m.impl("fused_adamw_multi_", TORCH_FN(fusion::fused_adamw_multi_cuda));
  m.impl("fused_unscale_", TORCH_FN(fusion::fused_unscale_cuda));
}
// [register_cuda]
