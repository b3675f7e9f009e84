// Given code for lesson 6, step 6: nothing to do here. The CUDA kernels of the three operators: each checks its
// tensors with your checks of steps 3-5, then queues your kernels (fused_adamw_cuda.cu) on the current CUDA
// stream of the tensors' device. Built only where LibTorch has CUDA and nvcc was found (lesson6_fusion/BUILD).
#include <initializer_list>
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

// Step 5's tensors as the kernels read them: device pointers, or nullptr where one is not given.
struct ScalerPointers {
  const float* grad_scale = nullptr;
  const float* found_inf = nullptr;
  float* state_step = nullptr;
};

ScalerPointers scaler_pointers(const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf,
                               const c10::optional<at::Tensor>& state_step) {
  ScalerPointers pointers;
  if (is_given(grad_scale)) pointers.grad_scale = grad_scale->data_ptr<float>();
  if (is_given(found_inf)) pointers.found_inf = found_inf->data_ptr<float>();
  if (is_given(state_step)) pointers.state_step = state_step->data_ptr<float>();
  return pointers;
}

void fused_adamw_cuda(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, double lr,
                      double beta1, double beta2, double eps, double weight_decay, int64_t step,
                      const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf,
                      const c10::optional<at::Tensor>& state_step) {
  const AdamWHyper hyper{lr, beta1, beta2, eps, weight_decay};
  const bool counted = is_given(state_step);  // the step's number is state_step + 1, read on the GPU
  check_adamw_args(param, grad, exp_avg, exp_avg_sq, hyper, counted ? 1 : step);  // step 3, on every device
  check_scaler_args("fused_adamw_", param.device(), step, grad_scale, found_inf, state_step);  // step 5
  const c10::cuda::CUDAGuard device(param.device());                                 // launch on the tensors' GPU
  const ScalerPointers scaler = scaler_pointers(grad_scale, found_inf, state_step);  // the values stay on the GPU
  // An empty tensor launches no update, but its step still counts (launch_adamw advances state_step).
  const char* error =
      cuda::launch_adamw(cuda_dtype(param.scalar_type()), param.data_ptr(), grad.data_ptr(), exp_avg.data_ptr<float>(),
                         exp_avg_sq.data_ptr<float>(), param.numel(), hyper, step, target_of(param), scaler.grad_scale,
                         scaler.found_inf, scaler.state_step);
  TORCH_CHECK(error == nullptr, "fused_adamw_ (CUDA): ", error);
}

// The device an empty list's call runs on: the dispatcher chose CUDA by a scaler tensor.
c10::Device device_of(c10::ArrayRef<at::Tensor> params,
                      std::initializer_list<const c10::optional<at::Tensor>*> scaler) {
  if (!params.empty()) return params[0].device();
  for (const c10::optional<at::Tensor>* t : scaler) {
    if (is_given(*t)) return (*t)->device();
  }
  TORCH_CHECK(false, "fused kernels (CUDA): no tensor to take the device from");
  return c10::Device(c10::kCPU);  // not reached
}

// Your multi-tensor launches (launch_adamw_multi), one series per dtype: a model of many small tensors costs a few
// launches instead of one per tensor (a launch costs microseconds, a small tensor's traffic less), as PyTorch's
// _fused_adamw_ does with multi_tensor_apply.
void fused_adamw_multi_cuda(c10::ArrayRef<at::Tensor> params, c10::ArrayRef<at::Tensor> grads,
                            c10::ArrayRef<at::Tensor> exp_avgs, c10::ArrayRef<at::Tensor> exp_avg_sqs, double lr,
                            double beta1, double beta2, double eps, double weight_decay, int64_t step,
                            const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf,
                            const c10::optional<at::Tensor>& state_step) {
  const AdamWHyper hyper{lr, beta1, beta2, eps, weight_decay};
  const bool counted = is_given(state_step);
  check_adamw_multi_args(params, grads, exp_avgs, exp_avg_sqs, hyper, counted ? 1 : step);  // step 4
  const c10::Device on = device_of(params, {&grad_scale, &found_inf, &state_step});      // step 4: every tuple is on it
  check_scaler_args("fused_adamw_multi_", on, step, grad_scale, found_inf, state_step);  // step 5
  const c10::cuda::CUDAGuard device(on);
  std::vector<cuda::TensorPointers> tensors;
  for (size_t i = 0; i < params.size(); ++i) {
    cuda::TensorPointers t;
    t.dtype = cuda_dtype(params[i].scalar_type());
    t.param = params[i].data_ptr();
    t.grad = grads[i].data_ptr();
    t.exp_avg = exp_avgs[i].data_ptr<float>();
    t.exp_avg_sq = exp_avg_sqs[i].data_ptr<float>();
    t.numel = params[i].numel();
    tensors.push_back(t);
  }
  const ScalerPointers scaler = scaler_pointers(grad_scale, found_inf, state_step);
  cuda::Target target;
  target.stream = c10::cuda::getCurrentCUDAStream(on.index()).stream();
  const char* error = cuda::launch_adamw_multi(tensors.data(), static_cast<int64_t>(tensors.size()), hyper, step,
                                               target, scaler.grad_scale, scaler.found_inf, scaler.state_step, nullptr);
  TORCH_CHECK(error == nullptr, "fused_adamw_multi_ (CUDA): ", error);
}

// Your multi-tensor unscale (launch_unscale), one series per dtype: lesson 1's GradScaler runs it on every step.
void fused_unscale_cuda(c10::ArrayRef<at::Tensor> grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  check_unscale_args(grads, found_inf, inv_scale);  // step 5: every gradient on found_inf's device
  const c10::cuda::CUDAGuard device(found_inf.device());
  std::vector<cuda::GradPointer> pointers;
  for (const at::Tensor& g : grads) {
    cuda::GradPointer p;
    p.dtype = cuda_dtype(g.scalar_type());
    p.grad = g.data_ptr();
    p.numel = g.numel();
    pointers.push_back(p);
  }
  const char* error =
      cuda::launch_unscale(pointers.data(), static_cast<int64_t>(pointers.size()), found_inf.data_ptr<float>(),
                           inv_scale.data_ptr<float>(), target_of(found_inf), nullptr);
  TORCH_CHECK(error == nullptr, "fused_unscale_ (CUDA): ", error);
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
