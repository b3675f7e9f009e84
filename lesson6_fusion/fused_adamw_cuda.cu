// Lesson 6, step 6 — your CUDA kernels. On every machine the checks of step 6 run them on a simulated grid on the
// CPU (grid.h): the host compiler reads this file through grid.h's shim where there is no nvcc. Where LibTorch has
// CUDA and nvcc is installed, nvcc compiles it and the GPU cases run the same kernels on the GPU too.
// No LibTorch header (and no TORCH_CHECK) in here: kernel_api.h and grid.h only.
#include "lesson6_fusion/kernel_api.h"

#include <cmath>

#include "lesson6_fusion/grid.h"  // the CUDA headers under nvcc, a shim without; launch(), packs, Thread

namespace fusion {
namespace cuda {

// [cuda_kernel]
const char* launch_adamw(Dtype dtype, void* param, const void* grad, float* exp_avg, float* exp_avg_sq, int64_t numel,
                         const AdamWHyper& hyper, int64_t step, const Target& target, const float* grad_scale,
                         const float* found_inf, float* state_step) {
  // TODO(lesson6, step 6): A grid-stride kernel (grid.h) doing step 2's update in packs of 4 (1 when unaligned), step
  // 5's scaler and state_step read on the device, then advance_step(); see Step 6's hints (about 135 lines).
  return "TODO(lesson6, step 6): launch_adamw() is not implemented yet";
}
// [cuda_kernel]

// [cuda_multi]
const char* launch_adamw_multi(const TensorPointers* tensors, int64_t count, const AdamWHyper& hyper, int64_t step,
                               const Target& target, const float* grad_scale, const float* found_inf, float* state_step,
                               int64_t* launches) {
  // TODO(lesson6, step 6): ATen's multi_tensor_apply, a series per dtype: launches of at most kMaxTensorsPerLaunch
  // tensors and kMaxBlocksPerLaunch chunks, one block per chunk; count them; advance_step() once (about 140 lines).
  return "TODO(lesson6, step 6): launch_adamw_multi() is not implemented yet";
}
// [cuda_multi]

// [cuda_unscale]
const char* launch_unscale(const GradPointer* grads, int64_t count, float* found_inf, const float* inv_scale,
                           const Target& target, int64_t* launches) {
  // TODO(lesson6, step 6): Step 5 on launch_adamw_multi's walk (kMaxGradsPerLaunch gradients): *inv_scale read on
  // the device, each value tested as read, multiplied unless 1; inf/NaN stores 1.0f (about 65 lines).
  return "TODO(lesson6, step 6): launch_unscale() is not implemented yet";
}
// [cuda_unscale]

}  // namespace cuda
}  // namespace fusion
