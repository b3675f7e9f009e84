// Lesson 6, step 6 — what lets one CUDA kernel body run on a GPU and on a simulated grid on the CPU. Given: nothing
// to do here. fused_adamw_cuda.cu includes this header instead of the CUDA headers.
//
// Compiled by nvcc (a CUDA build), it includes the CUDA headers and launch() runs a kernel on the GPU, or, when the
// Target asks for it, on the CPU grid below. Compiled by the host compiler (any build without nvcc: CI, a laptop),
// the shim part defines CUDA's keywords away and gives the 16-bit types and intrinsics the kernels use from c10,
// and launch() runs the CPU grid only. Either way a kernel is written once, as a functor whose
// `__host__ __device__` call operator is the body of one thread and gets that thread's place in the grid.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "lesson6_fusion/kernel_api.h"

// [shim]
#if defined(__CUDACC__)
#include <cuda_bf16.h>     // __nv_bfloat16, __bfloat162float, __float2bfloat16_rn
#include <cuda_fp16.h>     // __half, __half2float, __float2half_rn
#include <cuda_runtime.h>  // cudaStream_t, cudaGetLastError, cudaDeviceGetAttribute
#else
// No nvcc: the host compiler reads the kernels. The keywords mean nothing to it; c10's BFloat16 and Half are the
// 16-bit types (host-device types that round to nearest even, as ATen's CUDA kernels use them).
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <math.h>  // fmaf, sqrtf, isfinite: the names of CUDA's math functions

#include <cmath>

#define __host__
#define __device__
#define __global__
#define __forceinline__ inline

using __nv_bfloat16 = c10::BFloat16;
using __half = c10::Half;
using std::isfinite;

inline float __bfloat162float(__nv_bfloat16 x) { return static_cast<float>(x); }
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return c10::BFloat16(x); }  // round to nearest even
inline __nv_bfloat16 __float2bfloat16_rz(float x) {  // round toward zero: keep the upper 16 bits
  if (std::isnan(x)) return c10::BFloat16(x);
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return c10::BFloat16(static_cast<uint16_t>(bits >> 16), c10::BFloat16::from_bits());
}
inline float __half2float(__half x) { return static_cast<float>(x); }
inline __half __float2half_rn(float x) { return c10::Half(x); }
#endif
// [shim]

namespace fusion {
namespace cuda {

// ---- the kernels' arithmetic: one rounding each, the same on a GPU and on a CPU ------------------------------

// On a GPU the _rn intrinsics are single roundings that nvcc may not fuse into a multiply-add; on the CPU the
// plain operator is one rounding too (the host copy of the kernels is compiled with -ffp-contract=off).
__host__ __device__ inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
__host__ __device__ inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
__host__ __device__ inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// ---- packs: kWidth neighbouring elements that one instruction loads or stores ---------------------------------

// alignas makes nvcc emit one 8- or 16-byte access (ld.global.v4.f32 for four float32) instead of kWidth small ones.
template <typename T, int kWidth>
struct alignas(sizeof(T) * kWidth) Pack {
  T x[kWidth];
};

namespace grid_detail {
// What went wrong in the simulated grid, as a GPU would report it (a GPU stops the kernel at a misaligned access).
// Host memory: only the CPU grid touches it.
inline thread_local const char* simulated_fault = nullptr;
}  // namespace grid_detail

/// Pack i of `base` (elements i * kWidth ... i * kWidth + kWidth - 1). The address must be aligned to a pack: on a
/// GPU a misaligned one stops the kernel ("misaligned address"), and the simulated grid stops with the same error.
template <int kWidth, typename T>
__host__ __device__ Pack<T, kWidth> load_pack(const T* base, int64_t i) {
  const T* at = base + i * kWidth;
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const Pack<T, kWidth>*>(at);
#else
  Pack<T, kWidth> pack;
  if (reinterpret_cast<uintptr_t>(at) % alignof(Pack<T, kWidth>) != 0) {
    grid_detail::simulated_fault = "misaligned address";
    std::memset(static_cast<void*>(&pack), 0, sizeof pack);
    return pack;
  }
  std::memcpy(static_cast<void*>(&pack), at, sizeof pack);
  return pack;
#endif
}

/// Stores `pack` as pack i of `base`: the same alignment rule as load_pack.
template <int kWidth, typename T>
__host__ __device__ void store_pack(T* base, int64_t i, const Pack<T, kWidth>& pack) {
  T* at = base + i * kWidth;
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<Pack<T, kWidth>*>(at) = pack;
#else
  if (reinterpret_cast<uintptr_t>(at) % alignof(Pack<T, kWidth>) != 0) {
    grid_detail::simulated_fault = "misaligned address";
    return;
  }
  std::memcpy(static_cast<void*>(at), &pack, sizeof pack);
#endif
}

// ---- the grid ---------------------------------------------------------------------------------------------

// [thread]
/// The thread a kernel body runs as, in CUDA's words: block = blockIdx.x, thread = threadIdx.x, blocks = gridDim.x,
/// threads = blockDim.x.
struct Thread {
  int64_t block, thread, blocks, threads;
  /// This thread's index in the grid: blockIdx.x * blockDim.x + threadIdx.x.
  __host__ __device__ int64_t index() const { return block * threads + thread; }
  /// The threads of the grid: the step of a grid-stride loop.
  __host__ __device__ int64_t stride() const { return blocks * threads; }
};
// [thread]

/// The number of streaming multiprocessors launch_shape() is given for `target`: the simulated count, or the GPU's.
inline int multiprocessors(const Target& target) {
  if (target.simulated_multiprocessors > 0) return target.simulated_multiprocessors;
#if defined(__CUDACC__)
  int device = 0, count = 1;
  if (cudaGetDevice(&device) != cudaSuccess) return 1;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 1;
  return count;
#else
  return 1;
#endif
}

#if defined(__CUDACC__)
// The real kernel: every GPU thread runs the body once, with its place in the grid.
template <typename Kernel, typename... Args>
__global__ void grid_kernel(Args... args) {
  Kernel()(Thread{blockIdx.x, threadIdx.x, gridDim.x, blockDim.x}, args...);
}
#endif

// [simulate]
/// Runs Kernel's body for every thread of `shape` on the CPU, one thread after the other: the blocks in an order
/// shuffled by `seed` (a GPU promises no order), the threads of a block in order. Returns nullptr, or the fault
/// that stopped the grid (see load_pack).
template <typename Kernel, typename... Args>
const char* simulate(const LaunchShape& shape, uint64_t seed, const Args&... args) {
  std::vector<int64_t> order(static_cast<size_t>(shape.blocks));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::mt19937_64 random(seed);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[random() % i]);  // Fisher-Yates
  grid_detail::simulated_fault = nullptr;
  for (int64_t block : order) {
    for (int64_t thread = 0; thread < shape.threads; ++thread) {
      Kernel()(Thread{block, thread, shape.blocks, shape.threads}, args...);
      if (grid_detail::simulated_fault != nullptr) return grid_detail::simulated_fault;
    }
  }
  return nullptr;
}
// [simulate]

// [launch]
/// Launches Kernel on `target` with the grid `shape`: on the CPU grid (simulate) when target asks for it, else on
/// the GPU, on target.stream (Kernel<<<blocks, threads, 0, stream>>>). Returns nullptr once the kernel is queued
/// (GPU) or has run (CPU), or the text of the error. A grid of zero blocks runs nothing.
template <typename Kernel, typename... Args>
const char* launch(const LaunchShape& shape, const Target& target, const Args&... args) {
  if (shape.blocks == 0) return nullptr;
  if (target.simulated_multiprocessors > 0) return simulate<Kernel>(shape, target.seed, args...);
#if defined(__CUDACC__)
  grid_kernel<Kernel, Args...><<<static_cast<unsigned>(shape.blocks), static_cast<unsigned>(shape.threads), 0,
                                 static_cast<cudaStream_t>(target.stream)>>>(args...);
  const cudaError_t error = cudaGetLastError();  // a launch failure (bad configuration, no kernel image)
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
#else
  return "this build has no CUDA (nvcc was not found): the kernels run only on a simulated grid";
#endif
}
// [launch]

// [advance_step]
/// Step 5's step counter on the device, after an AdamW launch: adds 1 to *state_step unless found_inf (nullptr:
/// none) holds a value that is not 0. One thread, launched after the update on the same target (a GPU runs the
/// launches of one stream in order), so every thread of the update has read the old count; as ATen's optimizer adds
/// 1 to its state_steps before `_fused_adamw_` and subtracts found_inf after it, without a host sync.
struct AdvanceStep {
  __host__ __device__ void operator()(Thread, float* state_step, const float* found_inf) const {
    if (found_inf != nullptr && *found_inf != 0.0f) return;
    *state_step += 1.0f;
  }
};

/// Given. Launches AdvanceStep on `target`: nullptr, or the launch's error.
inline const char* advance_step(float* state_step, const float* found_inf, const Target& target) {
  LaunchShape one;
  one.blocks = 1;
  one.threads = 1;
  return launch<AdvanceStep>(one, target, state_step, found_inf);
}
// [advance_step]

}  // namespace cuda
}  // namespace fusion
