// Reference solution of lesson 6 (lesson6_fusion/fused_adamw.h): the napkin math, the fused AdamW kernel, the
// operators workshop::fused_adamw_ and workshop::fused_adamw_multi_, and the scaler's workshop::fused_unscale_.
#include "lesson6_fusion/fused_adamw.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

namespace fusion {

// [unfused_traffic]
namespace {

void check_traffic_args(int64_t numel, c10::ScalarType dtype) {
  TORCH_CHECK(numel >= 0, "adamw_traffic: numel must be >= 0, got ", numel);
  TORCH_CHECK(c10::isFloatingType(dtype), "adamw_traffic: dtype must be floating point, got ", dtype);
}

}  // namespace

Traffic unfused_adamw_traffic(int64_t numel, c10::ScalarType dtype, bool weight_decay) {
  check_traffic_args(numel, dtype);
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));  // one pass over one tensor
  // Each op: (tensor operands read, results written). Reading the same operand twice (g in addcmul_) counts
  // twice: the kernel loads it through two pointers.
  struct Op {
    int reads, writes, temporaries;
  };
  const Op ops[] = {
      {1, 1, 0},  // exp_avg.mul_(beta1)
      {2, 1, 0},  // .add_(grad, 1 - beta1)
      {1, 1, 0},  // exp_avg_sq.mul_(beta2)
      {3, 1, 0},  // .addcmul_(grad, grad, 1 - beta2)
      {1, 1, 1},  // exp_avg_sq.sqrt()             -> a new tensor
      {1, 1, 1},  // / sqrt(bias_correction2)      -> another new tensor
      {1, 1, 0},  // .add_(eps)
      {3, 1, 0},  // param.addcdiv_(exp_avg, denom, -step_size)
  };
  Traffic traffic;
  if (weight_decay) {  // param.mul_(1 - lr * weight_decay)
    traffic.bytes_read += bytes;
    traffic.bytes_written += bytes;
    traffic.passes += 1;
  }
  for (const Op& op : ops) {
    traffic.bytes_read += op.reads * bytes;
    traffic.bytes_written += op.writes * bytes;
    traffic.temporary_bytes += op.temporaries * bytes;
    traffic.passes += 1;
  }
  return traffic;
}
// [unfused_traffic]

// [fused_traffic]
Traffic fused_adamw_traffic(int64_t numel, c10::ScalarType param_dtype) {
  check_traffic_args(numel, param_dtype);
  const int64_t param = numel * static_cast<int64_t>(c10::elementSize(param_dtype));  // param or grad
  const int64_t state = numel * static_cast<int64_t>(sizeof(float));                  // exp_avg or exp_avg_sq
  Traffic traffic;
  traffic.bytes_read = 2 * param + 2 * state;  // p, g, m, v
  traffic.bytes_written = param + 2 * state;   // p, m, v
  traffic.passes = 1;
  return traffic;
}
// [fused_traffic]

// [kernel]
namespace {

using Vec = at::vec::Vectorized<float>;

// The step's scalars, in float32 as ATen's float kernels use them (ATen turns a double Scalar into the tensor's
// type before the loop).
struct Coefficients {
  float decay;  // 1 - lr * weight_decay
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float sqrt_bias_correction2;
  float eps;
  float neg_step_size;    // -lr / bias_correction1
  float grad_multiplier;  // step 5's 1 / scale, or 1
  CpuIsa isa;             // which compiled copy of the loop runs (below)
};

Coefficients coefficients(const AdamWHyper& h, int64_t step, float grad_multiplier) {
  const double bias_correction1 = 1 - std::pow(h.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(h.beta2, static_cast<double>(step));
  Coefficients c;
  c.decay = static_cast<float>(1 - h.lr * h.weight_decay);
  c.beta1 = static_cast<float>(h.beta1);
  c.one_minus_beta1 = static_cast<float>(1 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1 - h.beta2);
  c.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  c.eps = static_cast<float>(h.eps);
  c.neg_step_size = static_cast<float>(-h.lr / bias_correction1);
  c.grad_multiplier = grad_multiplier;
  c.isa = cpu_isa();
  return c;
}

// Loads `count` float32 elements as lanes (the rest zero) and stores them back. A full vector takes the fixed-size
// path: in ATen's generic Vectorized the counted loadu/store copy a run-time number of bytes (a memcpy call per
// vector). Measured at 64 MiB: the float32 step took 64.6 ms with counted stores, 31.2 ms with fixed-size ones.
// always_inline: compiled inside each copy of the loop below (a call would leave the AVX2 copy, and cost more there
// than the load: measured 2.4 ns per element against 0.39 inlined).
__attribute__((always_inline)) inline Vec load(const float* src, int64_t count) {
  return count == Vec::size() ? Vec::loadu(src) : Vec::loadu(src, count);
}

__attribute__((always_inline)) inline void store(float* dst, const Vec& value, int64_t count) {
  if (count == Vec::size()) {
    value.store(dst);
  } else {
    value.store(dst, static_cast<int>(count));
  }
}

// 16-bit parameters and gradients are converted a block at a time, into float32 arrays on the stack (per thread,
// in the L1 cache), and the float32 loop runs over those. Each conversion is one simple loop over the block, written
// on the bits (integer operations, a select instead of a branch), which gcc turns into SSE2 instructions that
// convert 4 or 8 elements at once, where a conversion inside the vector loop goes one element at a time through a
// small array. Measured against that (docs/results/lesson6_experiments.md, 2026-12-06): float16 about twice as
// fast; bfloat16 the same within the noise of a shared machine, its step being bound by the arithmetic there.
constexpr int64_t kBlock = 512;  // elements: 2 KiB of each float32 array

float float_from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);  // no aliasing question, and compiled to nothing
  return value;
}

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

uint32_t all_ones_if(bool condition) { return 0u - static_cast<uint32_t>(condition); }

// bfloat16 is the upper half of a float32: widening appends 16 zero bits. Narrowing rounds to nearest, ties to even,
// as c10::BFloat16(float) does, bit for bit: adding 0x7FFF plus the lowest kept bit carries into the kept half
// exactly when the dropped half is above the tie, or at the tie with an odd kept half; a NaN becomes 0x7FC0.
float widened(c10::BFloat16 x) { return float_from_bits(static_cast<uint32_t>(x.x) << 16); }

void narrow_to(c10::BFloat16& dst, float x) {
  const uint32_t u = bits_of(x);
  const uint32_t nan = all_ones_if((u & 0x7FFFFFFFu) > 0x7F800000u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  dst.x = static_cast<uint16_t>((0x7FC0u & nan) | (rounded & ~nan));
}

// float16 (1 sign, 5 exponent, 10 mantissa bits) as c10::Half converts it, bit for bit. Widening: a normal number
// gets its exponent rebiased (15 -> 127); a subnormal one is its mantissa times 2^-24 (exact in float32); inf and
// NaN keep their mantissa (a NaN made quiet). Every case is computed and the right one selected, so that a loop
// of these has no branch and gcc vectorises it.
float widened(c10::Half x) {
  const uint32_t h = x.x;
  const uint32_t magnitude = h & 0x7FFFu, mantissa = h & 0x3FFu;
  const uint32_t normal = (magnitude << 13) + 0x38000000u;
  const uint32_t subnormal = bits_of(static_cast<float>(static_cast<int32_t>(mantissa)) * 0x1p-24f);
  const uint32_t special = 0x7F800000u | (mantissa << 13) | (all_ones_if(mantissa != 0) & 0x00400000u);
  const uint32_t is_special = all_ones_if(magnitude >= 0x7C00u), is_subnormal = all_ones_if(magnitude < 0x0400u);
  return float_from_bits(((h & 0x8000u) << 16) | (special & is_special) | (subnormal & is_subnormal) |
                         (normal & ~(is_special | is_subnormal)));
}

// Narrowing to float16, rounding to nearest even: a normal result drops 13 mantissa bits the way bfloat16 drops 16
// (a carry may step into the next exponent, or into inf); at or above 65520 the result is inf; below 2^-14 adding
// 0.5 lets the float32 addition itself round |x| to a multiple of 2^-24, float16's subnormal step; NaN is 0x7E00.
void narrow_to(c10::Half& dst, float x) {
  const uint32_t u = bits_of(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  const uint32_t normal = (a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13;
  const uint32_t subnormal = bits_of(float_from_bits(a) + 0.5f) - 0x3F000000u;
  const uint32_t is_nan = all_ones_if(a > 0x7F800000u), is_inf = all_ones_if(a >= 0x477FF000u) & ~is_nan,
                 is_subnormal = all_ones_if(a < 0x38800000u);
  const uint32_t magnitude = (0x7E00u & is_nan) | (0x7C00u & is_inf) | (subnormal & is_subnormal) |
                             (normal & ~(is_nan | is_inf | is_subnormal));
  dst.x = static_cast<uint16_t>(((u >> 16) & 0x8000u) | magnitude);
}

// A block's conversions, each one simple loop (T is c10::BFloat16 or c10::Half).
template <typename T>
void widen(const T* src, float* dst, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] = widened(src[i]);
}

template <typename T>
void narrow(const float* src, T* dst, int64_t count) {
  for (int64_t i = 0; i < count; ++i) narrow_to(dst[i], src[i]);
}

// One AdamW update of float32 elements [begin, end): every element is read once and written once, in registers
// between. always_inline: the loop must be compiled inside each of the two copies below, for each one's
// instruction set (a call would run the baseline's code in both).
__attribute__((always_inline)) inline void adamw_loop(float* p, const float* g, float* m, float* v, int64_t begin,
                                                      int64_t end, const Coefficients& c, bool decay) {
  const Vec decay_v(c.decay), beta1(c.beta1), one_minus_beta1(c.one_minus_beta1), beta2(c.beta2),
      one_minus_beta2(c.one_minus_beta2), sqrt_bc2(c.sqrt_bias_correction2), eps(c.eps), neg_step_size(c.neg_step_size),
      multiplier(c.grad_multiplier);
  const bool unscale = c.grad_multiplier != 1.0f;  // x * 1 is x, NaN and inf included: skip the multiply
  constexpr int64_t kLanes = Vec::size();
  for (int64_t i = begin; i < end; i += kLanes) {
    const int64_t n = std::min(kLanes, end - i);  // the last vector of the range may be partial
    Vec param = load(p + i, n);
    Vec grad = load(g + i, n);
    if (unscale) grad = grad * multiplier;  // in a register: the scaled gradient in memory is left as it is
    Vec exp_avg = load(m + i, n);
    Vec exp_avg_sq = load(v + i, n);
    // Decoupled weight decay first, on the parameter itself (not added to the gradient), as AdamW does.
    if (decay) param = param * decay_v;
    // The same operations in the same order as torch::optim::AdamW, so that float32 results agree to rounding.
    exp_avg = exp_avg * beta1 + one_minus_beta1 * grad;
    exp_avg_sq = exp_avg_sq * beta2 + one_minus_beta2 * grad * grad;
    const Vec denom = exp_avg_sq.sqrt() / sqrt_bc2 + eps;
    param = param + neg_step_size * exp_avg / denom;
    store(p + i, param, n);
    store(m + i, exp_avg, n);
    store(v + i, exp_avg_sq, n);
  }
}

// The same update with a 16-bit parameter and gradient (T is c10::BFloat16 or c10::Half): block by block, widened
// into float32, the float32 loop above on the block (the state is float32 already: it is updated where it lies),
// and the parameter narrowed back. The gradient is only read. The last block of a range may be partial: only its
// `count` elements are converted, read or written.
template <typename T>
__attribute__((always_inline)) inline void adamw_loop(T* p, const T* g, float* m, float* v, int64_t begin, int64_t end,
                                                      const Coefficients& c, bool decay) {
  float param[kBlock], grad[kBlock];
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t count = std::min(kBlock, end - b);
    widen(p + b, param, count);
    widen(g + b, grad, count);
    adamw_loop(param, grad, m + b, v + b, 0, count, c, decay);
    narrow(param, p + b, count);
  }
}

// The loop compiled twice, as ATen compiles its CPU kernels once per CPU_CAPABILITY: for the baseline of the
// architecture (the file's flags: SSE2 on x86-64, 4 float lanes per instruction) and, on x86-64, for AVX2 with FMA
// (8 lanes: Vectorized<float> is 8 floats in a small array, which gcc turns into one 256-bit instruction where
// the function's target allows it). cpu_isa() picks one at run time; a CPU without AVX2 never enters the second.
// KERNEL_COPTS' -ffp-contract=off keeps a * b + c two roundings in both (FMA would round once), so that the two
// give the same bits, as the checks ask. flatten: every call in the copy is inlined into it, Vectorized's operators
// included. Without it gcc chose per copy: in one build the AVX2 float32 copy called `param * decay_v` out of line
// (a call per vector, its result passed through memory) and ran 3.3 times slower than the same copy inlined
// (docs/results/lesson6_experiments.md, 2026-12-06 23:20).
template <typename T>
__attribute__((flatten)) void adamw_loop_baseline(T* p, const T* g, float* m, float* v, int64_t begin, int64_t end,
                                                  const Coefficients& c, bool decay) {
  note_loop_copy(CpuIsa::kBaseline);  // given: lets a check see which copy ran (one call per range)
  adamw_loop(p, g, m, v, begin, end, c, decay);
}

#if defined(__x86_64__) && defined(__GNUC__)
template <typename T>
__attribute__((target("avx2,fma"), flatten)) void adamw_loop_avx2(T* p, const T* g, float* m, float* v, int64_t begin,
                                                                  int64_t end, const Coefficients& c, bool decay) {
  note_loop_copy(CpuIsa::kAvx2);
  adamw_loop(p, g, m, v, begin, end, c, decay);
}
#endif

// Elements [begin, end) with the copy of the loop that c.isa names.
template <typename T>
void adamw_range(T* p, const T* g, float* m, float* v, int64_t begin, int64_t end, const Coefficients& c, bool decay) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (c.isa == CpuIsa::kAvx2) return adamw_loop_avx2(p, g, m, v, begin, end, c, decay);
#endif
  adamw_loop_baseline(p, g, m, v, begin, end, c, decay);
}

// The work is cut into pieces of kChunk elements, the same pieces whatever the number of threads (so a run with
// one thread exercises the same boundaries as a run with many); at::parallel_for hands them out, a few per thread.
constexpr int64_t kChunk = 32768;  // 128 KiB of float32 per tensor: enough to amortise starting a piece

template <typename F>
void for_each_chunk(int64_t total, const F& f) {
  const int64_t chunks = (total + kChunk - 1) / kChunk;
  at::parallel_for(0, chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t k = first; k < last; ++k) f(k * kChunk, std::min(total, (k + 1) * kChunk));
  });
}

template <typename T>
void adamw_all(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
               const Coefficients& c, bool decay) {
  T* p = param.data_ptr<T>();
  const T* g = grad.data_ptr<T>();
  float* m = exp_avg.data_ptr<float>();
  float* v = exp_avg_sq.data_ptr<float>();
  // One parallel region over the tensor.
  for_each_chunk(param.numel(), [&](int64_t begin, int64_t end) { adamw_range(p, g, m, v, begin, end, c, decay); });
}

}  // namespace

void adamw_kernel_cpu(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                      const AdamWHyper& hyper, int64_t step, float grad_multiplier) {
  if (param.numel() == 0) return;
  const Coefficients c = coefficients(hyper, step, grad_multiplier);
  const bool decay = hyper.weight_decay != 0;  // torch::optim::AdamW skips the multiply by 1 as well
  switch (param.scalar_type()) {
    case c10::ScalarType::Float:
      adamw_all<float>(param, grad, exp_avg, exp_avg_sq, c, decay);
      break;
    case c10::ScalarType::BFloat16:
      adamw_all<c10::BFloat16>(param, grad, exp_avg, exp_avg_sq, c, decay);
      break;
    case c10::ScalarType::Half:
      adamw_all<c10::Half>(param, grad, exp_avg, exp_avg_sq, c, decay);
      break;
    default:
      TORCH_CHECK(false, "adamw_kernel_cpu: unsupported dtype ", param.scalar_type());
  }
}
// [kernel]

// [check_args]
namespace {

// Whether the bytes of two contiguous tensors share an address.
bool overlap(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const char* a0 = static_cast<const char*>(a.data_ptr());
  const char* b0 = static_cast<const char*>(b.data_ptr());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// The rules on the step and the hyper-parameters, under `op`'s name: the single operator's last rules, and the
// multi-tensor operator's first (so that an empty list is checked too).
void check_step_and_hyper(const char* op, const AdamWHyper& hyper, int64_t step) {
  TORCH_CHECK(step >= 1, op, ": step must be >= 1, got ", step);
  TORCH_CHECK(hyper.lr >= 0, op, ": lr must be >= 0, got ", hyper.lr);  // NaN fails each of these too
  TORCH_CHECK(hyper.eps >= 0, op, ": eps must be >= 0, got ", hyper.eps);
  TORCH_CHECK(hyper.weight_decay >= 0, op, ": weight_decay must be >= 0, got ", hyper.weight_decay);
  TORCH_CHECK(hyper.beta1 >= 0 && hyper.beta1 < 1, op, ": beta1 must be in [0, 1), got ", hyper.beta1);
  TORCH_CHECK(hyper.beta2 >= 0 && hyper.beta2 < 1, op, ": beta2 must be in [0, 1), got ", hyper.beta2);
}

}  // namespace

void check_adamw_args(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                      const at::Tensor& exp_avg_sq, const AdamWHyper& hyper, int64_t step) {
  const at::Tensor* tensors[] = {&param, &grad, &exp_avg, &exp_avg_sq};
  const char* names[] = {"param", "grad", "exp_avg", "exp_avg_sq"};
  for (int i = 0; i < 4; ++i) TORCH_CHECK(tensors[i]->defined(), "fused_adamw_: ", names[i], " is undefined");
  TORCH_CHECK(grad.sizes() == param.sizes() && exp_avg.sizes() == param.sizes() && exp_avg_sq.sizes() == param.sizes(),
              "fused_adamw_: param, grad, exp_avg and exp_avg_sq must have the same shape, got ", param.sizes(), ", ",
              grad.sizes(), ", ", exp_avg.sizes(), ", ", exp_avg_sq.sizes());
  const c10::ScalarType dtype = param.scalar_type();
  TORCH_CHECK(dtype == c10::ScalarType::Float || dtype == c10::ScalarType::BFloat16 || dtype == c10::ScalarType::Half,
              "fused_adamw_: param must be float32, bfloat16 or float16, got ", dtype);
  TORCH_CHECK(grad.scalar_type() == dtype, "fused_adamw_: grad must have param's dtype (", dtype, "), got ",
              grad.scalar_type());
  TORCH_CHECK(exp_avg.scalar_type() == c10::ScalarType::Float && exp_avg_sq.scalar_type() == c10::ScalarType::Float,
              "fused_adamw_: exp_avg and exp_avg_sq must be float32, got ", exp_avg.scalar_type(), " and ",
              exp_avg_sq.scalar_type());
  TORCH_CHECK(grad.device() == param.device() && exp_avg.device() == param.device() &&
                  exp_avg_sq.device() == param.device(),
              "fused_adamw_: all tensors must be on one device, got ", param.device(), ", ", grad.device(), ", ",
              exp_avg.device(), ", ", exp_avg_sq.device());
  // The kernel walks raw pointers from 0 to numel: a strided view would be read and written in the wrong places.
  for (int i = 0; i < 4; ++i) {
    TORCH_CHECK(tensors[i]->is_contiguous(), "fused_adamw_: ", names[i], " is not contiguous");
  }
  // One pass reads and writes each element once: if two operands share memory, one's write changes the other's
  // input halfway through the pass.
  for (int i = 0; i < 4; ++i) {
    for (int j = i + 1; j < 4; ++j) {
      TORCH_CHECK(!overlap(*tensors[i], *tensors[j]), "fused_adamw_: ", names[i], " and ", names[j],
                  " overlap in memory");
    }
  }
  check_step_and_hyper("fused_adamw_", hyper, step);
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
// The schema makes the operator known by name; the (a!) annotations say which arguments it writes in place.
TORCH_LIBRARY(workshop, m) { m.def(fusion::kOpSchema); }

// The CPU kernel behind it. A CUDA kernel would be one more TORCH_LIBRARY_IMPL(workshop, CUDA, m).
TORCH_LIBRARY_IMPL(workshop, CPU, m) { m.impl("fused_adamw_", TORCH_FN(fusion::fused_adamw_cpu)); }
// [register]

namespace fusion {

// [multi_kernel]
namespace {

// The tensors laid end to end: tensor i holds elements [offsets[i], offsets[i + 1]).
std::vector<int64_t> end_to_end(c10::ArrayRef<at::Tensor> tensors) {
  std::vector<int64_t> offsets(tensors.size() + 1, 0);
  for (size_t i = 0; i < tensors.size(); ++i) offsets[i + 1] = offsets[i] + tensors[i].numel();
  return offsets;
}

// Calls f(t, lo, hi) for each tensor t that elements [begin, end) of the tensors laid end to end cover, with the
// part [lo, hi) of its own elements: a piece may cover the end of one tensor and the start of the next.
template <typename F>
void for_each_part(const std::vector<int64_t>& offsets, int64_t begin, int64_t end, const F& f) {
  const size_t count = offsets.size() - 1;
  size_t t = std::upper_bound(offsets.begin(), offsets.end(), begin) - offsets.begin() - 1;  // holds `begin`
  for (; t < count && offsets[t] < end; ++t) {
    const int64_t lo = std::max(begin, offsets[t]) - offsets[t];
    const int64_t hi = std::min(end, offsets[t + 1]) - offsets[t];
    if (lo < hi) f(t, lo, hi);
  }
}

// Step 2's loop on elements [lo, hi) of one tuple, for the tuple's dtype.
void update_part(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                 const at::Tensor& exp_avg_sq, int64_t lo, int64_t hi, const Coefficients& c, bool decay) {
  float* m = exp_avg.data_ptr<float>();
  float* v = exp_avg_sq.data_ptr<float>();
  switch (param.scalar_type()) {
    case c10::ScalarType::Float:
      return adamw_range(param.data_ptr<float>(), grad.data_ptr<float>(), m, v, lo, hi, c, decay);
    case c10::ScalarType::BFloat16:
      return adamw_range(param.data_ptr<c10::BFloat16>(), grad.data_ptr<c10::BFloat16>(), m, v, lo, hi, c, decay);
    case c10::ScalarType::Half:
      return adamw_range(param.data_ptr<c10::Half>(), grad.data_ptr<c10::Half>(), m, v, lo, hi, c, decay);
    default:
      TORCH_CHECK(false, "adamw_multi_kernel_cpu: unsupported dtype ", param.scalar_type());
  }
}

}  // namespace

void adamw_multi_kernel_cpu(c10::ArrayRef<at::Tensor> params, c10::ArrayRef<at::Tensor> grads,
                            c10::ArrayRef<at::Tensor> exp_avgs, c10::ArrayRef<at::Tensor> exp_avg_sqs,
                            const AdamWHyper& hyper, int64_t step, float grad_multiplier) {
  const std::vector<int64_t> offsets = end_to_end(params);
  if (offsets.back() == 0) return;
  const Coefficients c = coefficients(hyper, step, grad_multiplier);
  const bool decay = hyper.weight_decay != 0;
  // One parallel region for the whole list.
  for_each_chunk(offsets.back(), [&](int64_t begin, int64_t end) {
    for_each_part(offsets, begin, end, [&](size_t t, int64_t lo, int64_t hi) {
      update_part(params[t], grads[t], exp_avgs[t], exp_avg_sqs[t], lo, hi, c, decay);
    });
  });
}
// [multi_kernel]

// [multi_check_args]
namespace {

// Fails with "<op>: a[i] and b[j] overlap in memory" if any two non-empty tensors of the lists share bytes (the
// lists' names in `names`). Sorted by start address, two ranges overlap somewhere only if two neighbours do.
void check_disjoint(const char* op, c10::ArrayRef<c10::ArrayRef<at::Tensor>> lists, c10::ArrayRef<const char*> names) {
  struct Range {
    const char* begin;
    const char* end;
    size_t list, index;  // lists[list][index]: named only in an error, so a call that passes formats no string
  };
  std::vector<Range> ranges;
  for (size_t l = 0; l < lists.size(); ++l) {
    for (size_t i = 0; i < lists[l].size(); ++i) {
      const at::Tensor& t = lists[l][i];
      if (t.numel() == 0) continue;
      const char* start = static_cast<const char*>(t.data_ptr());
      ranges.push_back({start, start + t.nbytes(), l, i});
    }
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t k = 1; k < ranges.size(); ++k) {
    const Range& a = ranges[k];
    const Range& b = ranges[k - 1];
    TORCH_CHECK(ranges[k].begin >= ranges[k - 1].end, op, ": ", names[a.list], "[", a.index, "] and ", names[b.list],
                "[", b.index, "] overlap in memory");
  }
}

}  // namespace

void check_adamw_multi_args(c10::ArrayRef<at::Tensor> params, c10::ArrayRef<at::Tensor> grads,
                            c10::ArrayRef<at::Tensor> exp_avgs, c10::ArrayRef<at::Tensor> exp_avg_sqs,
                            const AdamWHyper& hyper, int64_t step) {
  check_step_and_hyper("fused_adamw_multi_", hyper, step);  // first: an empty list has no tuple to check them
  TORCH_CHECK(grads.size() == params.size() && exp_avgs.size() == params.size() && exp_avg_sqs.size() == params.size(),
              "fused_adamw_multi_: the lists must have one length, got ", params.size(), ", ", grads.size(), ", ",
              exp_avgs.size(), ", ", exp_avg_sqs.size());
  for (size_t i = 0; i < params.size(); ++i) {
    try {
      check_adamw_args(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], hyper, step);
    } catch (const c10::Error& error) {
      TORCH_CHECK(false, "fused_adamw_multi_: tensor ", i, ": ", error.what_without_backtrace());
    }
  }
  // Each tuple is on one device (check_adamw_args); all of them on the first one's, before anything is written:
  // a kernel for one device cannot read another's memory.
  for (size_t i = 1; i < params.size(); ++i) {
    TORCH_CHECK(params[i].device() == params[0].device(), "fused_adamw_multi_: all tensors must be on one device, ",
                "tensor ", i, " is on ", params[i].device(), ", tensor 0 on ", params[0].device());
  }
  // Within a tuple check_adamw_args looked; across tuples: no two of all the tensors may share bytes.
  const c10::ArrayRef<at::Tensor> lists[] = {params, grads, exp_avgs, exp_avg_sqs};
  check_disjoint("fused_adamw_multi_", lists, {"params", "grads", "exp_avgs", "exp_avg_sqs"});
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
// A second operator in the same namespace: a fragment adds to the one TORCH_LIBRARY.
TORCH_LIBRARY_FRAGMENT(workshop, m) { m.def(fusion::kMultiOpSchema); }

TORCH_LIBRARY_IMPL(workshop, CPU, m) { m.impl("fused_adamw_multi_", TORCH_FN(fusion::fused_adamw_multi_cpu)); }
// [register_multi]

namespace fusion {

// [unscale_kernel]
namespace {

// Unscales elements [lo, hi) of one gradient in place; returns whether any of them, before the multiply, was inf
// or NaN. x - x is 0 for every finite x and NaN for inf and NaN, so a running sum of (x - x) over the lanes stays
// 0 exactly when every element read was finite: one subtraction and one addition per vector, no branch.
bool unscale_range(float* g, int64_t lo, int64_t hi, float inv_scale) {
  const Vec inv(inv_scale);
  Vec non_finite(0.0f);
  constexpr int64_t kLanes = Vec::size();
  for (int64_t i = lo; i < hi; i += kLanes) {
    const int64_t n = std::min(kLanes, hi - i);  // the last vector may be partial (load fills the rest with 0)
    const Vec x = load(g + i, n);
    non_finite = non_finite + (x - x);
    if (inv_scale != 1.0f) store(g + i, x * inv, n);  // ATen's kernel leaves the values alone for a scale of 1
  }
  float lanes[Vec::size()];
  non_finite.store(lanes);
  for (float lane : lanes) {
    if (lane != 0.0f) return true;  // NaN compares unequal to everything
  }
  return false;
}

// A 16-bit gradient: block by block through a float32 array, as step 2's kernel does; written back only when
// something was multiplied.
template <typename T>
bool unscale_range(T* g, int64_t lo, int64_t hi, float inv_scale) {
  float block[kBlock];
  bool found = false;
  for (int64_t b = lo; b < hi; b += kBlock) {
    const int64_t count = std::min(kBlock, hi - b);
    widen(g + b, block, count);
    found = unscale_range(block, 0, count, inv_scale) || found;
    if (inv_scale != 1.0f) narrow(block, g + b, count);
  }
  return found;
}

bool unscale_part(const at::Tensor& grad, int64_t lo, int64_t hi, float inv_scale) {
  switch (grad.scalar_type()) {
    case c10::ScalarType::Float:
      return unscale_range(grad.data_ptr<float>(), lo, hi, inv_scale);
    case c10::ScalarType::BFloat16:
      return unscale_range(grad.data_ptr<c10::BFloat16>(), lo, hi, inv_scale);
    case c10::ScalarType::Half:
      return unscale_range(grad.data_ptr<c10::Half>(), lo, hi, inv_scale);
    default:
      TORCH_CHECK(false, "unscale_kernel_cpu: unsupported dtype ", grad.scalar_type());
  }
}

}  // namespace

void unscale_kernel_cpu(c10::ArrayRef<at::Tensor> grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  const std::vector<int64_t> offsets = end_to_end(grads);  // as in step 4
  if (offsets.back() == 0) return;
  const float inv = *inv_scale.data_ptr<float>();  // read once, before the parallel region
  // One flag per piece, each written by the one thread that runs the piece; found_inf is written once, after.
  std::vector<char> piece_found(static_cast<size_t>((offsets.back() + kChunk - 1) / kChunk), 0);
  for_each_chunk(offsets.back(), [&](int64_t begin, int64_t end) {
    bool found = false;
    for_each_part(offsets, begin, end,
                  [&](size_t t, int64_t lo, int64_t hi) { found = unscale_part(grads[t], lo, hi, inv) || found; });
    piece_found[static_cast<size_t>(begin / kChunk)] = found ? 1 : 0;
  });
  if (std::find(piece_found.begin(), piece_found.end(), 1) != piece_found.end()) *found_inf.data_ptr<float>() = 1.0f;
}
// [unscale_kernel]

// [unscale_check_args]
void check_unscale_args(c10::ArrayRef<at::Tensor> grads, const at::Tensor& found_inf, const at::Tensor& inv_scale) {
  TORCH_CHECK(found_inf.defined() && found_inf.numel() == 1 && found_inf.scalar_type() == c10::ScalarType::Float,
              "fused_unscale_: found_inf must be a defined one-element float32 tensor",
              found_inf.defined() ? ", got " + std::to_string(found_inf.numel()) + " element(s) of " +
                                        std::string(c10::toString(found_inf.scalar_type()))
                                  : std::string(", got an undefined tensor"));
  TORCH_CHECK(inv_scale.defined() && inv_scale.numel() == 1 && inv_scale.scalar_type() == c10::ScalarType::Float,
              "fused_unscale_: inv_scale must be a defined one-element float32 tensor",
              inv_scale.defined() ? ", got " + std::to_string(inv_scale.numel()) + " element(s) of " +
                                        std::string(c10::toString(inv_scale.scalar_type()))
                                  : std::string(", got an undefined tensor"));
  TORCH_CHECK(found_inf.device() == inv_scale.device(),
              "fused_unscale_: found_inf and inv_scale must be on one device, got ", found_inf.device(), " and ",
              inv_scale.device());
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& g = grads[i];
    TORCH_CHECK(g.defined(), "fused_unscale_: grad ", i, " is undefined");
    const c10::ScalarType dtype = g.scalar_type();
    TORCH_CHECK(dtype == c10::ScalarType::Float || dtype == c10::ScalarType::BFloat16 || dtype == c10::ScalarType::Half,
                "fused_unscale_: grad ", i, " must be float32, bfloat16 or float16, got ", dtype);
    TORCH_CHECK(g.device() == found_inf.device(), "fused_unscale_: grad ", i, " is not on found_inf's device (",
                found_inf.device(), "), got ", g.device());
    TORCH_CHECK(g.is_contiguous(), "fused_unscale_: grad ", i, " is not contiguous");
  }
  // Two gradients that share bytes would have them multiplied twice: step 4's check over the one list.
  check_disjoint("fused_unscale_", {grads}, {"grads"});
}
// [unscale_check_args]

void fused_unscale_cpu(c10::ArrayRef<at::Tensor> grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  check_unscale_args(grads, found_inf, inv_scale);
  unscale_kernel_cpu(grads, found_inf, inv_scale);
}

// [scaler_gate]
namespace {

void check_scaler_tensor(const char* op, const char* name, c10::Device device, const at::Tensor& t) {
  TORCH_CHECK(t.numel() == 1 && t.scalar_type() == c10::ScalarType::Float, op, ": ", name,
              " must be a one-element float32 tensor, got ", t.numel(), " element(s) of ", t.scalar_type());
  TORCH_CHECK(t.device() == device, op, ": ", name, " is not on param's device (", device, "), got ", t.device());
}

}  // namespace

void check_scaler_args(const char* op, c10::Device device, int64_t step, const c10::optional<at::Tensor>& grad_scale,
                       const c10::optional<at::Tensor>& found_inf, const c10::optional<at::Tensor>& state_step) {
  if (is_given(grad_scale)) check_scaler_tensor(op, "grad_scale", device, *grad_scale);
  if (is_given(found_inf)) check_scaler_tensor(op, "found_inf", device, *found_inf);
  if (is_given(state_step)) {
    check_scaler_tensor(op, "state_step", device, *state_step);
    // A host count passed beside the device's would be ignored: refused instead.
    TORCH_CHECK(step == 0, op, ": step must be 0 when state_step is given, got ", step);
  }
}

ScalerGate scaler_gate_cpu(const char* op, c10::Device device, int64_t step,
                           const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf,
                           const c10::optional<at::Tensor>& state_step) {
  check_scaler_args(op, device, step, grad_scale, found_inf, state_step);
  ScalerGate gate;
  gate.step = step;
  // Any flag that is not 0 skips (ATen's kernel skips on exactly 1): a flag summed over ranks counts too.
  gate.skip = is_given(found_inf) && *found_inf->data_ptr<float>() != 0.0f;
  if (gate.skip) return gate;
  if (is_given(state_step)) {  // the steps taken so far: this one is the next
    const float taken = *state_step->data_ptr<float>();
    TORCH_CHECK(taken >= 0 && taken < 16777216.0f && taken == std::floor(taken), op,
                ": state_step must hold a whole number in [0, 2^24), got ", taken);
    gate.step = static_cast<int64_t>(taken) + 1;
  }
  if (!is_given(grad_scale)) return gate;
  const float scale = *grad_scale->data_ptr<float>();
  TORCH_CHECK(std::isfinite(scale) && scale > 0, op, ": grad_scale must be finite and > 0, got ", scale);
  gate.grad_multiplier = static_cast<float>(1.0 / static_cast<double>(scale));  // GradScaler's inv_scale, exactly
  // A positive subnormal scale passes the rule above, but its inverse overflows float32: every update would be inf.
  TORCH_CHECK(std::isfinite(gate.grad_multiplier), op, ": grad_scale's inverse must be finite, got ", scale);
  return gate;
}
// [scaler_gate]

}  // namespace fusion

// [register_unscale]
// Lesson 1's GradScaler looks this name up in the dispatcher (amp::unscale_grads_fused): any binary that links
// this library gets its fused path.
TORCH_LIBRARY_FRAGMENT(workshop, m) { m.def(fusion::kUnscaleOpSchema); }

TORCH_LIBRARY_IMPL(workshop, CPU, m) { m.impl("fused_unscale_", TORCH_FN(fusion::fused_unscale_cpu)); }
// [register_unscale]

namespace fusion {
namespace cuda {

// [launch_shape]
LaunchShape launch_shape(int64_t numel, int vector_width, int multiprocessors) {
  TORCH_CHECK(numel >= 0, "launch_shape: numel must be >= 0, got ", numel);
  TORCH_CHECK(vector_width == 1 || vector_width == 2 || vector_width == 4 || vector_width == 8,
              "launch_shape: vector_width must be 1, 2, 4 or 8, got ", vector_width);
  TORCH_CHECK(multiprocessors >= 1, "launch_shape: multiprocessors must be >= 1, got ", multiprocessors);
  LaunchShape shape;
  shape.threads = kThreadsPerBlock;
  const int64_t packs = (numel + vector_width - 1) / vector_width;  // a partial last pack still needs a thread
  const int64_t wanted = (packs + kThreadsPerBlock - 1) / kThreadsPerBlock;
  shape.blocks = std::min(wanted, static_cast<int64_t>(multiprocessors) * kBlocksPerMultiprocessor);
  return shape;
}
// [launch_shape]

}  // namespace cuda
}  // namespace fusion
