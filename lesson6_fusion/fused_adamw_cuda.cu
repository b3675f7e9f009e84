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
  // TODO(lesson6, step 6): Step 2's scalars, on the host, in double, then cast to float. A kernel templated on the
  // element type (float, __nv_bfloat16, __half) and a pack width kWidth, written as a struct whose
  // `__host__ __device__ void operator()(Thread thread, ...) const` is the body of one thread (grid.h): a
  // grid-stride loop over packs (load_pack<kWidth>(ptr, i), store_pack<kWidth>(ptr, i, pack)) from
  // thread.index() in steps of thread.stride(), one element per thread for the few left after the last whole
  // pack, the same update as step 2 in float32 (mul_rn, add_rn, div_rn, fmaf pin its roundings). Packs of 4 only
  // when all four pointers are aligned to a pack, else packs of 1. Then
  // return launch<YourKernel<T, kWidth>>(launch_shape(numel, kWidth, multiprocessors(target)), target, args...).
  // Step 5's scaler inside the kernel (pass both pointers to it; they are device memory): a thread returns before
  // writing anything when found_inf is given and *found_inf != 0; with grad_scale given it multiplies each gradient
  // value by float(1.0 / double(*grad_scale)) with mul_rn before the update (never storing the gradient).
  return "TODO(lesson6, step 6): launch_adamw() is not implemented yet";
}
// [cuda_kernel]

// [cuda_multi]
const char* launch_adamw_multi(const TensorPointers* tensors, int64_t count, const AdamWHyper& hyper, int64_t step,
                               const Target& target, const float* grad_scale, const float* found_inf, float* state_step,
                               int64_t* launches) {
  // TODO(lesson6, step 6): ATen's multi_tensor_apply: a kernel argument (a struct passed by value) with the
  // pointers of up to kMaxTensorsPerLaunch tensors and, for each of up to kMaxBlocksPerLaunch blocks, which tensor
  // and which chunk of kChunkElements elements it updates. Walk the tensors in order (skip empty ones), each
  // tensor's chunks in order; launch (grid: one block per chunk, kThreadsPerBlock threads) when the blocks are full
  // or before a tensor that would not fit, and carry a tensor whose chunks go on into the next list. In the kernel,
  // a block's threads stride over its chunk's packs by thread.threads, then its tail; step 2's update, step 5's
  // found_inf and grad_scale as in your AdamW kernel. Packs of 4 only where every pointer of the launch is aligned.
  // Count the launches into *launches (when not nullptr).
  return "TODO(lesson6, step 6): launch_adamw_multi() is not implemented yet";
}
// [cuda_multi]

// [cuda_unscale]
const char* launch_unscale(const GradPointer* grads, int64_t count, float* found_inf, const float* inv_scale,
                           const Target& target, int64_t* launches) {
  // TODO(lesson6, step 6): Step 5 as a kernel, for one gradient: the same grid-stride loop and packs; read
  // *inv_scale in the kernel (on a GPU it is device memory), note !isfinite(x) of the value as read, multiply
  // unless inv_scale is 1, and let a thread that saw inf or NaN store 1.0f into *found_inf (all such stores
  // agree: no atomic needed).
  return "TODO(lesson6, step 6): launch_unscale() is not implemented yet";
}
// [cuda_unscale]

}  // namespace cuda
}  // namespace fusion
