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

// The step's scalars in float32, computed once on the host in double as step 2 does; the two that depend on the
// step's number again on the device where the number is read there (step 5's state_step).
struct Coefficients {
  float decay;  // 1 - lr * weight_decay
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float inv_sqrt_bias_correction2;  // ATen's CUDA division by a scalar multiplies by its float reciprocal
  float eps;
  float neg_step_size;  // -lr / bias_correction1
  bool apply_decay;
  double lr, beta1_d, beta2_d;  // for with_step on the device
};

// The bias corrections of step number `step`, in double, then cast: the same code on the host and in a thread.
__host__ __device__ inline void with_step(Coefficients& c, double step) {
  const double bias_correction1 = 1 - pow(c.beta1_d, step);
  const double bias_correction2 = 1 - pow(c.beta2_d, step);
  c.inv_sqrt_bias_correction2 = div_rn(1.0f, static_cast<float>(sqrt(bias_correction2)));
  c.neg_step_size = static_cast<float>(-c.lr / bias_correction1);
}

Coefficients coefficients(const AdamWHyper& h, int64_t step) {
  Coefficients c;
  c.decay = static_cast<float>(1 - h.lr * h.weight_decay);
  c.beta1 = static_cast<float>(h.beta1);
  c.one_minus_beta1 = static_cast<float>(1 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1 - h.beta2);
  c.eps = static_cast<float>(h.eps);
  c.apply_decay = h.weight_decay != 0;
  c.lr = h.lr;
  c.beta1_d = h.beta1;
  c.beta2_d = h.beta2;
  with_step(c, static_cast<double>(step));
  return c;
}

// Step 5's counter, read by every thread: the steps taken so far, so this one is the next (nullptr: the host's).
__host__ __device__ inline void read_step(Coefficients& c, const float* state_step) {
  if (state_step != nullptr) with_step(c, static_cast<double>(*state_step) + 1);
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
                                      Coefficients c, const float* grad_scale, const float* found_inf,
                                      const float* state_step) const {
    // Step 5's scaler, read on the device by every thread: no host sync decides whether the step happens.
    if (found_inf != nullptr && *found_inf != 0.0f) return;
    read_step(c, state_step);
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
                            const Target& target, const float* grad_scale, const float* found_inf,
                            const float* state_step) {
  constexpr int kWidth = 4;
  const bool packed = aligned(p, sizeof(T) * kWidth) && aligned(g, sizeof(T) * kWidth) &&
                      aligned(m, sizeof(float) * kWidth) && aligned(v, sizeof(float) * kWidth);
  const LaunchShape shape = launch_shape(numel, packed ? kWidth : 1, multiprocessors(target));
  if (packed) {
    return launch<AdamWKernel<T, kWidth>>(shape, target, p, g, m, v, numel, c, grad_scale, found_inf, state_step);
  }
  return launch<AdamWKernel<T, 1>>(shape, target, p, g, m, v, numel, c, grad_scale, found_inf, state_step);
}

const char* launch_adamw_update(Dtype dtype, void* param, const void* grad, float* exp_avg, float* exp_avg_sq,
                                int64_t numel, const Coefficients& c, const Target& target, const float* grad_scale,
                                const float* found_inf, const float* state_step) {
  switch (dtype) {
    case Dtype::Float32:
      return launch_adamw_as(static_cast<float*>(param), static_cast<const float*>(grad), exp_avg, exp_avg_sq, numel, c,
                             target, grad_scale, found_inf, state_step);
    case Dtype::BFloat16:
      return launch_adamw_as(static_cast<__nv_bfloat16*>(param), static_cast<const __nv_bfloat16*>(grad), exp_avg,
                             exp_avg_sq, numel, c, target, grad_scale, found_inf, state_step);
    case Dtype::Float16:
      return launch_adamw_as(static_cast<__half*>(param), static_cast<const __half*>(grad), exp_avg, exp_avg_sq, numel,
                             c, target, grad_scale, found_inf, state_step);
  }
  return "launch_adamw: unknown dtype";
}

}  // namespace

const char* launch_adamw(Dtype dtype, void* param, const void* grad, float* exp_avg, float* exp_avg_sq, int64_t numel,
                         const AdamWHyper& hyper, int64_t step, const Target& target, const float* grad_scale,
                         const float* found_inf, float* state_step) {
  const char* error = launch_adamw_update(dtype, param, grad, exp_avg, exp_avg_sq, numel, coefficients(hyper, step),
                                          target, grad_scale, found_inf, state_step);
  // After every thread of the update has read the count (the next launch on the target), unless the flag skipped it.
  if (error == nullptr && state_step != nullptr) error = advance_step(state_step, found_inf, target);
  return error;
}
// [cuda_kernel]

// [cuda_multi]
namespace {

// What one multi-tensor launch carries to the GPU as its argument, by value: a slot per tensor (its pointers and
// size) and, for each block, which slot and which chunk of it the block updates. The AdamW launch and the unscale
// launch differ only in their Slot and in how many slots fit (kernel arguments are limited to 4 KiB).
template <typename Slot, int kMaxSlots>
struct ChunkList {
  using SlotType = Slot;
  static constexpr int kSlots = kMaxSlots;
  Slot slot[kMaxSlots];
  unsigned char block_tensor[kMaxBlocksPerLaunch];
  int block_chunk[kMaxBlocksPerLaunch];
};

// The chunk of block `thread.block`: its slot, where it starts in the slot's tensor, and its length.
template <typename Slot, int kMaxSlots>
__host__ __device__ const Slot& chunk_of(const ChunkList<Slot, kMaxSlots>& list, Thread thread, int64_t* begin,
                                         int64_t* n) {
  const Slot& s = list.slot[list.block_tensor[thread.block]];
  *begin = static_cast<int64_t>(list.block_chunk[thread.block]) * kChunkElements;
  *n = s.numel - *begin < kChunkElements ? s.numel - *begin : kChunkElements;
  return s;
}

// Walks tensors and their chunks in order, filling chunk lists and sending each (send(list, blocks, packed)) when it
// holds kMaxBlocksPerLaunch chunks or before a tensor that would be one slot too many; a tensor whose chunks fill a
// list goes on in the next one (ATen's multi_tensor_apply does the same walk). Packed: every slot of the list is
// aligned to a pack of 4.
template <typename List, typename Send>
class ChunkWalker {
  using Slot = typename List::SlotType;

 public:
  explicit ChunkWalker(const Send& send) : send_(send) {}

  void add(const Slot& t) {
    if (t.numel == 0) return;
    if (slots_ == List::kSlots) send();
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

  // Launches what is left; the number of launches, and the first error or nullptr.
  const char* finish(int64_t* launches) {
    send();
    if (launches != nullptr) *launches = launches_;
    return error_;
  }

 private:
  int put(const Slot& t) {
    const int slot = slots_++;
    list_.slot[slot] = t;
    packed_ = packed_ && t.aligned();
    return slot;
  }

  void send() {
    if (blocks_ > 0 && error_ == nullptr) {
      error_ = send_(list_, blocks_, packed_);
      ++launches_;
    }
    slots_ = 0;
    blocks_ = 0;
    packed_ = true;
  }

  List list_;
  int slots_ = 0, blocks_ = 0;
  bool packed_ = true;
  int64_t launches_ = 0;
  const char* error_ = nullptr;
  Send send_;
};

template <typename List, typename Send>
ChunkWalker<List, Send> chunk_walker(const Send& send) {
  return ChunkWalker<List, Send>(send);
}

// One tuple of the AdamW launch.
template <typename T>
struct AdamWSlot {
  T* p;
  const T* g;
  float* m;
  float* v;
  int64_t numel;
  bool aligned() const {
    return fusion::cuda::aligned(p, sizeof(T) * 4) && fusion::cuda::aligned(g, sizeof(T) * 4) &&
           fusion::cuda::aligned(m, sizeof(float) * 4) && fusion::cuda::aligned(v, sizeof(float) * 4);
  }
};

template <typename T>
using AdamWList = ChunkList<AdamWSlot<T>, kMaxTensorsPerLaunch>;

// One block, one chunk: the block's threads stride over the chunk's packs (block-stride, not grid-stride), the
// elements after its last whole pack to its first threads, one each.
template <typename T, int kWidth>
struct AdamWMultiKernel {
  __host__ __device__ void operator()(Thread thread, const AdamWList<T>& list, Coefficients c, const float* grad_scale,
                                      const float* found_inf, const float* state_step) const {
    if (found_inf != nullptr && *found_inf != 0.0f) return;  // as the one-tensor kernel: no host sync
    read_step(c, state_step);
    const float multiplier = multiplier_of(grad_scale);
    int64_t begin, n;
    const AdamWSlot<T>& s = chunk_of(list, thread, &begin, &n);
    T* p = s.p + begin;
    const T* g = s.g + begin;
    float* m = s.m + begin;
    float* v = s.v + begin;
    const int64_t packs = n / kWidth;
    for (int64_t i = thread.thread; i < packs; i += thread.threads) {
      update_pack<T, kWidth>(p, g, m, v, i, c, multiplier);
    }
    const int64_t tail = packs * kWidth + thread.thread;
    if (tail < n) update(p[tail], g[tail], m[tail], v[tail], c, multiplier);
  }
};

// The series of launches for the tuples of one dtype (T), in the list's order.
template <typename T>
const char* adamw_series(const TensorPointers* tensors, int64_t count, Dtype dtype, const Coefficients& c,
                         const Target& target, const float* grad_scale, const float* found_inf, const float* state_step,
                         int64_t* launches) {
  auto walker = chunk_walker<AdamWList<T>>([&](const AdamWList<T>& list, int blocks, bool packed) {
    LaunchShape shape;
    shape.blocks = blocks;
    shape.threads = kThreadsPerBlock;
    return packed ? launch<AdamWMultiKernel<T, 4>>(shape, target, list, c, grad_scale, found_inf, state_step)
                  : launch<AdamWMultiKernel<T, 1>>(shape, target, list, c, grad_scale, found_inf, state_step);
  });
  for (int64_t k = 0; k < count; ++k) {
    const TensorPointers& t = tensors[k];
    if (t.dtype != dtype) continue;
    walker.add({static_cast<T*>(t.param), static_cast<const T*>(t.grad), t.exp_avg, t.exp_avg_sq, t.numel});
  }
  return walker.finish(launches);
}

}  // namespace

const char* launch_adamw_multi(const TensorPointers* tensors, int64_t count, const AdamWHyper& hyper, int64_t step,
                               const Target& target, const float* grad_scale, const float* found_inf, float* state_step,
                               int64_t* launches) {
  const Coefficients c = coefficients(hyper, step);
  int64_t n[3] = {0, 0, 0};
  const char* error =
      adamw_series<float>(tensors, count, Dtype::Float32, c, target, grad_scale, found_inf, state_step, &n[0]);
  if (error == nullptr) {
    error = adamw_series<__nv_bfloat16>(tensors, count, Dtype::BFloat16, c, target, grad_scale, found_inf, state_step,
                                        &n[1]);
  }
  if (error == nullptr) {
    error = adamw_series<__half>(tensors, count, Dtype::Float16, c, target, grad_scale, found_inf, state_step, &n[2]);
  }
  if (launches != nullptr) *launches = n[0] + n[1] + n[2];
  // Once for the whole list, after every series has read the count.
  if (error == nullptr && state_step != nullptr) error = advance_step(state_step, found_inf, target);
  return error;
}
// [cuda_multi]

// [cuda_unscale]
namespace {

// One gradient of the unscale launch.
template <typename T>
struct UnscaleSlot {
  T* g;
  int64_t numel;
  bool aligned() const { return fusion::cuda::aligned(g, sizeof(T) * 4); }
};

template <typename T>
using UnscaleList = ChunkList<UnscaleSlot<T>, kMaxGradsPerLaunch>;

// One block, one chunk, as AdamWMultiKernel: notes whether each element, as read, is inf or NaN, then multiplies by
// *inv_scale unless it is 1 (as ATen's kernel does). Every thread that finds one writes the same 1.0f to found_inf:
// no atomic is needed for a store that all agree on.
template <typename T, int kWidth>
struct UnscaleKernel {
  __host__ __device__ void operator()(Thread thread, const UnscaleList<T>& list, float* found_inf,
                                      const float* inv_scale) const {
    const float inv = *inv_scale;
    int64_t begin, n;
    T* g = chunk_of(list, thread, &begin, &n).g + begin;
    const int64_t packs = n / kWidth;
    bool non_finite = false;
    for (int64_t i = thread.thread; i < packs; i += thread.threads) {
      Pack<T, kWidth> pack = load_pack<kWidth>(g, i);
#pragma unroll
      for (int k = 0; k < kWidth; ++k) {
        const float x = to_float(pack.x[k]);
        non_finite = non_finite || !isfinite(x);
        pack.x[k] = from_float<T>(x * inv);
      }
      if (inv != 1.0f) store_pack<kWidth>(g, i, pack);
    }
    const int64_t tail = packs * kWidth + thread.thread;
    if (tail < n) {
      const float x = to_float(g[tail]);
      non_finite = non_finite || !isfinite(x);
      if (inv != 1.0f) g[tail] = from_float<T>(x * inv);
    }
    if (non_finite) *found_inf = 1.0f;
  }
};

template <typename T>
const char* unscale_series(const GradPointer* grads, int64_t count, Dtype dtype, float* found_inf,
                           const float* inv_scale, const Target& target, int64_t* launches) {
  auto walker = chunk_walker<UnscaleList<T>>([&](const UnscaleList<T>& list, int blocks, bool packed) {
    LaunchShape shape;
    shape.blocks = blocks;
    shape.threads = kThreadsPerBlock;
    return packed ? launch<UnscaleKernel<T, 4>>(shape, target, list, found_inf, inv_scale)
                  : launch<UnscaleKernel<T, 1>>(shape, target, list, found_inf, inv_scale);
  });
  for (int64_t k = 0; k < count; ++k) {
    if (grads[k].dtype == dtype) walker.add({static_cast<T*>(grads[k].grad), grads[k].numel});
  }
  return walker.finish(launches);
}

}  // namespace

const char* launch_unscale(const GradPointer* grads, int64_t count, float* found_inf, const float* inv_scale,
                           const Target& target, int64_t* launches) {
  int64_t n[3] = {0, 0, 0};
  const char* error = unscale_series<float>(grads, count, Dtype::Float32, found_inf, inv_scale, target, &n[0]);
  if (error == nullptr) {
    error = unscale_series<__nv_bfloat16>(grads, count, Dtype::BFloat16, found_inf, inv_scale, target, &n[1]);
  }
  if (error == nullptr)
    error = unscale_series<__half>(grads, count, Dtype::Float16, found_inf, inv_scale, target, &n[2]);
  if (launches != nullptr) *launches = n[0] + n[1] + n[2];
  return error;
}
// [cuda_unscale]

}  // namespace cuda
}  // namespace fusion
