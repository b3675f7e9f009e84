// Lesson 6's checks share these: the AdamW state and its oracle (torch::optim::AdamW), tolerances, ATen threads and
// the counter of OpenMP parallel regions, tensors against an unreadable page, and the seeded lists and scaler
// tensors of steps 4 and 5. One check file per step includes it (fused_adamw_step1_test.cc ...
// fused_adamw_step6_test.cc); run them all with bazel test //lesson6_fusion:all.
// The oracle is LibTorch's own torch::optim::AdamW, and the one-op-at-a-time step of given.cc that follows it.
#pragma once

#include "tests/torch_doctest.h"

#include <dlfcn.h>     // dlsym(RTLD_NEXT, ...): the OpenMP runtime's GOMP_parallel, behind the counter below
#include <sys/mman.h>  // mmap, mprotect: tensors that end at an inaccessible page (guarded_copy below)
#include <unistd.h>    // sysconf(_SC_PAGESIZE)

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/StreamGuard.h>            // the GPU cases: a non-default current stream, without CUDA headers
#include <c10/core/impl/VirtualGuardImpl.h>  // (the device-generic stream API: builds where LibTorch has no CUDA)
#include <torch/torch.h>

#include "lesson6_fusion/fused_adamw.h"
#include "common/memory_meter.h"
#include "lesson1_amp/grad_scaler.h"
#include "tests/check_helpers.h"


namespace adamw_checks {

using doctest::Contains;
using workshop::test::rel_error;


// The state of one parameter under AdamW: the parameter, its two moments and the step counter.
struct State {
  torch::Tensor param, exp_avg, exp_avg_sq;
  int64_t step = 0;
};

inline State make_state(torch::Tensor param) {
  State s;
  s.param = param;
  s.exp_avg = torch::zeros(param.sizes(), torch::kFloat);
  s.exp_avg_sq = torch::zeros(param.sizes(), torch::kFloat);
  return s;
}

// A fixed sequence of gradients for `numel` parameters, `scale` times a standard normal.
inline std::vector<torch::Tensor> gradients(int64_t numel, int steps, double scale, uint64_t seed = 11) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> out;
  for (int i = 0; i < steps; ++i) out.push_back(torch::randn({numel}) * scale);
  return out;
}

// The largest rel_error of the fused parameter against torch::optim::AdamW's over `grads`, one step each.
inline double worst_vs_torch(const fusion::AdamWHyper& hyper, const std::vector<torch::Tensor>& grads, int64_t numel) {
  torch::manual_seed(3);
  const torch::Tensor start = torch::randn({numel});
  torch::Tensor reference = start.clone().requires_grad_(true);
  torch::optim::AdamW optimizer({reference}, fusion::adamw_options(hyper));
  State fused = make_state(start.clone());
  double worst = 0;
  for (const torch::Tensor& grad : grads) {
    reference.mutable_grad() = grad.clone();
    optimizer.step();
    fusion::adamw_kernel_cpu(fused.param, grad, fused.exp_avg, fused.exp_avg_sq, hyper, ++fused.step);
    worst = std::max(worst, rel_error({fused.param}, {reference.detach()}));
  }
  return worst;
}

// Steps `fused` with the kernel and `plain` with the given unfused step on the same gradients; the worst rel_error of
// the parameter and of each moment.
struct Worst {
  double param = 0, exp_avg = 0, exp_avg_sq = 0;
};
inline Worst run_side_by_side(State& fused, State& plain, const fusion::AdamWHyper& hyper,
                              const std::vector<torch::Tensor>& grads, bool through_dispatcher) {
  Worst worst;
  for (const torch::Tensor& grad : grads) {
    ++fused.step;
    if (through_dispatcher) {
      fusion::fused_adamw_(fused.param, grad, fused.exp_avg, fused.exp_avg_sq, hyper, fused.step);
    } else {
      fusion::adamw_kernel_cpu(fused.param, grad, fused.exp_avg, fused.exp_avg_sq, hyper, fused.step);
    }
    fusion::unfused_adamw_step(plain.param, grad, plain.exp_avg, plain.exp_avg_sq, hyper, ++plain.step);
    worst.param = std::max(worst.param, rel_error({fused.param}, {plain.param}));
    worst.exp_avg = std::max(worst.exp_avg, rel_error({fused.exp_avg}, {plain.exp_avg}));
    worst.exp_avg_sq = std::max(worst.exp_avg_sq, rel_error({fused.exp_avg_sq}, {plain.exp_avg_sq}));
  }
  return worst;
}

inline fusion::AdamWHyper hyper_with(double lr, double weight_decay, double eps = 1e-8) {
  fusion::AdamWHyper h;
  h.lr = lr;
  h.weight_decay = weight_decay;
  h.eps = eps;
  return h;
}

inline constexpr double kFloatTolerance = 1e-6;  // float32: the same ops in the same order, so rounding only

// at::set_num_threads(n) for one scope: the checks run the kernels with several ATen threads, where pieces that
// share anything (a scratch buffer, a flag) would race.
class ThreadsFor {
 public:
  explicit ThreadsFor(int n) : saved_(at::get_num_threads()) { at::set_num_threads(n); }
  ~ThreadsFor() { at::set_num_threads(saved_); }

 private:
  int saved_;
};

// Makes the kernels use instruction set `isa` (given code's set_cpu_isa) while it lives, then the one before.
class IsaFor {
 public:
  explicit IsaFor(fusion::CpuIsa isa) : saved_(fusion::cpu_isa()) { fusion::set_cpu_isa(isa); }
  ~IsaFor() { fusion::set_cpu_isa(saved_); }

 private:
  fusion::CpuIsa saved_;
};

// Whether this CPU runs the AVX2 copy of the reference's loop (else the checks that compare the two say why they
// are skipped).
inline bool has_avx2_copy() {
  if (fusion::best_cpu_isa() == fusion::CpuIsa::kAvx2) return true;
  MESSAGE("skipped: this CPU has no AVX2 with FMA, so the kernels have one instruction set to compare");
  return false;
}

// The runs of each copy of the kernels' loop while `f` runs (given code's note_loop_copy): (baseline, avx2).
template <typename F>
inline std::pair<int64_t, int64_t> copies_run_by(const F& f) {
  const int64_t before[2] = {fusion::loop_copies_run(fusion::CpuIsa::kBaseline),
                             fusion::loop_copies_run(fusion::CpuIsa::kAvx2)};
  f();
  return {fusion::loop_copies_run(fusion::CpuIsa::kBaseline) - before[0],
          fusion::loop_copies_run(fusion::CpuIsa::kAvx2) - before[1]};
}

// The OpenMP parallel regions entered while counting: LibTorch's OpenMP build enters one per at::parallel_for
// that runs on several threads (GCC turns `#pragma omp parallel` into a call of libgomp's GOMP_parallel, which the
// test binary's own definition below counts and forwards).
inline std::atomic<bool> g_counting{false};
inline std::atomic<int> g_regions{0};

// How many parallel regions `f` enters.
template <typename F>
inline int parallel_regions(const F& f) {
  struct Counting {
    Counting() {
      g_regions = 0;
      g_counting = true;
    }
    ~Counting() { g_counting = false; }
  } counting;
  f();
  return g_regions;
}

// Whether regions can be counted here: an ATen op over 2^20 elements on 2 threads enters one (none where LibTorch
// has no OpenMP, or where this binary's GOMP_parallel is not the one LibTorch calls).
inline bool regions_are_counted() {
  const ThreadsFor threads(2);
  torch::Tensor x = torch::zeros({1 << 20});
  return parallel_regions([&] { x.add_(1); }) > 0;
}

// A copy of `values` whose last byte is the last one before a page that may be neither read nor written: a kernel
// that reads or writes even one element past the end of the tensor crashes at that access (SIGSEGV), in every
// build. (Heap memory has no such wall: a read past the end returns whatever lies there and a write corrupts it
// silently, or much later.) With --config=asan the report also names the line.
inline torch::Tensor guarded_copy(const torch::Tensor& values) {
  const size_t bytes = values.nbytes();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t body = (bytes + page - 1) / page * page;
  const size_t length = body + page;
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(base != MAP_FAILED);
  char* wall = static_cast<char*>(base) + body;
  REQUIRE(mprotect(wall, page, PROT_NONE) == 0);
  torch::Tensor out = torch::from_blob(
      wall - bytes, values.sizes(), [base, length](void*) { munmap(base, length); }, values.options());
  out.copy_(values);
  return out;
}

// A copy of `values` that starts `offset` elements into `buffer` (made here: 0.5 everywhere else), with one guard
// element after it: a view that starts mid-vector or mid-pack when offset is not a multiple of it.
inline torch::Tensor view_in_buffer(const torch::Tensor& values, int64_t offset, torch::Tensor& buffer) {
  const int64_t n = values.numel();
  buffer = torch::full({offset + n + 1}, 0.5, values.options());
  torch::Tensor view = buffer.narrow(0, offset, n);
  view.copy_(values);
  return view;
}

// Views of one flat buffer of `dtype` (made here, 0.5 everywhere else), one after the other from element `offset`,
// of `sizes` elements, holding `values` (one tensor per size): tensors that touch, each one's first element right
// after the last of the one before. One guard element after the last.
inline std::vector<torch::Tensor> touching_views(const std::vector<torch::Tensor>& values, int64_t offset,
                                                 torch::Tensor& buffer) {
  int64_t total = offset;
  for (const torch::Tensor& v : values) total += v.numel();
  buffer = torch::full({total + 1}, 0.5, values.at(0).options());
  std::vector<torch::Tensor> views;
  int64_t at = offset;
  for (const torch::Tensor& v : values) {
    views.push_back(buffer.narrow(0, at, v.numel()));
    views.back().copy_(v);
    at += v.numel();
  }
  return views;
}

// The sizes whose tails a kernel may get wrong: every remainder after full vectors of 8 float lanes (AVX2's
// Vectorized<float>::size()) and after packs of 4, small tensors, and tensors one piece (32768 elements) and a few
// more long.
inline std::vector<int64_t> tail_sizes() {
  std::vector<int64_t> sizes;
  for (int64_t n = 1; n <= 17; ++n) sizes.push_back(n);
  for (int64_t r : {1, 5, 7}) sizes.push_back(32768 + r);
  return sizes;
}

// Parameters of assorted sizes and dtypes, as a model has them (an empty one included), with float32 state.
struct Lists {
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
};

inline Lists make_lists(uint64_t seed) {
  torch::manual_seed(seed);
  Lists l;
  const std::vector<std::pair<int64_t, torch::ScalarType>> shapes = {{40000, torch::kFloat},  {1, torch::kFloat},
                                                                     {0, torch::kFloat},      {7, torch::kBFloat16},
                                                                     {100003, torch::kFloat}, {33, torch::kHalf},
                                                                     {5000, torch::kBFloat16}};
  for (const auto& [numel, dtype] : shapes) {
    l.params.push_back(torch::randn({numel}).to(dtype));
    l.grads.push_back(torch::randn({numel}).to(dtype));
    l.exp_avgs.push_back(torch::zeros({numel}));
    l.exp_avg_sqs.push_back(torch::zeros({numel}));
  }
  return l;
}

// Gradients as a model has them (an empty one, sizes across the 32768-element pieces, 16-bit ones), each
// value a scaled gradient: a power of two times a normal sample, so unscaling by a power of two is exact.
inline std::vector<torch::Tensor> scaled_grads(uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> grads;
  const std::vector<std::pair<int64_t, torch::ScalarType>> shapes = {{40000, torch::kFloat}, {0, torch::kFloat},
                                                                     {7, torch::kBFloat16},  {100003, torch::kFloat},
                                                                     {33, torch::kHalf},     {5000, torch::kBFloat16},
                                                                     {1, torch::kFloat}};
  for (const auto& [numel, dtype] : shapes) grads.push_back((torch::randn({numel}) * 1024).to(dtype));
  return grads;
}

inline std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.clone());
  return out;
}

// The scaler's tensors of the AdamW operators (step 5).
struct Scaler {
  c10::optional<at::Tensor> grad_scale, found_inf;
};

// grad_scale `scale`, found_inf `flag` (each left out when NaN).
inline Scaler scaler_with(float scale, float flag) {
  Scaler scaler;
  if (!std::isnan(scale)) scaler.grad_scale = torch::full({1}, scale);
  if (!std::isnan(flag)) scaler.found_inf = torch::full({1}, flag);
  return scaler;
}

// GradScaler's inverse of a scale (lesson 1: scale.double().reciprocal().float()).
inline float inverse_of(float scale) { return static_cast<float>(1.0 / static_cast<double>(scale)); }

inline bool same_state(const State& a, const State& b) {
  return torch::equal(a.param, b.param) && torch::equal(a.exp_avg, b.exp_avg) &&
         torch::equal(a.exp_avg_sq, b.exp_avg_sq);
}

inline State copy_of(const State& s) {
  State c;
  c.param = s.param.clone();
  c.exp_avg = s.exp_avg.clone();
  c.exp_avg_sq = s.exp_avg_sq.clone();
  c.step = s.step;
  return c;
}

}  // namespace adamw_checks

// Counts the parallel regions for adamw_checks::parallel_regions and forwards to libgomp. Defined here, once per
// check binary: each step's checks are one binary.
extern "C" void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags) {
  using Real = void (*)(void (*)(void*), void*, unsigned, unsigned);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "GOMP_parallel"));
  if (real == nullptr) std::abort();  // no OpenMP runtime after this binary: nothing could have called this
  if (adamw_checks::g_counting) ++adamw_checks::g_regions;
  real(fn, data, num_threads, flags);
}
