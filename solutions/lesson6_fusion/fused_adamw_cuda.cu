// Reference solution of lesson 6, step 6 (lesson6_fusion/kernel_api.h): the AdamW step and the unscale on a GPU,
// and the same kernel bodies on a simulated grid on the CPU (lesson6_fusion/grid.h). Compiled by nvcc with
// kernel_api.h and grid.h alone (no LibTorch headers) where there is one, by the host compiler elsewhere.
#include "lesson6_fusion/kernel_api.h"

#include <cmath>

#include "lesson6_fusion/grid.h"  // the CUDA headers under nvcc, a shim without; launch(), packs, Thread

namespace fusion {
namespace cuda {

// [cuda_kernel]
namespace {

// The step's scalars in float32, computed once on the host in double as step 2 does.
struct Coefficients {
  float decay;  // 1 - lr * weight_decay
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float inv_sqrt_bias_correction2;  // ATen's CUDA division by a scalar multiplies by its float reciprocal
  float eps;
  float neg_step_size;  // -lr / bias_correction1
  bool apply_decay;
};

Coefficients coefficients(const AdamWHyper& h, int64_t step) {
  const double bias_correction1 = 1 - std::pow(h.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(h.beta2, static_cast<double>(step));
  Coefficients c;
  c.decay = static_cast<float>(1 - h.lr * h.weight_decay);
  c.beta1 = static_cast<float>(h.beta1);
  c.one_minus_beta1 = static_cast<float>(1 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1 - h.beta2);
  c.inv_sqrt_bias_correction2 = 1.0f / static_cast<float>(std::sqrt(bias_correction2));
  c.eps = static_cast<float>(h.eps);
  c.neg_step_size = static_cast<float>(-h.lr / bias_correction1);
  c.apply_decay = h.weight_decay != 0;
  return c;
}

__host__ __device__ inline float to_float(float x) { return x; }
__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__host__ __device__ inline float to_float(__half x) { return __half2float(x); }

template <typename T>
__host__ __device__ T from_float(float x);
template <>
__host__ __device__ inline float from_float<float>(float x) {
  return x;
}
template <>
__host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);  // round to nearest even, as c10::BFloat16(float)
}
template <>
__host__ __device__ inline __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// One element, in torch::optim::AdamW's order (step 2's loop body, one lane), rounded as ATen's CUDA kernels
// round when torch::optim::AdamW runs on a GPU: add_(g, alpha), addcmul_ and addcdiv_ end in one fused
// multiply-add (fmaf: a*b + c rounded once), and `tensor / scalar` multiplies by the scalar's reciprocal. mul_rn,
// add_rn and div_rn (grid.h) are single roundings that the compiler may not fuse into anything else, so the order
// is pinned, on a GPU and on the CPU grid alike.
template <typename T>
__host__ __device__ void update(T& p, T g, float& m, float& v, const Coefficients& c, float grad_multiplier) {
  float param = to_float(p);
  const float grad = mul_rn(to_float(g), grad_multiplier);  // step 5's unscale, in a register (x * 1 is x)
  // p.mul_(decay)
  if (c.apply_decay) param = mul_rn(param, c.decay);
  // m.mul_(beta1).add_(g, 1 - beta1) and v.mul_(beta2).addcmul_(g, g, 1 - beta2)
  m = fmaf(c.one_minus_beta1, grad, mul_rn(m, c.beta1));
  v = fmaf(c.one_minus_beta2, mul_rn(grad, grad), mul_rn(v, c.beta2));
  // (v.sqrt() / sqrt(bias_correction2)).add_(eps), then p.addcdiv_(m, denom, -step_size)
  const float denom = add_rn(mul_rn(sqrtf(v), c.inv_sqrt_bias_correction2), c.eps);
  param = fmaf(c.neg_step_size, div_rn(m, denom), param);
  p = from_float<T>(param);
}

// Pack i of the four tensors: loaded, updated lane by lane, stored.
template <typename T, int kWidth>
__host__ __device__ void update_pack(T* p, const T* g, float* m, float* v, int64_t i, const Coefficients& c,
                                     float multiplier) {
  Pack<T, kWidth> pp = load_pack<kWidth>(p, i);
  const Pack<T, kWidth> gp = load_pack<kWidth>(g, i);
  Pack<float, kWidth> mp = load_pack<kWidth>(m, i);
  Pack<float, kWidth> vp = load_pack<kWidth>(v, i);
#pragma unroll
  for (int k = 0; k < kWidth; ++k) update(pp.x[k], gp.x[k], mp.x[k], vp.x[k], c, multiplier);
  store_pack<kWidth>(p, i, pp);
  store_pack<kWidth>(m, i, mp);
  store_pack<kWidth>(v, i, vp);
}

// Step 5's multiplier, read on the device: 1 without grad_scale.
__host__ __device__ inline float multiplier_of(const float* grad_scale) {
  return grad_scale == nullptr ? 1.0f : static_cast<float>(1.0 / static_cast<double>(*grad_scale));
}

// The body of one thread (grid.h runs it on a GPU or on the CPU grid). Grid-stride: thread t handles packs t,
// t + stride, ... so any grid covers every pack; the elements after the last whole pack (fewer than kWidth) go to
// the grid's first threads, one each.
template <typename T, int kWidth>
struct AdamWKernel {
  __host__ __device__ void operator()(Thread thread, T* p, const T* g, float* m, float* v, int64_t numel,
                                      Coefficients c, const float* grad_scale, const float* found_inf) const {
    // Step 5's scaler, read on the device by every thread: no host sync decides whether the step happens.
    if (found_inf != nullptr && *found_inf != 0.0f) return;
    const float multiplier = multiplier_of(grad_scale);
    const int64_t packs = numel / kWidth;
    for (int64_t i = thread.index(); i < packs; i += thread.stride()) {
      update_pack<T, kWidth>(p, g, m, v, i, c, multiplier);
    }
    const int64_t tail = packs * kWidth + thread.index();
    if (tail < numel) update(p[tail], g[tail], m[tail], v[tail], c, multiplier);
  }
};

bool aligned(const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// Launches AdamWKernel with packs of 4 where all four pointers are aligned to a pack, one element at a time where
// one is not (a view that starts mid-pack).
template <typename T>
const char* launch_adamw_as(T* p, const T* g, float* m, float* v, int64_t numel, const Coefficients& c,
                            const Target& target, const float* grad_scale, const float* found_inf) {
  constexpr int kWidth = 4;
  const bool packed = aligned(p, sizeof(T) * kWidth) && aligned(g, sizeof(T) * kWidth) &&
                      aligned(m, sizeof(float) * kWidth) && aligned(v, sizeof(float) * kWidth);
  const LaunchShape shape = launch_shape(numel, packed ? kWidth : 1, multiprocessors(target));
  if (packed) return launch<AdamWKernel<T, kWidth>>(shape, target, p, g, m, v, numel, c, grad_scale, found_inf);
  return launch<AdamWKernel<T, 1>>(shape, target, p, g, m, v, numel, c, grad_scale, found_inf);
}

}  // namespace

const char* launch_adamw(Dtype dtype, void* param, const void* grad, float* exp_avg, float* exp_avg_sq, int64_t numel,
                         const AdamWHyper& hyper, int64_t step, const Target& target, const float* grad_scale,
                         const float* found_inf) {
  const Coefficients c = coefficients(hyper, step);
  switch (dtype) {
    case Dtype::Float32:
      return launch_adamw_as(static_cast<float*>(param), static_cast<const float*>(grad), exp_avg, exp_avg_sq, numel, c,
                             target, grad_scale, found_inf);
    case Dtype::BFloat16:
      return launch_adamw_as(static_cast<__nv_bfloat16*>(param), static_cast<const __nv_bfloat16*>(grad), exp_avg,
                             exp_avg_sq, numel, c, target, grad_scale, found_inf);
    case Dtype::Float16:
      return launch_adamw_as(static_cast<__half*>(param), static_cast<const __half*>(grad), exp_avg, exp_avg_sq, numel,
                             c, target, grad_scale, found_inf);
  }
  return "launch_adamw: unknown dtype";
}
// [cuda_kernel]

// [cuda_multi]
namespace {

// What one multi-tensor launch carries to the GPU as its argument, by value: the tensors' pointers and, for each
// block, which chunk of which of them it updates.
template <typename T>
struct ChunkList {
  T* p[kMaxTensorsPerLaunch];
  const T* g[kMaxTensorsPerLaunch];
  float* m[kMaxTensorsPerLaunch];
  float* v[kMaxTensorsPerLaunch];
  int64_t numel[kMaxTensorsPerLaunch];
  unsigned char block_tensor[kMaxBlocksPerLaunch];
  int block_chunk[kMaxBlocksPerLaunch];
};

// One block, one chunk: the block's threads stride over the chunk's packs (block-stride, not grid-stride), the
// elements after its last whole pack to its first threads, one each.
template <typename T, int kWidth>
struct AdamWMultiKernel {
  __host__ __device__ void operator()(Thread thread, const ChunkList<T>& list, Coefficients c, const float* grad_scale,
                                      const float* found_inf) const {
    if (found_inf != nullptr && *found_inf != 0.0f) return;  // as the one-tensor kernel: no host sync
    const float multiplier = multiplier_of(grad_scale);
    const int t = list.block_tensor[thread.block];
    const int64_t begin = static_cast<int64_t>(list.block_chunk[thread.block]) * kChunkElements;
    const int64_t n = list.numel[t] - begin < kChunkElements ? list.numel[t] - begin : kChunkElements;
    T* p = list.p[t] + begin;
    const T* g = list.g[t] + begin;
    float* m = list.m[t] + begin;
    float* v = list.v[t] + begin;
    const int64_t packs = n / kWidth;
    for (int64_t i = thread.thread; i < packs; i += thread.threads) {
      update_pack<T, kWidth>(p, g, m, v, i, c, multiplier);
    }
    const int64_t tail = packs * kWidth + thread.thread;
    if (tail < n) update(p[tail], g[tail], m[tail], v[tail], c, multiplier);
  }
};

// Fills chunk lists in order and launches each when it is full (ATen's multi_tensor_apply does the same walk).
template <typename T>
class MultiLauncher {
 public:
  MultiLauncher(const Coefficients& c, const Target& target, const float* grad_scale, const float* found_inf)
      : c_(c), target_(target), grad_scale_(grad_scale), found_inf_(found_inf) {}

  void add(const TensorPointers& t) {
    if (t.numel == 0) return;
    if (tensors_ == kMaxTensorsPerLaunch) send();
    int slot = put(t);
    const int64_t chunks = (t.numel + kChunkElements - 1) / kChunkElements;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      list_.block_tensor[blocks_] = static_cast<unsigned char>(slot);
      list_.block_chunk[blocks_] = static_cast<int>(chunk);
      if (++blocks_ == kMaxBlocksPerLaunch) {
        send();
        if (chunk + 1 < chunks) slot = put(t);  // the tensor goes on in the next launch
      }
    }
  }

  // Launches what is left; the first error, or nullptr.
  const char* finish(int64_t* launches) {
    send();
    if (launches != nullptr) *launches = launches_;
    return error_;
  }

 private:
  int put(const TensorPointers& t) {
    const int slot = tensors_++;
    list_.p[slot] = static_cast<T*>(t.param);
    list_.g[slot] = static_cast<const T*>(t.grad);
    list_.m[slot] = t.exp_avg;
    list_.v[slot] = t.exp_avg_sq;
    list_.numel[slot] = t.numel;
    packed_ = packed_ && aligned(t.param, sizeof(T) * 4) && aligned(t.grad, sizeof(T) * 4) &&
              aligned(t.exp_avg, sizeof(float) * 4) && aligned(t.exp_avg_sq, sizeof(float) * 4);
    return slot;
  }

  void send() {
    if (blocks_ > 0 && error_ == nullptr) {
      LaunchShape shape;
      shape.blocks = blocks_;
      shape.threads = kThreadsPerBlock;
      error_ = packed_ ? launch<AdamWMultiKernel<T, 4>>(shape, target_, list_, c_, grad_scale_, found_inf_)
                       : launch<AdamWMultiKernel<T, 1>>(shape, target_, list_, c_, grad_scale_, found_inf_);
      ++launches_;
    }
    tensors_ = 0;
    blocks_ = 0;
    packed_ = true;
  }

  ChunkList<T> list_;
  int tensors_ = 0, blocks_ = 0;
  bool packed_ = true;
  int64_t launches_ = 0;
  const char* error_ = nullptr;
  Coefficients c_;
  Target target_;
  const float* grad_scale_;
  const float* found_inf_;
};

template <typename T>
const char* launch_adamw_multi_as(const TensorPointers* tensors, int64_t count, const Coefficients& c,
                                  const Target& target, const float* grad_scale, const float* found_inf,
                                  int64_t* launches) {
  MultiLauncher<T> launcher(c, target, grad_scale, found_inf);
  for (int64_t k = 0; k < count; ++k) launcher.add(tensors[k]);
  return launcher.finish(launches);
}

}  // namespace

const char* launch_adamw_multi(Dtype dtype, const TensorPointers* tensors, int64_t count, const AdamWHyper& hyper,
                               int64_t step, const Target& target, const float* grad_scale, const float* found_inf,
                               int64_t* launches) {
  const Coefficients c = coefficients(hyper, step);
  switch (dtype) {
    case Dtype::Float32:
      return launch_adamw_multi_as<float>(tensors, count, c, target, grad_scale, found_inf, launches);
    case Dtype::BFloat16:
      return launch_adamw_multi_as<__nv_bfloat16>(tensors, count, c, target, grad_scale, found_inf, launches);
    case Dtype::Float16:
      return launch_adamw_multi_as<__half>(tensors, count, c, target, grad_scale, found_inf, launches);
  }
  return "launch_adamw_multi: unknown dtype";
}
// [cuda_multi]

// [cuda_unscale]
namespace {

// Notes whether each element, as read, is inf or NaN, then multiplies by *inv_scale unless it is 1 (as ATen's kernel
// does). Every thread that finds one writes the same 1.0f to found_inf: no atomic is needed for a store that all
// agree on.
template <typename T, int kWidth>
struct UnscaleKernel {
  __host__ __device__ void operator()(Thread thread, T* g, int64_t numel, float* found_inf,
                                      const float* inv_scale) const {
    const float inv = *inv_scale;
    const int64_t packs = numel / kWidth;
    bool non_finite = false;
    for (int64_t i = thread.index(); i < packs; i += thread.stride()) {
      Pack<T, kWidth> pack = load_pack<kWidth>(g, i);
#pragma unroll
      for (int k = 0; k < kWidth; ++k) {
        const float x = to_float(pack.x[k]);
        non_finite = non_finite || !isfinite(x);
        pack.x[k] = from_float<T>(x * inv);
      }
      if (inv != 1.0f) store_pack<kWidth>(g, i, pack);
    }
    const int64_t tail = packs * kWidth + thread.index();
    if (tail < numel) {
      const float x = to_float(g[tail]);
      non_finite = non_finite || !isfinite(x);
      if (inv != 1.0f) g[tail] = from_float<T>(x * inv);
    }
    if (non_finite) *found_inf = 1.0f;
  }
};

template <typename T>
const char* launch_unscale_as(T* g, int64_t numel, float* found_inf, const float* inv_scale, const Target& target) {
  constexpr int kWidth = 4;
  const bool packed = aligned(g, sizeof(T) * kWidth);
  const LaunchShape shape = launch_shape(numel, packed ? kWidth : 1, multiprocessors(target));
  if (packed) return launch<UnscaleKernel<T, kWidth>>(shape, target, g, numel, found_inf, inv_scale);
  return launch<UnscaleKernel<T, 1>>(shape, target, g, numel, found_inf, inv_scale);
}

}  // namespace

const char* launch_unscale(Dtype dtype, void* grad, int64_t numel, float* found_inf, const float* inv_scale,
                           const Target& target) {
  switch (dtype) {
    case Dtype::Float32:
      return launch_unscale_as(static_cast<float*>(grad), numel, found_inf, inv_scale, target);
    case Dtype::BFloat16:
      return launch_unscale_as(static_cast<__nv_bfloat16*>(grad), numel, found_inf, inv_scale, target);
    case Dtype::Float16:
      return launch_unscale_as(static_cast<__half*>(grad), numel, found_inf, inv_scale, target);
  }
  return "launch_unscale: unknown dtype";
}
// [cuda_unscale]

}  // namespace cuda
}  // namespace fusion
