// Lesson 6, step 6 — your CUDA kernels. Built only where LibTorch has CUDA and nvcc is installed; the checks of
// step 6 run on a GPU (bazel test //lesson6_fusion:all on a CUDA machine, or tools/gpu_check.sh).
// nvcc compiles this file with kernel_api.h alone: no LibTorch header (and no TORCH_CHECK) in here.
#include "lesson6_fusion/kernel_api.h"

#include <cmath>

#include <cuda_bf16.h>     // __nv_bfloat16, __bfloat162float, __float2bfloat16_rn
#include <cuda_fp16.h>     // __half, __half2float, __float2half_rn
#include <cuda_runtime.h>  // cudaStream_t, cudaGetLastError, cudaDeviceGetAttribute

namespace fusion {
namespace cuda {

// [cuda_kernel]
const char* launch_adamw(Dtype dtype, void* param, const void* grad, float* exp_avg, float* exp_avg_sq, int64_t numel,
                         const AdamWHyper& hyper, int64_t step, void* stream) {
  // TODO(lesson6, step 6): Step 2's scalars, on the host, in double, then cast to float. A __global__ kernel
  // templated on the element type (float, __nv_bfloat16, __half) and a pack width: a grid-stride loop over
  // packs of 4 elements (a struct alignas(4 * sizeof(T)) { T x[4]; } loads in one instruction), one element
  // per thread for the few left after the last whole pack, the same update as step 2 in float32. Use packs of 4
  // only when all four pointers are aligned to a pack, else packs of 1. The grid: launch_shape(numel, width,
  // multiprocessors) (cudaDeviceGetAttribute(..., cudaDevAttrMultiProcessorCount, device)); launch on
  // static_cast<cudaStream_t>(stream), then return cudaGetLastError()'s text if it is not cudaSuccess.
  return "TODO(lesson6, step 6): launch_adamw() is not implemented yet";
}
// [cuda_kernel]

// [cuda_unscale]
const char* launch_unscale(Dtype dtype, void* grad, int64_t numel, float* found_inf, const float* inv_scale,
                           void* stream) {
  // TODO(lesson6, step 6): Step 5 on the GPU, for one gradient: the same grid-stride loop and packs; read
  // *inv_scale in the kernel (it is device memory), note !isfinite(x), multiply unless inv_scale is 1, and let a
  // thread that saw inf or NaN store 1.0f into *found_inf (all such stores agree: no atomic needed).
  return "TODO(lesson6, step 6): launch_unscale() is not implemented yet";
}
// [cuda_unscale]

}  // namespace cuda
}  // namespace fusion
