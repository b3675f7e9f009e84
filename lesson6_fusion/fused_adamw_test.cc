// Checks for lesson 6: the napkin math (step 1), the fused kernel (step 2), the operator (step 3), the
// multi-tensor operator (step 4), the scaler's fused unscale and the scaler in the AdamW pass (step 5), and the
// CUDA kernels on a simulated grid on the CPU and, where there is one, on a GPU (step 6).
// Run: bazel test //lesson6_fusion:all   (one step: --test_arg=--test-case='*step2*')
// The oracle is LibTorch's own torch::optim::AdamW, and the one-op-at-a-time step of given.cc that follows it.
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

using doctest::Contains;

namespace {

using workshop::test::rel_error;

// The state of one parameter under AdamW: the parameter, its two moments and the step counter.
struct State {
  torch::Tensor param, exp_avg, exp_avg_sq;
  int64_t step = 0;
};

State make_state(torch::Tensor param) {
  State s;
  s.param = param;
  s.exp_avg = torch::zeros(param.sizes(), torch::kFloat);
  s.exp_avg_sq = torch::zeros(param.sizes(), torch::kFloat);
  return s;
}

// A fixed sequence of gradients for `numel` parameters, `scale` times a standard normal.
std::vector<torch::Tensor> gradients(int64_t numel, int steps, double scale, uint64_t seed = 11) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> out;
  for (int i = 0; i < steps; ++i) out.push_back(torch::randn({numel}) * scale);
  return out;
}

// The largest rel_error of the fused parameter against torch::optim::AdamW's over `grads`, one step each.
double worst_vs_torch(const fusion::AdamWHyper& hyper, const std::vector<torch::Tensor>& grads, int64_t numel) {
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
Worst run_side_by_side(State& fused, State& plain, const fusion::AdamWHyper& hyper,
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

fusion::AdamWHyper hyper_with(double lr, double weight_decay, double eps = 1e-8) {
  fusion::AdamWHyper h;
  h.lr = lr;
  h.weight_decay = weight_decay;
  h.eps = eps;
  return h;
}

constexpr double kFloatTolerance = 1e-6;  // float32: the same ops in the same order, so rounding only

// at::set_num_threads(n) for one scope: the checks run the kernels with several ATen threads, where pieces that
// share anything (a scratch buffer, a flag) would race.
class ThreadsFor {
 public:
  explicit ThreadsFor(int n) : saved_(at::get_num_threads()) { at::set_num_threads(n); }
  ~ThreadsFor() { at::set_num_threads(saved_); }

 private:
  int saved_;
};

// The OpenMP parallel regions entered while counting: LibTorch's OpenMP build enters one per at::parallel_for
// that runs on several threads (GCC turns `#pragma omp parallel` into a call of libgomp's GOMP_parallel, which the
// test binary's own definition below counts and forwards).
std::atomic<bool> g_counting{false};
std::atomic<int> g_regions{0};

// How many parallel regions `f` enters.
template <typename F>
int parallel_regions(const F& f) {
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
bool regions_are_counted() {
  const ThreadsFor threads(2);
  torch::Tensor x = torch::zeros({1 << 20});
  return parallel_regions([&] { x.add_(1); }) > 0;
}

// A copy of `values` whose last byte is the last one before a page that may be neither read nor written: a kernel
// that reads or writes even one element past the end of the tensor crashes at that access (SIGSEGV), in every
// build. (Heap memory has no such wall: a read past the end returns whatever lies there and a write corrupts it
// silently, or much later.) With --config=asan the report also names the line.
torch::Tensor guarded_copy(const torch::Tensor& values) {
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

// The sizes whose tails a kernel may get wrong: every remainder after full vectors of 8 float lanes (AVX2's
// Vectorized<float>::size()) and after packs of 4, small tensors, and tensors one piece (32768 elements) and a few
// more long.
std::vector<int64_t> tail_sizes() {
  std::vector<int64_t> sizes;
  for (int64_t n = 1; n <= 17; ++n) sizes.push_back(n);
  for (int64_t r : {1, 5, 7}) sizes.push_back(32768 + r);
  return sizes;
}

}  // namespace

extern "C" void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags) {
  using Real = void (*)(void (*)(void*), void*, unsigned, unsigned);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "GOMP_parallel"));
  if (real == nullptr) std::abort();  // no OpenMP runtime after this binary: nothing could have called this
  if (g_counting) ++g_regions;
  real(fn, data, num_threads, flags);
}

// ---- step 1: napkin math -------------------------------------------------------------------------------

TEST_CASE("[step1] one fused pass reads 4 tensors and writes 3: 7 x numel x 4 bytes in float32") {
  const fusion::Traffic f32 = fusion::fused_adamw_traffic(1000, torch::kFloat);
  CHECK(f32.bytes_read == 4 * 1000 * 4);
  CHECK(f32.bytes_written == 3 * 1000 * 4);
  CHECK(f32.total() == 7 * 1000 * 4);
  CHECK(f32.temporary_bytes == 0);
  CHECK(f32.passes == 1);
  // 16-bit parameter and gradient, float32 state: 2 + 2 + 4 + 4 bytes read, 2 + 4 + 4 written per element.
  const fusion::Traffic bf16 = fusion::fused_adamw_traffic(1000, torch::kBFloat16);
  CHECK(bf16.bytes_read == 12 * 1000);
  CHECK(bf16.bytes_written == 10 * 1000);
  // float16 is 2 bytes too (c10::elementSize): a napkin that knows only bfloat16 as 16-bit counts it as 4.
  const fusion::Traffic f16 = fusion::fused_adamw_traffic(1000, torch::kHalf);
  CHECK(f16.bytes_read == 12 * 1000);
  CHECK(f16.bytes_written == 10 * 1000);
  CHECK(fusion::fused_adamw_traffic(0, torch::kFloat).total() == 0);
}

TEST_CASE("[step1] torch::optim::AdamW's step reads 14 and writes 9 tensors in 9 passes, 8 without weight decay") {
  const int64_t n = 1000, t = n * 4;  // one float32 tensor
  const fusion::Traffic decayed = fusion::unfused_adamw_traffic(n, torch::kFloat, true);
  CHECK(decayed.bytes_read == 14 * t);
  CHECK(decayed.bytes_written == 9 * t);
  CHECK(decayed.passes == 9);
  CHECK(decayed.temporary_bytes == 2 * t);
  const fusion::Traffic plain = fusion::unfused_adamw_traffic(n, torch::kFloat, false);
  CHECK(plain.bytes_read == 13 * t);
  CHECK(plain.bytes_written == 8 * t);
  CHECK(plain.passes == 8);
  CHECK(plain.temporary_bytes == 2 * t);
  // The state has the parameter's dtype in torch::optim::AdamW: a bfloat16 parameter halves every figure.
  CHECK(fusion::unfused_adamw_traffic(n, torch::kBFloat16, true).total() == 23 * n * 2);
  CHECK(fusion::unfused_adamw_traffic(n, torch::kHalf, true).total() == 23 * n * 2);
  CHECK(fusion::unfused_adamw_traffic(n, torch::kDouble, true).total() == 23 * n * 8);
  // The point of the lesson: 23 tensor passes' worth of bytes against 7.
  CHECK(static_cast<double>(decayed.total()) / fusion::fused_adamw_traffic(n, torch::kFloat).total() ==
        doctest::Approx(23.0 / 7.0));
}

TEST_CASE("[step1] the temporaries the napkin counts are what the counting allocator sees in an AdamW step") {
  const int64_t n = 1 << 16;
  const fusion::Traffic napkin = fusion::unfused_adamw_traffic(n, torch::kFloat, true);
  torch::manual_seed(5);
  torch::Tensor param = torch::randn({n}).requires_grad_(true);
  param.mutable_grad() = torch::randn({n});
  torch::optim::AdamW optimizer({param}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  optimizer.step();  // the first step also makes the state (two tensors): not a temporary
  workshop::MemoryMeter meter;
  optimizer.step();
  const int64_t torch_peak = meter.peak_bytes();
  CAPTURE(torch_peak);
  CAPTURE(napkin.temporary_bytes);
  // Both temporaries (sqrt's result and the quotient) are alive at once; a scalar or two may add a few bytes.
  CHECK(torch_peak >= napkin.temporary_bytes);
  CHECK(torch_peak <= napkin.temporary_bytes + 1024);
  State s = make_state(torch::randn({n}));
  const torch::Tensor grad = torch::randn({n});
  meter.reset();
  fusion::unfused_adamw_step(s.param, grad, s.exp_avg, s.exp_avg_sq, fusion::AdamWHyper{}, 1);
  CHECK(meter.peak_bytes() >= napkin.temporary_bytes);
  CHECK(meter.peak_bytes() <= napkin.temporary_bytes + 1024);
}

TEST_CASE("[step1] the napkin refuses a negative size and a non-floating dtype") {
  CHECK_THROWS_WITH_AS(fusion::unfused_adamw_traffic(-1, torch::kFloat, true), Contains("numel must be >= 0"),
                       c10::Error);
  CHECK_THROWS_WITH_AS(fusion::fused_adamw_traffic(-5, torch::kFloat), Contains("numel must be >= 0"), c10::Error);
  CHECK_THROWS_WITH_AS(fusion::unfused_adamw_traffic(4, torch::kLong, false), Contains("dtype must be floating point"),
                       c10::Error);
  CHECK_THROWS_WITH_AS(fusion::fused_adamw_traffic(4, torch::kInt), Contains("dtype must be floating point"),
                       c10::Error);
}

// ---- step 2: the fused kernel --------------------------------------------------------------------------

TEST_CASE("[step2] float32: the fused kernel follows torch::optim::AdamW for 100 steps") {
  const int64_t n = 10007;  // not a multiple of the vector width
  SUBCASE("no weight decay") {
    const double worst = worst_vs_torch(hyper_with(1e-2, 0.0), gradients(n, 100, 1.0), n);
    CAPTURE(worst);
    CHECK(worst <= kFloatTolerance);
  }
  SUBCASE("weight decay 0.1") {
    const double worst = worst_vs_torch(hyper_with(1e-2, 0.1), gradients(n, 100, 1.0), n);
    CAPTURE(worst);
    CHECK(worst <= kFloatTolerance);
  }
  SUBCASE("small gradients and a large eps (eps matters, outside the square root)") {
    const double worst = worst_vs_torch(hyper_with(1e-2, 0.05, 1e-3), gradients(n, 100, 1e-3), n);
    CAPTURE(worst);
    CHECK(worst <= kFloatTolerance);
  }
  SUBCASE("other betas") {
    fusion::AdamWHyper h = hyper_with(3e-3, 0.02);
    h.beta1 = 0.5;
    h.beta2 = 0.9;
    const double worst = worst_vs_torch(h, gradients(n, 100, 1.0), n);
    CAPTURE(worst);
    CHECK(worst <= kFloatTolerance);
  }
}

TEST_CASE("[step2] float32: both moments are written back and match the one-op-at-a-time step") {
  const int64_t n = 4099;
  torch::manual_seed(2);
  const torch::Tensor start = torch::randn({n});
  State fused = make_state(start.clone()), plain = make_state(start.clone());
  const Worst worst = run_side_by_side(fused, plain, hyper_with(1e-2, 0.1), gradients(n, 50, 0.5), false);
  CAPTURE(worst.param);
  CAPTURE(worst.exp_avg);
  CAPTURE(worst.exp_avg_sq);
  CHECK(worst.param <= kFloatTolerance);
  CHECK(worst.exp_avg <= kFloatTolerance);
  CHECK(worst.exp_avg_sq <= kFloatTolerance);
}

TEST_CASE("[step2] with a zero gradient only the weight decay moves the parameters") {
  const int64_t n = 1000;
  torch::manual_seed(4);
  const torch::Tensor start = torch::randn({n});
  const torch::Tensor zero = torch::zeros({n});
  SUBCASE("weight decay 0: nothing changes") {
    State s = make_state(start.clone());
    for (int i = 1; i <= 5; ++i)
      fusion::adamw_kernel_cpu(s.param, zero, s.exp_avg, s.exp_avg_sq, hyper_with(0.1, 0), i);
    CHECK(torch::equal(s.param, start));
    CHECK(s.exp_avg.abs().max().item<float>() == 0.0f);
    CHECK(s.exp_avg_sq.abs().max().item<float>() == 0.0f);
  }
  SUBCASE("weight decay 0.5, lr 0.1: p shrinks by 0.95 per step") {
    State s = make_state(start.clone());
    for (int i = 1; i <= 5; ++i)
      fusion::adamw_kernel_cpu(s.param, zero, s.exp_avg, s.exp_avg_sq, hyper_with(0.1, 0.5), i);
    const double worst = rel_error({s.param}, {start * std::pow(0.95, 5)});
    CAPTURE(worst);
    CHECK(worst <= kFloatTolerance);
  }
}

TEST_CASE("[step2] every element is updated, also in the last partial vector and across pieces of work") {
  for (int64_t n : {1, 3, 7, 9, 33, 100003}) {
    CAPTURE(n);
    torch::manual_seed(6);
    const torch::Tensor start = torch::randn({n});
    State fused = make_state(start.clone()), plain = make_state(start.clone());
    std::vector<torch::Tensor> grads = gradients(n, 3, 1.0);
    for (torch::Tensor& g : grads) g = g.abs() + 0.1;  // one sign: the three updates cannot cancel out
    const Worst worst = run_side_by_side(fused, plain, hyper_with(1e-2, 0.01), grads, false);
    CHECK(worst.param <= kFloatTolerance);
    CHECK(worst.exp_avg <= kFloatTolerance);
    CHECK(worst.exp_avg_sq <= kFloatTolerance);
    // Each element moved.
    CHECK(fused.param.ne(start).all().item<bool>());
  }
}

TEST_CASE("[step2] nothing past a tensor's end is read or written: every tail, every dtype, tensors against a wall") {
  // Each of the four tensors ends where an inaccessible page begins: a last vector loaded or stored whole, or a
  // 16-bit conversion loop that runs over all the lanes, crashes the binary here (SIGSEGV, the case named above
  // it in the log). The results must also be those of the same kernel on ordinary tensors.
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t n : tail_sizes()) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(n);
      torch::manual_seed(n);
      State plain = make_state(torch::randn({n}).to(dtype));
      plain.exp_avg = torch::rand({n});
      plain.exp_avg_sq = torch::rand({n});
      const torch::Tensor grad = torch::randn({n}).to(dtype);
      State walled;
      walled.param = guarded_copy(plain.param);
      walled.exp_avg = guarded_copy(plain.exp_avg);
      walled.exp_avg_sq = guarded_copy(plain.exp_avg_sq);
      fusion::adamw_kernel_cpu(walled.param, guarded_copy(grad), walled.exp_avg, walled.exp_avg_sq, hyper, 3);
      fusion::adamw_kernel_cpu(plain.param, grad, plain.exp_avg, plain.exp_avg_sq, hyper, 3);
      CHECK(torch::equal(walled.param, plain.param));
      CHECK(torch::equal(walled.exp_avg, plain.exp_avg));
      CHECK(torch::equal(walled.exp_avg_sq, plain.exp_avg_sq));
    }
  }
}

TEST_CASE("[step2] 16-bit parameters with float32 state: each step is the float32 step, rounded to nearest") {
  const int64_t n = 20011;
  for (const auto& [dtype, half_ulp] : {std::pair<torch::ScalarType, double>{torch::kBFloat16, std::ldexp(1.0, -8)},
                                        std::pair<torch::ScalarType, double>{torch::kHalf, std::ldexp(1.0, -11)}}) {
    CAPTURE(dtype_name(dtype));
    torch::manual_seed(8);
    State s = make_state(torch::randn({n}).to(dtype));
    const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
    const std::vector<torch::Tensor> grads = gradients(n, 20, 1.0);
    double worst_state = 0, worst_rounding = 0, exact_fraction = 1;
    for (const torch::Tensor& grad32 : grads) {
      const torch::Tensor grad = grad32.to(dtype);
      // The float32 master reference: this step from the same (rounded) parameter, state and gradient.
      State master = make_state(s.param.to(torch::kFloat));
      master.exp_avg = s.exp_avg.clone();
      master.exp_avg_sq = s.exp_avg_sq.clone();
      master.step = s.step;
      fusion::unfused_adamw_step(master.param, grad.to(torch::kFloat), master.exp_avg, master.exp_avg_sq, hyper,
                                 ++master.step);
      fusion::adamw_kernel_cpu(s.param, grad, s.exp_avg, s.exp_avg_sq, hyper, ++s.step);
      REQUIRE(dtype_name(s.param.scalar_type()) == dtype_name(dtype));
      REQUIRE(dtype_name(s.exp_avg.scalar_type()) == "Float");
      worst_state = std::max(
          {worst_state, rel_error({s.exp_avg}, {master.exp_avg}), rel_error({s.exp_avg_sq}, {master.exp_avg_sq})});
      // Rounding to nearest is off by at most half a unit in the last place: |x| * 2^-8 (bfloat16), 2^-11 (half),
      // and half of float16's smallest subnormal step near zero.
      const torch::Tensor error = (s.param.to(torch::kFloat) - master.param).abs();
      const torch::Tensor allowed = master.param.abs() * half_ulp * (1 + 1e-3) + std::ldexp(1.0, -25);
      worst_rounding = std::max(worst_rounding, (error / allowed).max().item<double>());
      exact_fraction =
          std::min(exact_fraction, s.param.eq(master.param.to(dtype)).to(torch::kDouble).mean().item<double>());
    }
    CAPTURE(worst_state);
    CAPTURE(worst_rounding);
    CAPTURE(exact_fraction);
    CHECK(worst_state <= kFloatTolerance);
    CHECK(worst_rounding <= 1.0);
    CHECK(exact_fraction >= 0.999);
  }
}

TEST_CASE("[step2] on 4 ATen threads the kernel runs its pieces in one parallel region, with the one-thread bits") {
  const int64_t n = (1 << 20) + 3;  // 33 pieces of 32768
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    CAPTURE(dtype_name(dtype));
    torch::manual_seed(12);
    const torch::Tensor start = torch::randn({n}).to(dtype);
    const torch::Tensor grad = torch::randn({n}).to(dtype);
    State one = make_state(start.clone()), four = make_state(start.clone());
    {
      const ThreadsFor threads(1);
      for (int step = 1; step <= 2; ++step)
        fusion::adamw_kernel_cpu(one.param, grad, one.exp_avg, one.exp_avg_sq, hyper_with(1e-2, 0.1), step);
    }
    const ThreadsFor threads(4);
    int regions = 0;
    for (int step = 1; step <= 2; ++step) {
      regions += parallel_regions([&] {
        fusion::adamw_kernel_cpu(four.param, grad, four.exp_avg, four.exp_avg_sq, hyper_with(1e-2, 0.1), step);
      });
    }
    CHECK(torch::equal(four.param, one.param));
    CHECK(torch::equal(four.exp_avg, one.exp_avg));
    CHECK(torch::equal(four.exp_avg_sq, one.exp_avg_sq));
    if (regions_are_counted()) {
      CHECK(regions == 2);  // one at::parallel_for per step
    } else {
      MESSAGE("parallel regions are not counted here (no OpenMP in this LibTorch)");
    }
  }
}

TEST_CASE("[step2] the fused kernel allocates nothing: no temporaries, unlike the unfused step") {
  const int64_t n = 1 << 16;
  State s = make_state(torch::randn({n}));
  const torch::Tensor grad = torch::randn({n});
  fusion::adamw_kernel_cpu(s.param, grad, s.exp_avg, s.exp_avg_sq, fusion::AdamWHyper{}, 1);  // warm up threads
  workshop::MemoryMeter meter;
  fusion::adamw_kernel_cpu(s.param, grad, s.exp_avg, s.exp_avg_sq, fusion::AdamWHyper{}, 2);
  CHECK(meter.peak_bytes() == 0);
}

// ---- step 3: the operator ------------------------------------------------------------------------------

TEST_CASE("[step2] grad_multiplier: each gradient value is multiplied in float32 before the update, never stored") {
  // What step 5's scaler passes (1/scale): the step must be the step on grad x multiplier computed in float32, for
  // every dtype (a 16-bit gradient is not rounded again after the multiply), and the gradient stays as it was.
  const int64_t n = 2 * 32768 + 13;  // pieces and a partial last vector
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (float multiplier : {1.0f / 65536, static_cast<float>(1.0 / 3.0), 4.0f}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(multiplier);
      torch::manual_seed(17);
      const torch::Tensor start = torch::randn({n}).to(dtype);
      const torch::Tensor grad = (torch::randn({n}) * 4096).to(dtype);
      const torch::Tensor grad_before = grad.clone();
      State scaled = make_state(start.clone());
      State plain = make_state(start.to(torch::kFloat));  // the float32 step on the float32 product
      for (int64_t step = 1; step <= 2; ++step) {
        fusion::adamw_kernel_cpu(scaled.param, grad, scaled.exp_avg, scaled.exp_avg_sq, hyper, step, multiplier);
        fusion::adamw_kernel_cpu(plain.param, grad.to(torch::kFloat) * multiplier, plain.exp_avg, plain.exp_avg_sq,
                                 hyper, step);
        if (dtype != torch::kFloat) plain.param = plain.param.to(dtype).to(torch::kFloat);  // rounded each step
      }
      CHECK(torch::equal(scaled.param, plain.param.to(dtype)));
      CHECK(torch::equal(scaled.exp_avg, plain.exp_avg));
      CHECK(torch::equal(scaled.exp_avg_sq, plain.exp_avg_sq));
      CHECK(torch::equal(grad, grad_before));
    }
  }
}

TEST_CASE("[step3] the dispatcher finds workshop::fused_adamw_ by name, with its schema and a CPU kernel") {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(fusion::kOpName, "");
  std::ostringstream schema;
  schema << op.schema();
  CAPTURE(schema.str());
  CHECK(schema.str().find("workshop::fused_adamw_(Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg") == 0);
  CHECK(op.hasKernelForDispatchKey(c10::DispatchKey::CPU));
}

TEST_CASE("[step3] called through the dispatcher the operator gives the kernel's results") {
  const int64_t n = 5003;
  torch::manual_seed(9);
  const torch::Tensor start = torch::randn({n});
  State fused = make_state(start.clone()), plain = make_state(start.clone());
  const Worst worst = run_side_by_side(fused, plain, hyper_with(1e-2, 0.1), gradients(n, 10, 1.0), true);
  CHECK(worst.param <= kFloatTolerance);
  CHECK(worst.exp_avg <= kFloatTolerance);
  CHECK(worst.exp_avg_sq <= kFloatTolerance);
  // And a parameter that requires grad, as an optimizer holds it, is updated in place (no autograd error).
  torch::Tensor leaf = start.clone().requires_grad_(true);
  State s = make_state(leaf);
  fusion::fused_adamw_(s.param, torch::ones({n}), s.exp_avg, s.exp_avg_sq, fusion::AdamWHyper{}, 1);
  CHECK(leaf.detach().ne(start).all().item<bool>());
}

TEST_CASE("[step3] empty tensors are accepted and nothing happens") {
  State s = make_state(torch::empty({0}));
  fusion::fused_adamw_(s.param, torch::empty({0}), s.exp_avg, s.exp_avg_sq, fusion::AdamWHyper{}, 1);
  CHECK(s.param.numel() == 0);
  State s2 = make_state(torch::empty({3, 0}, torch::kBFloat16));
  fusion::fused_adamw_(s2.param, torch::empty({3, 0}, torch::kBFloat16), s2.exp_avg, s2.exp_avg_sq,
                       fusion::AdamWHyper{}, 7);
  CHECK(s2.param.numel() == 0);
}

TEST_CASE("[step3] non-contiguous inputs are refused, naming the tensor") {
  const torch::Tensor base = torch::randn({64, 64});
  State s = make_state(torch::randn({64, 64}));
  const torch::Tensor grad = torch::randn({64, 64});
  const fusion::AdamWHyper h;
  SUBCASE("param") {
    torch::Tensor p = base.t();
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_(p, grad, s.exp_avg, s.exp_avg_sq, h, 1),
                         Contains("param is not contiguous"), c10::Error);
  }
  SUBCASE("grad") {
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_(s.param, base.t(), s.exp_avg, s.exp_avg_sq, h, 1),
                         Contains("grad is not contiguous"), c10::Error);
  }
  SUBCASE("exp_avg") {
    torch::Tensor m = torch::zeros({64, 128}).slice(1, 0, 128, 2);
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_(s.param, grad, m, s.exp_avg_sq, h, 1),
                         Contains("exp_avg is not contiguous"), c10::Error);
  }
  SUBCASE("exp_avg_sq") {
    torch::Tensor v = torch::zeros({64, 64}).t();
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_(s.param, grad, s.exp_avg, v, h, 1),
                         Contains("exp_avg_sq is not contiguous"), c10::Error);
  }
  CHECK(torch::equal(s.exp_avg, torch::zeros({64, 64})));  // refused before anything was written
}

TEST_CASE("[step3] each bad input gives its named error") {
  const int64_t n = 16;
  State s = make_state(torch::randn({n}));
  const torch::Tensor grad = torch::randn({n});
  const fusion::AdamWHyper good;
  auto call = [&](torch::Tensor p, torch::Tensor g, torch::Tensor m, torch::Tensor v, fusion::AdamWHyper h,
                  int64_t step) { fusion::fused_adamw_(p, g, m, v, h, step); };
  auto with = [&](void (*change)(fusion::AdamWHyper&)) {
    fusion::AdamWHyper h = good;
    change(h);
    return h;
  };
  SUBCASE("undefined") {
    CHECK_THROWS_WITH_AS(fusion::check_adamw_args(s.param, torch::Tensor(), s.exp_avg, s.exp_avg_sq, good, 1),
                         Contains("grad is undefined"), c10::Error);
  }
  SUBCASE("shapes") {
    CHECK_THROWS_WITH_AS(call(s.param, torch::randn({n + 1}), s.exp_avg, s.exp_avg_sq, good, 1),
                         Contains("must have the same shape"), c10::Error);
    CHECK_THROWS_WITH_AS(call(s.param, grad, torch::zeros({4, 4}), s.exp_avg_sq, good, 1),
                         Contains("must have the same shape"), c10::Error);
  }
  SUBCASE("dtypes") {
    CHECK_THROWS_WITH_AS(call(torch::zeros({n}, torch::kDouble), grad.to(torch::kDouble), s.exp_avg, s.exp_avg_sq, good,
                              1),
                         Contains("param must be float32, bfloat16 or float16"), c10::Error);
    CHECK_THROWS_WITH_AS(call(s.param, grad.to(torch::kBFloat16), s.exp_avg, s.exp_avg_sq, good, 1),
                         Contains("grad must have param's dtype"), c10::Error);
    CHECK_THROWS_WITH_AS(call(s.param.to(torch::kBFloat16), grad.to(torch::kBFloat16), s.exp_avg.to(torch::kBFloat16),
                              s.exp_avg_sq, good, 1),
                         Contains("exp_avg and exp_avg_sq must be float32"), c10::Error);
    CHECK_THROWS_WITH_AS(call(s.param, grad, s.exp_avg, s.exp_avg_sq.to(torch::kDouble), good, 1),
                         Contains("exp_avg and exp_avg_sq must be float32"), c10::Error);
  }
  SUBCASE("devices") {
    // A meta tensor stands in for another device (this check needs no GPU); the kernel is called directly,
    // because the dispatcher would route a meta argument to a (missing) meta kernel.
    // Each of the four in turn on the other device: a rule that compares only one tensor with param misses two.
    const torch::Tensor meta = torch::empty({n}, torch::TensorOptions().device(c10::kMeta));
    CHECK_THROWS_WITH_AS(fusion::check_adamw_args(meta, grad, s.exp_avg, s.exp_avg_sq, good, 1),
                         Contains("all tensors must be on one device"), c10::Error);
    CHECK_THROWS_WITH_AS(fusion::check_adamw_args(s.param, meta, s.exp_avg, s.exp_avg_sq, good, 1),
                         Contains("all tensors must be on one device"), c10::Error);
    CHECK_THROWS_WITH_AS(fusion::check_adamw_args(s.param, grad, meta, s.exp_avg_sq, good, 1),
                         Contains("all tensors must be on one device"), c10::Error);
    CHECK_THROWS_WITH_AS(fusion::check_adamw_args(s.param, grad, s.exp_avg, meta, good, 1),
                         Contains("all tensors must be on one device"), c10::Error);
  }
  SUBCASE("overlap") {
    CHECK_THROWS_WITH_AS(call(s.param, s.param, s.exp_avg, s.exp_avg_sq, good, 1),
                         Contains("param and grad overlap in memory"), c10::Error);
    CHECK_THROWS_WITH_AS(call(s.param, grad, s.exp_avg, s.param, good, 1),
                         Contains("param and exp_avg_sq overlap in memory"), c10::Error);
    CHECK_THROWS_WITH_AS(call(s.param, grad, grad, s.exp_avg_sq, good, 1),
                         Contains("grad and exp_avg overlap in memory"), c10::Error);
    CHECK_THROWS_WITH_AS(call(s.param, grad, s.exp_avg, grad, good, 1),
                         Contains("grad and exp_avg_sq overlap in memory"), c10::Error);
    const torch::Tensor both = torch::zeros({n + 8});
    CHECK_THROWS_WITH_AS(call(s.param, grad, both.slice(0, 0, n), both.slice(0, 8, n + 8), good, 1),
                         Contains("exp_avg and exp_avg_sq overlap in memory"), c10::Error);
    // Neighbours in one buffer that do not share an element are fine.
    const torch::Tensor split = torch::zeros({2 * n});
    CHECK_NOTHROW(call(s.param, grad, split.slice(0, 0, n), split.slice(0, n, 2 * n), good, 1));
  }
  SUBCASE("step") {
    for (int64_t step : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
      CAPTURE(step);
      CHECK_THROWS_WITH_AS(call(s.param, grad, s.exp_avg, s.exp_avg_sq, good, step), Contains("step must be >= 1"),
                           c10::Error);
    }
  }
  SUBCASE("hyper-parameters") {
    const auto check = [&](fusion::AdamWHyper h, const char* message) {
      CAPTURE(message);
      CHECK_THROWS_WITH_AS(call(s.param, grad, s.exp_avg, s.exp_avg_sq, h, 1), Contains(message), c10::Error);
    };
    check(with([](fusion::AdamWHyper& h) { h.lr = -1e-3; }), "lr must be >= 0");
    check(with([](fusion::AdamWHyper& h) { h.lr = std::nan(""); }), "lr must be >= 0");
    check(with([](fusion::AdamWHyper& h) { h.eps = -1; }), "eps must be >= 0");
    check(with([](fusion::AdamWHyper& h) { h.weight_decay = -0.1; }), "weight_decay must be >= 0");
    check(with([](fusion::AdamWHyper& h) { h.beta1 = 1.0; }), "beta1 must be in [0, 1)");
    check(with([](fusion::AdamWHyper& h) { h.beta1 = -0.5; }), "beta1 must be in [0, 1)");
    check(with([](fusion::AdamWHyper& h) { h.beta2 = 1.5; }), "beta2 must be in [0, 1)");
    check(with([](fusion::AdamWHyper& h) { h.beta2 = 1.0; }), "beta2 must be in [0, 1)");  // 1 - beta2^t = 0
    // NaN compares false with everything: a rule written as !(x < 0) would let it through.
    check(with([](fusion::AdamWHyper& h) { h.eps = std::nan(""); }), "eps must be >= 0");
    check(with([](fusion::AdamWHyper& h) { h.weight_decay = std::nan(""); }), "weight_decay must be >= 0");
    check(with([](fusion::AdamWHyper& h) { h.beta1 = std::nan(""); }), "beta1 must be in [0, 1)");
    check(with([](fusion::AdamWHyper& h) { h.beta2 = std::nan(""); }), "beta2 must be in [0, 1)");
  }
  CHECK(torch::equal(s.exp_avg, torch::zeros({n})));  // no refused call wrote anything
}

// ---- step 4: the multi-tensor operator ------------------------------------------------------------------

namespace {

// Parameters of assorted sizes and dtypes, as a model has them (an empty one included), with float32 state.
struct Lists {
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
};

Lists make_lists(uint64_t seed) {
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

}  // namespace

TEST_CASE("[step4] the multi-tensor op gives every tensor exactly what the single-tensor op gives it") {
  Lists multi = make_lists(12), single = make_lists(12);
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (int64_t step = 1; step <= 3; ++step) {
    fusion::fused_adamw_multi_(multi.params, multi.grads, multi.exp_avgs, multi.exp_avg_sqs, hyper, step);
    for (size_t i = 0; i < single.params.size(); ++i) {
      fusion::fused_adamw_(single.params[i], single.grads[i], single.exp_avgs[i], single.exp_avg_sqs[i], hyper, step);
    }
  }
  for (size_t i = 0; i < multi.params.size(); ++i) {
    CAPTURE(i);
    CHECK(torch::equal(multi.params[i], single.params[i]));  // the same arithmetic: the same bits
    CHECK(torch::equal(multi.exp_avgs[i], single.exp_avgs[i]));
    CHECK(torch::equal(multi.exp_avg_sqs[i], single.exp_avg_sqs[i]));
  }
}

TEST_CASE("[step4] the dispatcher finds workshop::fused_adamw_multi_, and empty tensors are accepted") {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(fusion::kMultiOpName, "");
  std::ostringstream schema;
  schema << op.schema();
  CAPTURE(schema.str());
  CHECK(schema.str().find("workshop::fused_adamw_multi_(Tensor(a!)[] params, Tensor[] grads") == 0);
  CHECK(op.hasKernelForDispatchKey(c10::DispatchKey::CPU));
  const std::vector<torch::Tensor> none;
  CHECK_NOTHROW(fusion::fused_adamw_multi_(none, none, none, none, fusion::AdamWHyper{}, 1));  // given.cc returns
  const std::vector<torch::Tensor> empty = {torch::empty({0}), torch::empty({2, 0})};
  CHECK_NOTHROW(fusion::fused_adamw_multi_(empty, empty, {torch::zeros({0}), torch::zeros({2, 0})},
                                           {torch::zeros({0}), torch::zeros({2, 0})}, fusion::AdamWHyper{}, 1));
}

TEST_CASE("[step4] bad lists give their named errors, and nothing is written") {
  Lists l = make_lists(13);
  const fusion::AdamWHyper h;
  SUBCASE("lengths") {
    std::vector<torch::Tensor> short_grads(l.grads.begin(), l.grads.end() - 1);
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(l.params, short_grads, l.exp_avgs, l.exp_avg_sqs, h, 1),
                         Contains("the lists must have one length"), c10::Error);
  }
  SUBCASE("one tuple's error, with its index") {
    l.grads[3] = torch::randn({14}).to(torch::kBFloat16).slice(0, 0, 14, 2);  // 7 elements, strided
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, h, 1),
                         Contains("tensor 3"), c10::Error);
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, h, 1),
                         Contains("grad is not contiguous"), c10::Error);
  }
  SUBCASE("two tuples sharing memory") {
    const torch::Tensor shared = torch::randn({100});
    l.params[0] = shared.slice(0, 0, 60);
    l.grads[0] = torch::randn({60});
    l.exp_avgs[0] = torch::zeros({60});
    l.exp_avg_sqs[0] = torch::zeros({60});
    l.params[1] = shared.slice(0, 59, 60);  // the last element of params[0]
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, h, 1),
                         Contains("params[1] and params[0] overlap in memory"), c10::Error);
    l.params[1] = torch::randn({1});
    l.exp_avg_sqs[6] = l.exp_avgs[4].slice(0, 0, 5000);  // a moment inside another tuple's moment
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, h, 1),
                         Contains("overlap in memory"), c10::Error);
  }
  SUBCASE("tuples on two devices") {
    // Tuple 2 (empty) on another device: each tuple is on one device, but the list is not. A meta tensor stands in
    // for a GPU (the check is called directly: the dispatcher would look for a meta kernel).
    const torch::Tensor meta = torch::empty({0}, torch::TensorOptions().device(c10::kMeta));
    Lists mixed = l;
    mixed.params[2] = meta;
    mixed.grads[2] = meta.clone();
    mixed.exp_avgs[2] = meta.clone();
    mixed.exp_avg_sqs[2] = meta.clone();
    CHECK_THROWS_WITH_AS(fusion::check_adamw_multi_args(mixed.params, mixed.grads, mixed.exp_avgs, mixed.exp_avg_sqs, h,
                                                        1),
                         Contains("all tensors must be on one device"), c10::Error);
  }
  for (const torch::Tensor& m : l.exp_avgs) CHECK(m.abs().sum().item<float>() == 0.0f);
}

TEST_CASE("[step4] on 4 ATen threads the whole list is one parallel region, with the one-thread bits") {
  // Five tensors of three pieces each, and small ones: one region in all, not one per tensor.
  const auto lists = [] {
    Lists l = make_lists(14);
    torch::manual_seed(15);
    for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kFloat, torch::kHalf, torch::kFloat}) {
      l.params.push_back(torch::randn({70000}).to(dtype));
      l.grads.push_back(torch::randn({70000}).to(dtype));
      l.exp_avgs.push_back(torch::zeros({70000}));
      l.exp_avg_sqs.push_back(torch::zeros({70000}));
    }
    return l;
  };
  Lists one = lists(), four = lists();
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  {
    const ThreadsFor threads(1);
    fusion::fused_adamw_multi_(one.params, one.grads, one.exp_avgs, one.exp_avg_sqs, hyper, 1);
  }
  const ThreadsFor threads(4);
  const int regions = parallel_regions(
      [&] { fusion::fused_adamw_multi_(four.params, four.grads, four.exp_avgs, four.exp_avg_sqs, hyper, 1); });
  for (size_t i = 0; i < one.params.size(); ++i) {
    CAPTURE(i);
    CHECK(torch::equal(four.params[i], one.params[i]));
    CHECK(torch::equal(four.exp_avgs[i], one.exp_avgs[i]));
    CHECK(torch::equal(four.exp_avg_sqs[i], one.exp_avg_sqs[i]));
  }
  if (regions_are_counted()) {
    CHECK(regions == 1);
  } else {
    MESSAGE("parallel regions are not counted here (no OpenMP in this LibTorch)");
  }
}

TEST_CASE("[step4] nothing past a tensor's end is read or written: a list of every tail and dtype against walls") {
  // Every tensor of the list ends at an inaccessible page (guarded_copy): pieces that span tensors must stop
  // at each tensor's own end.
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  Lists walled, plain;
  torch::manual_seed(14);
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t n : tail_sizes()) {
      plain.params.push_back(torch::randn({n}).to(dtype));
      plain.grads.push_back(torch::randn({n}).to(dtype));
      plain.exp_avgs.push_back(torch::rand({n}));
      plain.exp_avg_sqs.push_back(torch::rand({n}));
      walled.params.push_back(guarded_copy(plain.params.back()));
      walled.grads.push_back(guarded_copy(plain.grads.back()));
      walled.exp_avgs.push_back(guarded_copy(plain.exp_avgs.back()));
      walled.exp_avg_sqs.push_back(guarded_copy(plain.exp_avg_sqs.back()));
    }
  }
  fusion::fused_adamw_multi_(walled.params, walled.grads, walled.exp_avgs, walled.exp_avg_sqs, hyper, 2);
  for (size_t i = 0; i < plain.params.size(); ++i) {
    fusion::fused_adamw_(plain.params[i], plain.grads[i], plain.exp_avgs[i], plain.exp_avg_sqs[i], hyper, 2);
  }
  for (size_t i = 0; i < plain.params.size(); ++i) {
    CAPTURE(i);
    CHECK(torch::equal(walled.params[i], plain.params[i]));
    CHECK(torch::equal(walled.exp_avgs[i], plain.exp_avgs[i]));
    CHECK(torch::equal(walled.exp_avg_sqs[i], plain.exp_avg_sqs[i]));
  }
}

// ---- step 5: the scaler's fused unscale ------------------------------------------------------------------

namespace {

// Gradients as a model has them (an empty one, sizes across the 32768-element pieces, 16-bit ones), each
// value a scaled gradient: a power of two times a normal sample, so unscaling by a power of two is exact.
std::vector<torch::Tensor> scaled_grads(uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> grads;
  const std::vector<std::pair<int64_t, torch::ScalarType>> shapes = {{40000, torch::kFloat}, {0, torch::kFloat},
                                                                     {7, torch::kBFloat16},  {100003, torch::kFloat},
                                                                     {33, torch::kHalf},     {5000, torch::kBFloat16},
                                                                     {1, torch::kFloat}};
  for (const auto& [numel, dtype] : shapes) grads.push_back((torch::randn({numel}) * 1024).to(dtype));
  return grads;
}

std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.clone());
  return out;
}

}  // namespace

TEST_CASE("[step5] the dispatcher finds workshop::fused_unscale_ with ATen's unscale schema and a CPU kernel") {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(fusion::kUnscaleOpName, "");
  std::ostringstream schema;
  schema << op.schema();
  CAPTURE(schema.str());
  CHECK(schema.str() == "workshop::fused_unscale_(Tensor(a!)[] grads, Tensor(b!) found_inf, Tensor inv_scale) -> ()");
  CHECK(op.hasKernelForDispatchKey(c10::DispatchKey::CPU));
}

TEST_CASE("[step5] finite gradients are multiplied by inv_scale, each rounded once to its dtype; found_inf stays 0") {
  std::vector<torch::Tensor> before = scaled_grads(21);
  // A scale below 1 (inv_scale 16): a float32 1e38 and a float16 60000 overflow when multiplied. The values read
  // were finite, so found_inf stays 0 (ATen tests the value before the multiply).
  before.push_back(torch::full({9}, 1e38f));
  before.push_back(torch::full({13}, 60000.0).to(torch::kHalf));
  for (float inv : {1.0f / 1024, 0.1f, 1.0f, 16.0f}) {
    CAPTURE(inv);
    std::vector<torch::Tensor> grads = clones(before);
    torch::Tensor found_inf = torch::zeros({1});
    fusion::fused_unscale_(grads, found_inf, torch::full({1}, inv));
    CHECK(found_inf.item<float>() == 0.0f);
    for (size_t i = 0; i < grads.size(); ++i) {
      CAPTURE(i);
      REQUIRE(grads[i].dtype() == before[i].dtype());
      // float32 arithmetic on the value as read, rounded to the gradient's dtype: as ATen's kernel does it.
      CHECK(torch::equal(grads[i], (before[i].to(torch::kFloat) * inv).to(before[i].scalar_type())));
    }
  }
}

TEST_CASE("[step5] an inf or a NaN anywhere sets found_inf to 1, and every value is still unscaled") {
  const std::vector<torch::Tensor> before = scaled_grads(22);
  // (gradient, element): the first element of all, the last of a piece-crossing tensor, a 16-bit tail, the last.
  const std::vector<std::pair<size_t, int64_t>> places = {{0, 0}, {3, 100002}, {3, 32768 * 2 + 5}, {4, 32}, {5, 4999},
                                                          {6, 0}, {2, 6}};
  for (const auto& [t, k] : places) {
    for (float bad : {INFINITY, -INFINITY, NAN}) {
      for (float inv : {0.5f, 1.0f}) {  // at a scale of 1 nothing is multiplied, but the check still runs
        CAPTURE(t);
        CAPTURE(k);
        CAPTURE(bad);
        CAPTURE(inv);
        std::vector<torch::Tensor> grads = clones(before);
        grads[t][k] = bad;
        std::vector<torch::Tensor> expected = clones(grads);
        torch::Tensor found_inf = torch::zeros({1});
        fusion::fused_unscale_(grads, found_inf, torch::full({1}, inv));
        CHECK(found_inf.item<float>() == 1.0f);
        for (size_t i = 0; i < grads.size(); ++i) {  // every element, those after the bad one included
          const torch::Tensor want = (expected[i].to(torch::kFloat) * inv).to(expected[i].scalar_type());
          CHECK(torch::equal(grads[i].nan_to_num(0, 1, -1), want.nan_to_num(0, 1, -1)));
        }
      }
    }
  }
}

TEST_CASE("[step5] found_inf is only ever set: a 1 stays 1 over finite gradients, an empty list changes nothing") {
  std::vector<torch::Tensor> grads = scaled_grads(23);
  torch::Tensor found_inf = torch::ones({1});
  fusion::fused_unscale_(grads, found_inf, torch::full({1}, 0.25f));
  CHECK(found_inf.item<float>() == 1.0f);
  std::vector<torch::Tensor> empty = {torch::empty({0}), torch::empty({3, 0})};
  found_inf.zero_();
  CHECK_NOTHROW(fusion::fused_unscale_(empty, found_inf, torch::full({1}, 0.25f)));
  CHECK(found_inf.item<float>() == 0.0f);
}

TEST_CASE("[step5] bad inputs give their named errors, and nothing is written") {
  std::vector<torch::Tensor> grads = scaled_grads(24);
  const std::vector<torch::Tensor> before = clones(grads);
  torch::Tensor found_inf = torch::zeros({1});
  const torch::Tensor inv = torch::full({1}, 0.5f);
  auto refused = [&](std::vector<torch::Tensor> g, torch::Tensor f, torch::Tensor i, const char* message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(fusion::fused_unscale_(g, f, i), Contains(message), c10::Error);
  };
  refused(grads, torch::zeros({2}), inv, "fused_unscale_: found_inf must be a defined one-element float32 tensor");
  refused(grads, torch::zeros({1}, torch::kDouble), inv, "found_inf must be a defined one-element float32 tensor");
  refused(grads, found_inf, torch::full({1}, 0.5, torch::kDouble), "inv_scale must be a defined one-element float32");
  refused(grads, found_inf, torch::full({2}, 0.5f), "inv_scale must be a defined one-element float32 tensor");
  {
    std::vector<torch::Tensor> g = clones(before);
    g[3] = torch::ones({4}, torch::kInt);
    refused(g, found_inf, inv, "grad 3 must be float32, bfloat16 or float16");
    g[3] = torch::randn({8}).slice(0, 0, 8, 2);
    refused(g, found_inf, inv, "fused_unscale_: grad 3 is not contiguous");
    g[3] = torch::Tensor();
    refused(g, found_inf, inv, "fused_unscale_: grad 3 is undefined");
  }
  {
    std::vector<torch::Tensor> g = clones(before);
    const torch::Tensor shared = torch::randn({100});
    g[0] = shared.slice(0, 0, 60);
    g[6] = shared.slice(0, 59, 60);  // the last element of grads[0]
    refused(g, found_inf, inv, "grads[6] and grads[0] overlap in memory");
    g[6] = torch::randn({1});
    g[4] = g[3].slice(0, 1000, 1033).to(torch::kHalf);  // a copy: no overlap
    g[5] = g[3].slice(0, 500, 600);                     // a view inside grads[3]
    refused(g, found_inf, inv, "grads[5] and grads[3] overlap in memory");
  }
  // Another device: the kernel's own check (through the dispatcher a meta tensor would select no CPU kernel).
  CHECK_THROWS_WITH_AS(fusion::check_unscale_args({torch::empty({4}, torch::Device(torch::kMeta))}, found_inf, inv),
                       Contains("is not on found_inf's device"), c10::Error);
  CHECK_THROWS_WITH_AS(fusion::check_unscale_args(grads, torch::zeros({1}, torch::Device(torch::kMeta)), inv),
                       Contains("found_inf and inv_scale must be on one device"), c10::Error);
  for (size_t i = 0; i < grads.size(); ++i) CHECK(torch::equal(grads[i], before[i]));  // nothing written
  CHECK(found_inf.item<float>() == 0.0f);
}

TEST_CASE("[step5] lesson 1's GradScaler takes its fused path through workshop::fused_unscale_") {
  REQUIRE(amp::fused_unscale_kernel(c10::DeviceType::CPU) == fusion::kUnscaleOpName);
  // The same training steps with the fused path and with lesson 1's plain tensor ops: the same parameters, the
  // same skip on an inf, the same scales.
  std::vector<double> scales[2];
  std::vector<torch::Tensor> params[2];
  std::vector<bool> stepped[2];
  const amp::KernelPath paths[2] = {amp::KernelPath::kFused, amp::KernelPath::kPlain};
  for (int p = 0; p < 2; ++p) {
    torch::manual_seed(5);
    torch::Tensor w = torch::randn({50000}).requires_grad_(true), b = torch::randn({3}).requires_grad_(true);
    torch::optim::SGD sgd({w, b}, 0.1);
    amp::GradScalerOptions options;
    options.init_scale = 1024;
    options.growth_interval = 2;
    options.kernels = paths[p];
    amp::GradScaler scaler(options);
    for (int it = 0; it < 5; ++it) {
      sgd.zero_grad();
      torch::Tensor loss = (w * w).sum() * 1e-3 + b.sum();
      if (it == 2) loss = loss * std::numeric_limits<float>::infinity();  // an overflow: inf gradients
      scaler.scale(loss).backward();
      stepped[p].push_back(scaler.step(sgd));
      scaler.update();
      scales[p].push_back(scaler.get_scale());
    }
    params[p] = {w.detach(), b.detach()};
  }
  CHECK(stepped[0] == std::vector<bool>{true, true, false, true, true});
  CHECK(stepped[0] == stepped[1]);
  CHECK(scales[0] == scales[1]);
  CHECK(scales[0] == std::vector<double>{1024, 2048, 1024, 1024, 2048});
  CHECK(torch::equal(params[0][0], params[1][0]));
  CHECK(torch::equal(params[0][1], params[1][1]));
}

TEST_CASE("[step5] on 4 ATen threads the unscale is one parallel region, with the one-thread bits and flag") {
  std::vector<torch::Tensor> before = scaled_grads(24);
  // Large 16-bit gradients: each thread's share takes long enough that the threads really overlap in time.
  before.push_back((torch::randn({(1 << 22) + 5}) * 1024).to(torch::kBFloat16));
  before.push_back((torch::randn({1 << 21}) * 1024).to(torch::kHalf));
  for (bool with_inf : {false, true, false}) {
    CAPTURE(with_inf);
    std::vector<torch::Tensor> one = clones(before), four = clones(before);
    if (with_inf) {
      one[7][3000000] = INFINITY;
      four[7][3000000] = INFINITY;
    }
    torch::Tensor found_one = torch::zeros({1}), found_four = torch::zeros({1});
    {
      const ThreadsFor threads(1);
      fusion::fused_unscale_(one, found_one, torch::full({1}, 0.25f));
    }
    const ThreadsFor threads(4);
    const int regions = parallel_regions([&] { fusion::fused_unscale_(four, found_four, torch::full({1}, 0.25f)); });
    CHECK(found_four.item<float>() == (with_inf ? 1.0f : 0.0f));
    CHECK(found_four.item<float>() == found_one.item<float>());
    for (size_t i = 0; i < one.size(); ++i)
      CHECK(torch::equal(four[i].nan_to_num(0, 1, -1), one[i].nan_to_num(0, 1, -1)));
    if (regions_are_counted()) {
      CHECK(regions == 1);
    } else {
      MESSAGE("parallel regions are not counted here (no OpenMP in this LibTorch)");
    }
  }
}

TEST_CASE("[step5] lesson 1's GradScaler, auto and fused, unscales float64 gradients that the operator refuses") {
  REQUIRE(amp::fused_unscale_kernel(c10::DeviceType::CPU) == fusion::kUnscaleOpName);
  // The operator takes float32, bfloat16 and float16 only; ATen's unscale also takes float64, so the scaler falls
  // back to another kernel for it instead of throwing.
  std::vector<torch::Tensor> params[3];
  std::vector<bool> stepped[3];
  const amp::KernelPath paths[3] = {amp::KernelPath::kAuto, amp::KernelPath::kFused, amp::KernelPath::kPlain};
  for (int p = 0; p < 3; ++p) {
    CAPTURE(p);
    torch::manual_seed(6);
    torch::Tensor w = torch::randn({5000}, torch::kDouble).requires_grad_(true);
    torch::Tensor b = torch::randn({3}).requires_grad_(true);  // float32 beside it: a list of two dtypes
    torch::optim::SGD sgd({w, b}, 0.1);
    amp::GradScalerOptions options;
    options.init_scale = 256;
    options.kernels = paths[p];
    amp::GradScaler scaler(options);
    for (int it = 0; it < 3; ++it) {
      sgd.zero_grad();
      torch::Tensor loss = (w * w).sum() * 1e-3 + b.sum();
      if (it == 1) loss = loss * std::numeric_limits<double>::infinity();
      scaler.scale(loss).backward();
      stepped[p].push_back(scaler.step(sgd));
      scaler.update();
    }
    params[p] = {w.detach(), b.detach()};
  }
  CHECK(stepped[0] == std::vector<bool>{true, false, true});
  for (int p = 0; p < 2; ++p) {
    CHECK(stepped[p] == stepped[2]);
    CHECK(torch::equal(params[p][0], params[2][0]));
    CHECK(torch::equal(params[p][1], params[2][1]));
  }
}

TEST_CASE("[step5] nothing past a gradient's end is read or written: every tail and dtype against walls") {
  // Every gradient ends at an inaccessible page (guarded_copy). A 16-bit tail read whole would also see
  // whatever lies past the end, and could set found_inf from it.
  std::vector<torch::Tensor> plain;
  torch::manual_seed(15);
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t n : tail_sizes()) plain.push_back((torch::randn({n}) * 1024).to(dtype));
  }
  for (float inv : {0.5f, 1.0f}) {
    CAPTURE(inv);
    std::vector<torch::Tensor> walled;
    for (const torch::Tensor& g : plain) walled.push_back(guarded_copy(g));
    torch::Tensor found_inf = torch::zeros({1});
    fusion::fused_unscale_(walled, found_inf, torch::full({1}, inv));
    CHECK(found_inf.item<float>() == 0.0f);
    for (size_t i = 0; i < plain.size(); ++i) {
      CAPTURE(i);
      CHECK(torch::equal(walled[i], (plain[i].to(torch::kFloat) * inv).to(plain[i].scalar_type())));
    }
  }
}

namespace {

// The scaler's tensors of the AdamW operators (step 5).
struct Scaler {
  c10::optional<at::Tensor> grad_scale, found_inf;
};

// grad_scale `scale`, found_inf `flag` (each left out when NaN).
Scaler scaler_with(float scale, float flag) {
  Scaler scaler;
  if (!std::isnan(scale)) scaler.grad_scale = torch::full({1}, scale);
  if (!std::isnan(flag)) scaler.found_inf = torch::full({1}, flag);
  return scaler;
}

// GradScaler's inverse of a scale (lesson 1: scale.double().reciprocal().float()).
float inverse_of(float scale) { return static_cast<float>(1.0 / static_cast<double>(scale)); }

bool same_state(const State& a, const State& b) {
  return torch::equal(a.param, b.param) && torch::equal(a.exp_avg, b.exp_avg) &&
         torch::equal(a.exp_avg_sq, b.exp_avg_sq);
}

State copy_of(const State& s) {
  State c;
  c.param = s.param.clone();
  c.exp_avg = s.exp_avg.clone();
  c.exp_avg_sq = s.exp_avg_sq.clone();
  c.step = s.step;
  return c;
}

}  // namespace

// Tagged step 4: both schemas are registered once steps 3 and 4 are done; step 5 gives the two arguments meaning.
TEST_CASE("[step4] both AdamW operators take grad_scale and found_inf as ATen's do: optional, keyword-only, last") {
  for (const char* name : {fusion::kOpName, fusion::kMultiOpName}) {
    CAPTURE(name);
    const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
    const auto& args = op.schema().arguments();
    REQUIRE(args.size() == 12);
    CHECK(args[9].name() == "step");
    CHECK_FALSE(args[9].kwarg_only());
    for (size_t i : {10, 11}) {
      CAPTURE(i);
      CHECK(args[i].name() == (i == 10 ? "grad_scale" : "found_inf"));
      CHECK(args[i].kwarg_only());
      CHECK(args[i].type()->str() == "Tensor?");
    }
  }
}

TEST_CASE("[step5] one pass with grad_scale is GradScaler's unscale and then the step, bit for bit (float32)") {
  // 65536: a power of two, 3: a scale whose inverse rounds, 0.5: a scale below 1.
  const int64_t n = 40003;
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (float scale : {65536.0f, 3.0f, 0.5f}) {
    for (bool with_flag : {false, true}) {  // found_inf given and 0 changes nothing
      CAPTURE(scale);
      CAPTURE(with_flag);
      torch::manual_seed(19);
      State one_pass = make_state(torch::randn({n}));
      State two_passes = copy_of(one_pass);
      for (int64_t step = 1; step <= 3; ++step) {
        const torch::Tensor grad = torch::randn({n}) * scale;
        const torch::Tensor grad_before = grad.clone();
        fusion::fused_adamw_(one_pass.param, grad, one_pass.exp_avg, one_pass.exp_avg_sq, hyper, step,
                             scaler_with(scale, with_flag ? 0.0f : NAN).grad_scale,
                             scaler_with(scale, with_flag ? 0.0f : NAN).found_inf);
        CHECK(torch::equal(grad, grad_before));  // read, never written
        std::vector<torch::Tensor> unscaled = {grad.clone()};
        torch::Tensor found_inf = torch::zeros({1});
        fusion::fused_unscale_(unscaled, found_inf, torch::full({1}, inverse_of(scale)));
        REQUIRE(found_inf.item<float>() == 0.0f);
        fusion::fused_adamw_(two_passes.param, unscaled[0], two_passes.exp_avg, two_passes.exp_avg_sq, hyper, step);
        CHECK(same_state(one_pass, two_passes));
      }
    }
  }
}

TEST_CASE("[step5] 16-bit parameters: the float32 step on the float32 unscaled gradient, rounded once") {
  const int64_t n = 32768 + 7;
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (torch::ScalarType dtype : {torch::kBFloat16, torch::kHalf}) {
    CAPTURE(dtype_name(dtype));
    torch::manual_seed(23);
    const torch::Tensor start = torch::randn({n}).to(dtype);
    const torch::Tensor grad = (torch::randn({n}) * 1024).to(dtype);
    State scaled = make_state(start.clone());
    fusion::fused_adamw_(scaled.param, grad, scaled.exp_avg, scaled.exp_avg_sq, hyper, 1, torch::full({1}, 1024.0f),
                         torch::zeros({1}));
    State master = make_state(start.to(torch::kFloat));
    fusion::fused_adamw_(master.param, grad.to(torch::kFloat) * inverse_of(1024.0f), master.exp_avg, master.exp_avg_sq,
                         hyper, 1);
    CHECK(torch::equal(scaled.param, master.param.to(dtype)));
    CHECK(torch::equal(scaled.exp_avg, master.exp_avg));
    CHECK(torch::equal(scaled.exp_avg_sq, master.exp_avg_sq));
  }
}

TEST_CASE("[step5] a found_inf that is not 0 skips the step: nothing written, in one tensor and in a list") {
  // 1 as a scaler sets it, 2 as a flag summed over two ranks, NaN; with and without grad_scale; a skipped step does
  // not look at the scale (0 here would otherwise be refused).
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (float flag : {1.0f, 2.0f, NAN}) {
    for (float scale : {1024.0f, NAN, 0.0f}) {
      CAPTURE(flag);
      CAPTURE(scale);
      Scaler scaler = scaler_with(scale, 0.0f);
      scaler.found_inf = torch::full({1}, flag);
      torch::manual_seed(29);
      State s = make_state(torch::randn({1000}));
      s.exp_avg.normal_();
      s.exp_avg_sq.uniform_();
      const State before = copy_of(s);
      const torch::Tensor grad = torch::randn({1000});
      fusion::fused_adamw_(s.param, grad, s.exp_avg, s.exp_avg_sq, hyper, 2, scaler.grad_scale, scaler.found_inf);
      CHECK(same_state(s, before));
      std::vector<torch::Tensor> params = {s.param, torch::randn({33}).to(torch::kBFloat16)};
      const std::vector<torch::Tensor> params_before = clones(params);
      fusion::fused_adamw_multi_(params, {grad, torch::randn({33}).to(torch::kBFloat16)},
                                 {s.exp_avg, torch::zeros({33})}, {s.exp_avg_sq, torch::zeros({33})}, hyper, 2,
                                 scaler.grad_scale, scaler.found_inf);
      for (size_t i = 0; i < params.size(); ++i) CHECK(torch::equal(params[i], params_before[i]));
      CHECK(same_state(s, before));
    }
  }
}

TEST_CASE("[step5] the multi-tensor operator with grad_scale gives each tuple what the single operator gives it") {
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  const std::vector<std::pair<int64_t, torch::ScalarType>> shapes = {
      {40000, torch::kFloat}, {7, torch::kBFloat16}, {0, torch::kFloat}, {33, torch::kHalf}, {5001, torch::kFloat}};
  torch::manual_seed(31);
  std::vector<State> multi, single;
  std::vector<torch::Tensor> grads;
  for (const auto& [numel, dtype] : shapes) {
    multi.push_back(make_state(torch::randn({numel}).to(dtype)));
    single.push_back(copy_of(multi.back()));
    grads.push_back((torch::randn({numel}) * 3).to(dtype));
  }
  std::vector<torch::Tensor> params, exp_avgs, exp_avg_sqs;
  for (State& s : multi) {
    params.push_back(s.param);
    exp_avgs.push_back(s.exp_avg);
    exp_avg_sqs.push_back(s.exp_avg_sq);
  }
  fusion::fused_adamw_multi_(params, grads, exp_avgs, exp_avg_sqs, hyper, 1, torch::full({1}, 3.0f), torch::zeros({1}));
  for (size_t i = 0; i < shapes.size(); ++i) {
    CAPTURE(i);
    fusion::fused_adamw_(single[i].param, grads[i], single[i].exp_avg, single[i].exp_avg_sq, hyper, 1,
                         torch::full({1}, 3.0f), torch::zeros({1}));
    CHECK(same_state(multi[i], single[i]));
  }
}

TEST_CASE("[step5] bad scaler tensors give their named errors, and nothing is written") {
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  struct Bad {
    std::string what;
    Scaler scaler;
    std::string message;  // after the operator's name
  };
  std::vector<Bad> cases = {
      {"two-element grad_scale", {torch::ones({2}), {}}, "grad_scale must be a one-element float32 tensor, got 2"},
      {"float64 grad_scale", {torch::ones({1}, torch::kDouble), {}}, "grad_scale must be a one-element float32 tensor"},
      {"int found_inf", {{}, torch::zeros({1}, torch::kInt)}, "found_inf must be a one-element float32 tensor"},
      {"empty found_inf", {{}, torch::zeros({0})}, "found_inf must be a one-element float32 tensor, got 0"},
      {"grad_scale first", {torch::ones({3}), torch::zeros({0})}, "grad_scale must be"},
      {"zero scale", {torch::zeros({1}), torch::zeros({1})}, "grad_scale must be finite and > 0, got 0"},
      {"negative scale", {torch::full({1}, -2.0f), {}}, "grad_scale must be finite and > 0, got -2"},
      {"infinite scale", {torch::full({1}, INFINITY), {}}, "grad_scale must be finite and > 0, got inf"},
      {"NaN scale", {torch::full({1}, NAN), {}}, "grad_scale must be finite and > 0, got nan"},
  };
  for (const Bad& bad : cases) {
    CAPTURE(bad.what);
    torch::manual_seed(37);
    State s = make_state(torch::randn({100}));
    const State before = copy_of(s);
    const torch::Tensor grad = torch::randn({100});
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_(s.param, grad, s.exp_avg, s.exp_avg_sq, hyper, 1, bad.scaler.grad_scale,
                                              bad.scaler.found_inf),
                         Contains(("fused_adamw_: " + bad.message).c_str()), c10::Error);
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_({s.param}, {grad}, {s.exp_avg}, {s.exp_avg_sq}, hyper, 1,
                                                    bad.scaler.grad_scale, bad.scaler.found_inf),
                         Contains(("fused_adamw_multi_: " + bad.message).c_str()), c10::Error);
    CHECK(same_state(s, before));
  }
  SUBCASE("a scaler tensor on another device than the parameter") {
    // Called as the CPU kernel directly: the dispatcher would pick the meta kernel for a meta tensor.
    State s = make_state(torch::randn({10}));
    const State before = copy_of(s);
    const torch::Tensor meta = torch::empty({1}, torch::TensorOptions().device(torch::kMeta));
    for (int which : {0, 1}) {
      CAPTURE(which);
      const c10::optional<at::Tensor> given = meta, none;
      const std::string name = which == 0 ? "grad_scale" : "found_inf";
      CHECK_THROWS_WITH_AS(fusion::fused_adamw_cpu(s.param, torch::randn({10}), s.exp_avg, s.exp_avg_sq, 1e-2, 0.9,
                                                   0.999, 1e-8, 0.1, 1, which == 0 ? given : none,
                                                   which == 1 ? given : none),
                           Contains(("fused_adamw_: " + name + " is not on param's device (cpu), got meta").c_str()),
                           c10::Error);
      CHECK_THROWS_WITH_AS(fusion::check_scaler_args("fused_adamw_multi_", s.param, which == 0 ? given : none,
                                                     which == 1 ? given : none),
                           Contains(("fused_adamw_multi_: " + name + " is not on param's device").c_str()), c10::Error);
    }
    CHECK(same_state(s, before));
  }
}

// ---- step 6: the kernels on a GPU ------------------------------------------------------------------------

TEST_CASE("[step6] launch_shape: a thread per pack, blocks rounded up, at most 4 blocks per multiprocessor") {
  using fusion::cuda::launch_shape;
  const fusion::cuda::LaunchShape none = launch_shape(0, 4, 132);
  CHECK(none.blocks == 0);
  CHECK(none.threads == 256);
  CHECK(launch_shape(1, 4, 132).blocks == 1);     // one partial pack still needs a block
  CHECK(launch_shape(1024, 4, 132).blocks == 1);  // 256 packs: one block of 256 threads
  CHECK(launch_shape(1025, 4, 132).blocks == 2);  // 257 packs (the last partial): a second block
  CHECK(launch_shape(1025, 1, 132).blocks == 5);  // one element per pack
  CHECK(launch_shape(8192, 8, 132).blocks == 4);
  CHECK(launch_shape(int64_t{1} << 26, 4, 132).blocks == 528);  // 64 Mi elements: the cap, 132 x 4
  CHECK(launch_shape(int64_t{1} << 40, 1, 1).blocks == 4);
  // Whatever the size: the grid either covers every pack with one thread, without a block to spare, or is capped.
  for (int64_t numel : {2, 255, 256, 257, 4097, 100003, 1 << 20}) {
    for (int width : {1, 2, 4, 8}) {
      CAPTURE(numel);
      CAPTURE(width);
      const fusion::cuda::LaunchShape s = launch_shape(numel, width, 8);
      CHECK(s.threads == 256);
      const int64_t covered = s.blocks * s.threads * width;
      CHECK((s.blocks == 32 || (covered >= numel && covered - s.threads * width < numel)));
      CHECK(s.blocks <= 32);
      CHECK(s.blocks >= 1);
    }
  }
}

TEST_CASE("[step6] launch_shape refuses a negative size, an odd vector width and no multiprocessors") {
  using fusion::cuda::launch_shape;
  CHECK_THROWS_WITH_AS(launch_shape(-1, 4, 8), Contains("launch_shape: numel must be >= 0, got -1"), c10::Error);
  CHECK_THROWS_WITH_AS(launch_shape(16, 3, 8), Contains("launch_shape: vector_width must be 1, 2, 4 or 8, got 3"),
                       c10::Error);
  CHECK_THROWS_WITH_AS(launch_shape(16, 0, 8), Contains("vector_width must be 1, 2, 4 or 8"), c10::Error);
  CHECK_THROWS_WITH_AS(launch_shape(16, 4, 0), Contains("launch_shape: multiprocessors must be >= 1, got 0"),
                       c10::Error);
}

// ---- step 6 on any machine: the same CUDA kernels on a simulated grid on the CPU (grid.h) ---------------

namespace {

// A simulated grid of `multiprocessors` multiprocessors (so at most 4 x 256 x that many threads: every size below
// that grid's reach makes the grid-stride loops go round), its blocks shuffled by `seed`.
fusion::cuda::Target cpu_grid(int multiprocessors, uint64_t seed) {
  fusion::cuda::Target target;
  target.simulated_multiprocessors = multiprocessors;
  target.seed = seed;
  return target;
}

fusion::cuda::Dtype kernel_dtype(torch::ScalarType dtype) {
  if (dtype == torch::kBFloat16) return fusion::cuda::Dtype::BFloat16;
  if (dtype == torch::kHalf) return fusion::cuda::Dtype::Float16;
  REQUIRE(dtype_name(dtype) == "Float");
  return fusion::cuda::Dtype::Float32;
}

// One AdamW step of fused_adamw_cuda.cu's kernel on the CPU grid, for CPU tensors (raw pointers).
void grid_adamw(State& s, const torch::Tensor& grad, const fusion::AdamWHyper& hyper,
                const fusion::cuda::Target& target) {
  ++s.step;
  const char* error =
      fusion::cuda::launch_adamw(kernel_dtype(s.param.scalar_type()), s.param.data_ptr(), grad.data_ptr(),
                                 s.exp_avg.data_ptr<float>(), s.exp_avg_sq.data_ptr<float>(), s.param.numel(), hyper,
                                 s.step, target);
  INFO("launch_adamw: " << (error == nullptr ? "ok" : error));
  REQUIRE(error == nullptr);
}

// The unscale kernel on the CPU grid for each gradient, one launch each (as given_cuda.cc launches them).
void grid_unscale(std::vector<torch::Tensor>& grads, torch::Tensor& found_inf, float inv,
                  const fusion::cuda::Target& target) {
  const torch::Tensor inv_scale = torch::full({1}, inv);
  for (torch::Tensor& g : grads) {
    const char* error = fusion::cuda::launch_unscale(kernel_dtype(g.scalar_type()), g.data_ptr(), g.numel(),
                                                     found_inf.data_ptr<float>(), inv_scale.data_ptr<float>(), target);
    INFO("launch_unscale: " << (error == nullptr ? "ok" : error));
    REQUIRE(error == nullptr);
  }
}

// How far one grid step of `s` lands from the float32 step of given.cc on the same state and gradient, per element:
// the state within a relative 1e-6 (a GPU rounds with fused multiply-adds, the ATen ops on a CPU without), the
// parameter within one unit in its last place (its float32 results may straddle a rounding boundary of a 16-bit
// type), and a 16-bit parameter exactly the rounded float32 result in at least 99 % of the elements (a kernel that
// truncates differs in about half). Every element is compared, so one that is updated twice or not at all shows.
void check_grid_step(State& s, const torch::Tensor& grad, const fusion::AdamWHyper& hyper,
                     const fusion::cuda::Target& target) {
  const torch::ScalarType dtype = s.param.scalar_type();
  State master = make_state(s.param.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true));
  master.exp_avg = s.exp_avg.clone();
  master.exp_avg_sq = s.exp_avg_sq.clone();
  master.step = s.step;
  fusion::unfused_adamw_step(master.param, grad.to(torch::kFloat), master.exp_avg, master.exp_avg_sq, hyper,
                             ++master.step);
  grid_adamw(s, grad, hyper, target);
  const double ulp = dtype == torch::kFloat      ? std::ldexp(1.0, -22)
                     : dtype == torch::kBFloat16 ? std::ldexp(1.0, -7)
                                                 : std::ldexp(1.0, -10);
  // Relative to each element, with a floor of 1e-6 of the largest (where a sum nearly cancels, one rounding more
  // or less is large against the result).
  const auto within = [](const torch::Tensor& got, const torch::Tensor& want, double relative) {
    const double floor = 1e-6 * want.abs().max().item<double>();
    return ((got.to(torch::kFloat) - want).abs() <= want.abs() * relative + floor).all().item<bool>();
  };
  CHECK(within(s.exp_avg, master.exp_avg, 1e-6));
  CHECK(within(s.exp_avg_sq, master.exp_avg_sq, 1e-6));
  CHECK(within(s.param, master.param, ulp));
  if (dtype != torch::kFloat) {  // (in float32, a multiply-add differs in the last bit of about 2 % of the elements)
    const double exact = s.param.eq(master.param.to(dtype)).to(torch::kDouble).mean().item<double>();
    CAPTURE(exact);
    CHECK(exact >= 0.99);
  }
}

// A tensor of `n` elements of `dtype` that starts `offset` elements into a buffer with one guard element after it.
torch::Tensor view_in_buffer(const torch::Tensor& values, int64_t offset, torch::Tensor& buffer) {
  const int64_t n = values.numel();
  buffer = torch::full({offset + n + 1}, 0.5, values.options());
  torch::Tensor view = buffer.narrow(0, offset, n);
  view.copy_(values);
  return view;
}

}  // namespace

TEST_CASE(
    "[step6] CPU grid: the CUDA kernel follows torch::optim::AdamW for 100 steps, grid-stride loops going round") {
  const int64_t n = 10007;  // packs of 4 and a tail of 3; 2.4 times the reach of a one-multiprocessor grid
  REQUIRE(fusion::cuda::launch_shape(n, 4, 1).blocks * 256 * 4 < n);
  for (double weight_decay : {0.0, 0.1}) {
    CAPTURE(weight_decay);
    const fusion::AdamWHyper hyper = hyper_with(1e-2, weight_decay);
    torch::manual_seed(3);
    const torch::Tensor start = torch::randn({n});
    torch::Tensor reference = start.clone().requires_grad_(true);
    torch::optim::AdamW optimizer({reference}, fusion::adamw_options(hyper));
    State grid = make_state(start.clone());
    double worst = 0;
    uint64_t seed = 1;
    for (const torch::Tensor& grad : gradients(n, 100, 1.0)) {
      reference.mutable_grad() = grad.clone();
      optimizer.step();
      grid_adamw(grid, grad, hyper, cpu_grid(1, seed++));
      worst = std::max(worst, rel_error({grid.param}, {reference.detach()}));
    }
    CAPTURE(worst);
    CHECK(worst <= kFloatTolerance);
  }
}

TEST_CASE("[step6] CPU grid: every size, tail and alignment, in every dtype, is the float32 step rounded once") {
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  std::vector<int64_t> sizes;
  for (int64_t r = 0; r < 8; ++r) sizes.insert(sizes.end(), {r + 1, 8 + r, 3 * 4096 + r, (1 << 16) + r});
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t n : sizes) {
      for (int64_t offset : {0, 1}) {  // 0: every pointer aligned to a pack; 1: a view that starts mid-pack
        CAPTURE(dtype_name(dtype));
        CAPTURE(n);
        CAPTURE(offset);
        torch::manual_seed(n);
        torch::Tensor param_buffer, m_buffer, v_buffer, grad_buffer;
        State s;
        s.param = view_in_buffer(torch::randn({n}).to(dtype), offset, param_buffer);
        s.exp_avg = view_in_buffer(torch::zeros({n}), offset, m_buffer);
        s.exp_avg_sq = view_in_buffer(torch::zeros({n}), offset, v_buffer);
        const int multiprocessors = n % 2 == 0 ? 1 : 3;
        for (const torch::Tensor& grad32 : gradients(n, 2, 1.0)) {
          const torch::Tensor grad = view_in_buffer(grad32.to(dtype), offset, grad_buffer);
          check_grid_step(s, grad, hyper, cpu_grid(multiprocessors, static_cast<uint64_t>(n + s.step)));
        }
        // Nothing written outside the tensors: the element before a view, the guard after each.
        for (const torch::Tensor& buffer : {param_buffer, m_buffer, v_buffer}) {
          if (offset == 1) CHECK(buffer[0].item<float>() == 0.5f);
          CHECK(buffer[offset + n].item<float>() == 0.5f);
        }
      }
    }
  }
}

TEST_CASE("[step6] CPU grid: parameters of every size and dtype in one list, as the CUDA multi-tensor operator runs") {
  Lists lists = make_lists(31);
  std::vector<State> states;
  for (size_t i = 0; i < lists.params.size(); ++i) {
    State s;
    s.param = lists.params[i];
    s.exp_avg = lists.exp_avgs[i];
    s.exp_avg_sq = lists.exp_avg_sqs[i];
    states.push_back(s);
  }
  for (int step = 1; step <= 3; ++step) {
    for (size_t i = 0; i < states.size(); ++i) {
      CAPTURE(i);
      if (states[i].param.numel() == 0) {
        grid_adamw(states[i], lists.grads[i], hyper_with(1e-2, 0.1), cpu_grid(2, i));  // an empty tensor: no-op
        continue;
      }
      check_grid_step(states[i], lists.grads[i], hyper_with(1e-2, 0.1), cpu_grid(2, i + 10 * step));
    }
  }
}

TEST_CASE("[step6] CPU grid unscale: each value multiplied and rounded once, found_inf from the values as read") {
  std::vector<torch::Tensor> before = scaled_grads(41);
  for (int64_t r = 1; r < 8; ++r) before.push_back((torch::randn({4096 * 3 + r}) * 1024).to(torch::kHalf));
  before.push_back(torch::full({9}, 1e38f));                      // float32 x 16 overflows: the value read was finite
  before.push_back(torch::full({13}, 60000.0).to(torch::kHalf));  // float16 x 4 overflows to inf
  for (float inv : {1.0f / 1024, 0.1f, 1.0f, 16.0f}) {
    for (int multiprocessors : {1, 3}) {
      CAPTURE(inv);
      CAPTURE(multiprocessors);
      std::vector<torch::Tensor> grads = clones(before);
      torch::Tensor found_inf = torch::zeros({1});
      grid_unscale(grads, found_inf, inv, cpu_grid(multiprocessors, 5));
      CHECK(found_inf.item<float>() == 0.0f);
      for (size_t i = 0; i < grads.size(); ++i) {
        CAPTURE(i);
        CHECK(torch::equal(grads[i], (before[i].to(torch::kFloat) * inv).to(before[i].scalar_type())));
      }
    }
  }
}

TEST_CASE(
    "[step6] CPU grid unscale: an inf or a NaN anywhere sets found_inf, at any scale, and every value is still unscaled") {
  std::vector<torch::Tensor> before = scaled_grads(42);
  before.push_back((torch::randn({4096 * 3 + 5}) * 1024).to(torch::kHalf));
  // (gradient, element): the first of all, the end of the float32 tensor past a grid's reach, a 16-bit tail, the
  // last element of the list, a one-element gradient.
  const std::vector<std::pair<size_t, int64_t>> places = {{0, 0}, {3, 100002}, {4, 32}, {7, 4096 * 3 + 4}, {6, 0}};
  for (const auto& [t, k] : places) {
    for (float bad : {INFINITY, NAN}) {
      for (float inv : {0.5f, 1.0f}) {   // at a scale of 1 nothing is multiplied, but the check still runs
        for (int64_t offset : {0, 1}) {  // 1: the gradients start mid-pack: the one-element path
          CAPTURE(t);
          CAPTURE(k);
          CAPTURE(bad);
          CAPTURE(inv);
          CAPTURE(offset);
          std::vector<torch::Tensor> buffers(before.size()), grads;
          for (size_t i = 0; i < before.size(); ++i) grads.push_back(view_in_buffer(before[i], offset, buffers[i]));
          grads[t][k] = bad;
          const std::vector<torch::Tensor> expected = clones(grads);
          torch::Tensor found_inf = torch::zeros({1});
          grid_unscale(grads, found_inf, inv, cpu_grid(1, 9));
          CHECK(found_inf.item<float>() == 1.0f);
          for (size_t i = 0; i < grads.size(); ++i) {  // every element, those after the bad one included
            const torch::Tensor want = (expected[i].to(torch::kFloat) * inv).to(expected[i].scalar_type());
            CHECK(torch::equal(grads[i].nan_to_num(0, 1, -1), want.nan_to_num(0, 1, -1)));
          }
        }
      }
    }
  }
}

TEST_CASE("[step6] CPU grid: the AdamW kernel unscales in its pass and skips on found_inf, read on the device") {
  const int64_t n = 10007;  // beyond a one-multiprocessor grid's reach: the grid-stride loop goes round
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (int64_t offset : {0, 1}) {  // 1: a view that starts mid-pack, the one-element path
    CAPTURE(offset);
    torch::manual_seed(41);
    torch::Tensor p_buffer, q_buffer;
    const torch::Tensor start = torch::randn({n});
    State scaled = make_state(view_in_buffer(start, offset, p_buffer));
    State plain = make_state(view_in_buffer(start, offset, q_buffer));
    const float scale = 3.0f, zero = 0.0f;
    for (int64_t step = 1; step <= 2; ++step) {
      const torch::Tensor grad = torch::randn({n}) * scale;
      const torch::Tensor grad_before = grad.clone();
      const torch::Tensor unscaled = grad * inverse_of(scale);  // the float32 product, as the kernel forms it
      const char* error =
          fusion::cuda::launch_adamw(fusion::cuda::Dtype::Float32, scaled.param.data_ptr(), grad.data_ptr(),
                                     scaled.exp_avg.data_ptr<float>(), scaled.exp_avg_sq.data_ptr<float>(), n, hyper,
                                     step, cpu_grid(1, 5 + step), &scale, &zero);
      REQUIRE(error == nullptr);
      error = fusion::cuda::launch_adamw(fusion::cuda::Dtype::Float32, plain.param.data_ptr(), unscaled.data_ptr(),
                                         plain.exp_avg.data_ptr<float>(), plain.exp_avg_sq.data_ptr<float>(), n, hyper,
                                         step, cpu_grid(1, 5 + step));
      REQUIRE(error == nullptr);
      CHECK(same_state(scaled, plain));
      CHECK(torch::equal(grad, grad_before));
    }
    for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      CAPTURE(dtype_name(dtype));
      State s = make_state(torch::randn({n}).to(dtype));
      const State before = copy_of(s);
      const torch::Tensor grad = torch::randn({n}).to(dtype);
      const float flag = 1.0f;
      const char* error = fusion::cuda::launch_adamw(kernel_dtype(dtype), s.param.data_ptr(), grad.data_ptr(),
                                                     s.exp_avg.data_ptr<float>(), s.exp_avg_sq.data_ptr<float>(), n,
                                                     hyper, 1, cpu_grid(2, 3), &scale, &flag);
      REQUIRE(error == nullptr);
      CHECK(same_state(s, before));
    }
  }
}

namespace {

// Every state of `states` (one dtype) with its gradient, through launch_adamw_multi on the CPU grid; the launches.
int64_t grid_adamw_multi(std::vector<State>& states, const std::vector<torch::Tensor>& grads,
                         const fusion::AdamWHyper& hyper, int64_t step, const fusion::cuda::Target& target,
                         const float* grad_scale = nullptr, const float* found_inf = nullptr) {
  std::vector<fusion::cuda::TensorPointers> tensors;
  for (size_t i = 0; i < states.size(); ++i) {
    fusion::cuda::TensorPointers t;
    t.param = states[i].param.data_ptr();
    t.grad = grads[i].data_ptr();
    t.exp_avg = states[i].exp_avg.data_ptr<float>();
    t.exp_avg_sq = states[i].exp_avg_sq.data_ptr<float>();
    t.numel = states[i].param.numel();
    tensors.push_back(t);
  }
  int64_t launches = -1;
  const char* error = fusion::cuda::launch_adamw_multi(kernel_dtype(states.at(0).param.scalar_type()), tensors.data(),
                                                       static_cast<int64_t>(tensors.size()), hyper, step, target,
                                                       grad_scale, found_inf, &launches);
  INFO("launch_adamw_multi: " << (error == nullptr ? "ok" : error));
  REQUIRE(error == nullptr);
  return launches;
}

}  // namespace

TEST_CASE(
    "[step6] CPU grid multi-tensor: each tensor gets launch_adamw's bits, in as few launches as the limits allow") {
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  const auto check_against_single = [&](std::vector<State>& multi, const std::vector<torch::Tensor>& grads,
                                        int64_t expected_launches, const float* grad_scale) {
    std::vector<State> single;
    for (const State& s : multi) single.push_back(copy_of(s));
    CHECK(grid_adamw_multi(multi, grads, hyper, 1, cpu_grid(2, 7), grad_scale) == expected_launches);
    for (size_t i = 0; i < multi.size(); ++i) {
      if (single[i].param.numel() == 0) continue;
      const char* error =
          fusion::cuda::launch_adamw(kernel_dtype(single[i].param.scalar_type()), single[i].param.data_ptr(),
                                     grads[i].data_ptr(), single[i].exp_avg.data_ptr<float>(),
                                     single[i].exp_avg_sq.data_ptr<float>(), single[i].param.numel(), hyper, 1,
                                     cpu_grid(1, 3), grad_scale);
      REQUIRE(error == nullptr);
      CAPTURE(i);
      CHECK(same_state(multi[i], single[i]));
    }
  };
  SUBCASE("100 small float32 tensors, an empty one among them: 36 + 36 + 27 tensors, three launches") {
    torch::manual_seed(43);
    std::vector<State> states;
    std::vector<torch::Tensor> grads;
    for (int k = 0; k < 100; ++k) {
      const int64_t numel = k == 50 ? 0 : (k * 997) % 5003 + 1;  // 1..5003 elements: tails of every length
      states.push_back(make_state(torch::randn({numel})));
      grads.push_back(torch::randn({numel}));
    }
    check_against_single(states, grads, 3, nullptr);
  }
  SUBCASE("grad_scale in every launch, and a found_inf of 1 writes nothing") {
    torch::manual_seed(47);
    std::vector<State> states;
    std::vector<torch::Tensor> grads;
    for (int k = 0; k < 40; ++k) {
      states.push_back(make_state(torch::randn({k * 31 + 5}).to(torch::kHalf)));
      grads.push_back((torch::randn({k * 31 + 5}) * 8).to(torch::kHalf));
    }
    const float scale = 8.0f, flag = 1.0f;
    std::vector<State> before;
    for (const State& s : states) before.push_back(copy_of(s));
    CHECK(grid_adamw_multi(states, grads, hyper, 1, cpu_grid(2, 5), &scale, &flag) == 2);
    for (size_t i = 0; i < states.size(); ++i) CHECK(same_state(states[i], before[i]));
    check_against_single(states, grads, 2, &scale);
  }
  SUBCASE("views that start mid-pack: one element at a time, the same bits") {
    torch::manual_seed(53);
    std::vector<torch::Tensor> buffers(6);
    std::vector<State> states;
    std::vector<torch::Tensor> grads;
    for (int k = 0; k < 6; ++k) {
      states.push_back(make_state(view_in_buffer(torch::randn({70001 + k}).to(torch::kBFloat16), k % 2, buffers[k])));
      grads.push_back(torch::randn({70001 + k}).to(torch::kBFloat16));
    }
    check_against_single(states, grads, 1, nullptr);  // 12 chunks: one launch
  }
  SUBCASE("a tensor of 321 chunks fills a launch and goes on in the next, with the two small tensors after it") {
    torch::manual_seed(59);
    const int64_t big = 320 * fusion::cuda::kChunkElements + 5;
    std::vector<State> states = {make_state(torch::randn({big}).to(torch::kBFloat16)),
                                 make_state(torch::randn({3}).to(torch::kBFloat16)),
                                 make_state(torch::randn({65537}).to(torch::kBFloat16))};
    std::vector<torch::Tensor> grads;
    for (const State& s : states) grads.push_back(torch::randn({s.param.numel()}).to(torch::kBFloat16));
    check_against_single(states, grads, 2, nullptr);
  }
  SUBCASE("only empty tensors: no launch") {
    std::vector<State> states = {make_state(torch::zeros({0})), make_state(torch::zeros({0}))};
    std::vector<torch::Tensor> grads = {torch::zeros({0}), torch::zeros({0})};
    CHECK(grid_adamw_multi(states, grads, hyper, 1, cpu_grid(1, 1)) == 0);
  }
}

namespace {

// The GPU cases need the kernels in the binary: Bazel builds them where LibTorch has CUDA and nvcc was found.
void require_cuda_kernels() {
  if (!WORKSHOP_CUDA_KERNELS) {
    FAIL(
        "step 6's CUDA kernels are not in this build: Bazel found no nvcc (or no libcudart) when it configured "
        "@libtorch. Install the CUDA toolkit or set NVCC=/path/to/nvcc, then `bazel sync --configure`.");
  }
}

State on_device(const State& s, const torch::Device& device) {
  State out;
  out.param = s.param.to(device, /*non_blocking=*/false, /*copy=*/true);
  out.exp_avg = s.exp_avg.to(device, false, true);
  out.exp_avg_sq = s.exp_avg_sq.to(device, false, true);
  out.step = s.step;
  return out;
}

const torch::Device kCuda(torch::kCUDA, 0);

}  // namespace

GPU_TEST_CASE("[step6] CUDA: the three operators have a CUDA kernel behind their names") {
  require_cuda_kernels();
  for (const char* name : {fusion::kOpName, fusion::kMultiOpName, fusion::kUnscaleOpName}) {
    CAPTURE(name);
    CHECK(c10::Dispatcher::singleton().findSchemaOrThrow(name, "").hasKernelForDispatchKey(c10::DispatchKey::CUDA));
  }
  CHECK(amp::fused_unscale_kernel(c10::DeviceType::CUDA) == fusion::kUnscaleOpName);  // lesson 1 picks it up
}

GPU_TEST_CASE("[step6] CUDA float32: the operator follows torch::optim::AdamW on the GPU for 100 steps") {
  require_cuda_kernels();
  const int64_t n = 100003;  // not a multiple of the pack: the tail runs too
  for (double weight_decay : {0.0, 0.1}) {
    CAPTURE(weight_decay);
    const fusion::AdamWHyper hyper = hyper_with(1e-2, weight_decay);
    torch::manual_seed(3);
    const torch::Tensor start = torch::randn({n}, kCuda);
    torch::Tensor reference = start.clone().requires_grad_(true);
    torch::optim::AdamW optimizer({reference}, fusion::adamw_options(hyper));
    State fused = on_device(make_state(start.cpu()), kCuda);
    double worst = 0;
    for (const torch::Tensor& grad : gradients(n, 100, 1.0)) {
      const torch::Tensor g = grad.to(kCuda);
      reference.mutable_grad() = g.clone();
      optimizer.step();
      fusion::fused_adamw_(fused.param, g, fused.exp_avg, fused.exp_avg_sq, hyper, ++fused.step);
      worst = std::max(worst, rel_error({fused.param.cpu()}, {reference.detach().cpu()}));
    }
    CAPTURE(worst);
    CHECK(worst <= kFloatTolerance);
  }
}

GPU_TEST_CASE("[step6] CUDA: every size and alignment gives the CPU operator's results, in every dtype") {
  require_cuda_kernels();
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t n : {1, 3, 4, 5, 1023, 1025, (1 << 20) + 3}) {
      for (int64_t offset : {0, 1}) {  // offset 1: a view that starts mid-pack, so the one-element path runs
        CAPTURE(dtype_name(dtype));
        CAPTURE(n);
        CAPTURE(offset);
        torch::manual_seed(n);
        const torch::Tensor base = torch::randn({n + offset}).to(dtype);
        State cpu = make_state(base.narrow(0, offset, n).clone());
        State gpu;
        const torch::Tensor gpu_base = base.to(kCuda);
        gpu.param = gpu_base.narrow(0, offset, n);
        const torch::Tensor moments = torch::zeros({2, n + offset}, torch::TensorOptions().device(kCuda));
        gpu.exp_avg = moments[0].narrow(0, offset, n);
        gpu.exp_avg_sq = moments[1].narrow(0, offset, n);
        for (const torch::Tensor& grad32 : gradients(n, 3, 1.0)) {
          const torch::Tensor grad = grad32.to(dtype);
          fusion::fused_adamw_(cpu.param, grad, cpu.exp_avg, cpu.exp_avg_sq, hyper, ++cpu.step);
          const torch::Tensor g = torch::zeros({n + offset}, torch::TensorOptions().dtype(dtype).device(kCuda));
          g.narrow(0, offset, n).copy_(grad);
          fusion::fused_adamw_(gpu.param, g.narrow(0, offset, n), gpu.exp_avg, gpu.exp_avg_sq, hyper, ++gpu.step);
        }
        // float32 arithmetic on both sides; a 16-bit parameter may round the other way where the two float32
        // results straddle a rounding boundary: one unit in the last place.
        const double ulp = dtype == torch::kFloat      ? 0.0
                           : dtype == torch::kBFloat16 ? std::ldexp(1.0, -7)
                                                       : std::ldexp(1.0, -10);
        const torch::Tensor p_cpu = cpu.param.to(torch::kFloat), p_gpu = gpu.param.cpu().to(torch::kFloat);
        CHECK(((p_gpu - p_cpu).abs() <= p_cpu.abs() * ulp + 1e-6 * p_cpu.abs().max()).all().item<bool>());
        // ... and only rarely: a kernel that truncates instead of rounding to nearest differs in about half.
        CHECK(gpu.param.cpu().eq(cpu.param).to(torch::kDouble).mean().item<double>() >= 0.99);
        CHECK(rel_error({gpu.exp_avg.cpu()}, {cpu.exp_avg}) <= 1e-5);
        CHECK(rel_error({gpu.exp_avg_sq.cpu()}, {cpu.exp_avg_sq}) <= 1e-5);
        if (offset == 1) {  // the element before the view: untouched
          CHECK(gpu_base[0].item<float>() == base[0].item<float>());
          CHECK(moments[0][0].item<float>() == 0.0f);
        }
      }
    }
  }
}

GPU_TEST_CASE("[step6] CUDA: the kernels run on the current stream, also when it is not the default one") {
  // A stream from LibTorch's pool does not wait for the default stream, nor the default stream for it. Work is
  // queued on it (a chain of matmuls that keeps the GPU busy, then the gradients written), then the operators are
  // called with it current. A kernel launched on the default stream (a launch with no stream, or stream 0) would
  // start at once and read the zeros still in the gradients: its results would be those of a zero gradient.
  require_cuda_kernels();
  const c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  const c10::Stream side = impl.getStreamFromGlobalPool(kCuda);
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  const int64_t n = (1 << 22) + 3;
  torch::manual_seed(8);
  const torch::Tensor grad_cpu = torch::randn({n});
  const std::vector<torch::Tensor> scaled = scaled_grads(24);
  State cpu = make_state(torch::randn({n}));
  State gpu = on_device(cpu, kCuda);
  const torch::Tensor grad_src = grad_cpu.to(kCuda);
  std::vector<torch::Tensor> scaled_src, scaled_gpu;
  for (const torch::Tensor& g : scaled) {
    scaled_src.push_back(g.to(kCuda));
    scaled_gpu.push_back(torch::zeros_like(scaled_src.back()));
  }
  torch::Tensor grad = torch::zeros({n}, kCuda);
  torch::Tensor busy = torch::randn({2048, 2048}, kCuda);
  torch::Tensor found_inf = torch::zeros({1}, kCuda);
  const torch::Tensor inv_scale = torch::full({1}, 1.0f / 1024, kCuda);
  torch::cuda::synchronize();
  {
    const c10::StreamGuard on_side(side);
    REQUIRE(impl.getStream(kCuda) == side);
    for (int i = 0; i < 30; ++i) busy = torch::mm(busy, busy).div_(64);  // tens of ms of queued work
    grad.copy_(grad_src);
    for (size_t i = 0; i < scaled.size(); ++i) scaled_gpu[i].copy_(scaled_src[i]);
    fusion::fused_adamw_(gpu.param, grad, gpu.exp_avg, gpu.exp_avg_sq, hyper, 1);
    fusion::fused_unscale_(scaled_gpu, found_inf, inv_scale);
  }
  impl.synchronizeStream(side);
  fusion::fused_adamw_(cpu.param, grad_cpu, cpu.exp_avg, cpu.exp_avg_sq, hyper, 1);
  CHECK(rel_error({gpu.exp_avg.cpu()}, {cpu.exp_avg}) <= 1e-5);
  CHECK(rel_error({gpu.exp_avg_sq.cpu()}, {cpu.exp_avg_sq}) <= 1e-5);
  CHECK(rel_error({gpu.param.cpu()}, {cpu.param}) <= 1e-6);
  CHECK(found_inf.item<float>() == 0.0f);
  for (size_t i = 0; i < scaled.size(); ++i) {
    CAPTURE(i);
    CHECK(torch::equal(scaled_gpu[i].cpu(), (scaled[i].to(torch::kFloat) / 1024).to(scaled[i].scalar_type())));
  }
}

GPU_TEST_CASE("[step6] CUDA: the multi-tensor operator gives each tensor what the single one gives it") {
  require_cuda_kernels();
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  std::vector<State> singles;
  for (int64_t n : {40000, 0, 7, 100003}) {
    torch::manual_seed(n + 1);
    State s = on_device(make_state(torch::randn({n})), kCuda);
    singles.push_back(on_device(s, kCuda));
    params.push_back(s.param);
    grads.push_back(torch::randn({n}, kCuda));
    exp_avgs.push_back(s.exp_avg);
    exp_avg_sqs.push_back(s.exp_avg_sq);
  }
  fusion::fused_adamw_multi_(params, grads, exp_avgs, exp_avg_sqs, hyper, 1);
  for (size_t i = 0; i < singles.size(); ++i) {
    CAPTURE(i);
    fusion::fused_adamw_(singles[i].param, grads[i], singles[i].exp_avg, singles[i].exp_avg_sq, hyper, 1);
    CHECK(torch::equal(params[i], singles[i].param));
    CHECK(torch::equal(exp_avgs[i], singles[i].exp_avg));
    CHECK(torch::equal(exp_avg_sqs[i], singles[i].exp_avg_sq));
  }
}

GPU_TEST_CASE("[step6] CUDA: step 3's checks guard the CUDA kernel too") {
  require_cuda_kernels();
  State s = on_device(make_state(torch::randn({64})), kCuda);
  const torch::Tensor g = torch::randn({64}, kCuda);
  const fusion::AdamWHyper h;
  torch::Tensor strided = torch::randn({64, 2}, kCuda).select(1, 0);
  CHECK_THROWS_WITH_AS(fusion::fused_adamw_(strided, g, s.exp_avg, s.exp_avg_sq, h, 1),
                       Contains("param is not contiguous"), c10::Error);
  CHECK_THROWS_WITH_AS(fusion::fused_adamw_(s.param, g.cpu(), s.exp_avg, s.exp_avg_sq, h, 1),
                       Contains("all tensors must be on one device"), c10::Error);
  CHECK_THROWS_WITH_AS(fusion::fused_adamw_(s.param, g, s.exp_avg, s.exp_avg, h, 1),
                       Contains("exp_avg and exp_avg_sq overlap in memory"), c10::Error);
  CHECK(s.exp_avg.abs().sum().item<float>() == 0.0f);  // nothing written
}

GPU_TEST_CASE("[step6] CUDA: tuples on the CPU and on the GPU in one call are refused before anything is written") {
  require_cuda_kernels();
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  for (const torch::Device& device : {kCuda, torch::Device(torch::kCPU)}) {
    params.push_back(torch::randn({1000}, device));
    grads.push_back(torch::randn({1000}, device));
    exp_avgs.push_back(torch::zeros({1000}, device));
    exp_avg_sqs.push_back(torch::zeros({1000}, device));
  }
  const std::vector<torch::Tensor> before = {params[0].clone(), params[1].clone()};
  CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(params, grads, exp_avgs, exp_avg_sqs, fusion::AdamWHyper{}, 1),
                       Contains("all tensors must be on one device"), c10::Error);
  CHECK(torch::equal(params[0].cpu(), before[0].cpu()));
  CHECK(torch::equal(params[1], before[1]));
}

GPU_TEST_CASE("[step6] CUDA unscale: the CPU operator's values and flag, and an inf anywhere is found") {
  require_cuda_kernels();
  const std::vector<torch::Tensor> before = scaled_grads(23);
  for (float inv : {1.0f / 1024, 1.0f}) {
    std::vector<torch::Tensor> cpu = clones(before), gpu;
    for (const torch::Tensor& g : before) gpu.push_back(g.to(kCuda));
    torch::Tensor found_cpu = torch::zeros({1}), found_gpu = torch::zeros({1}, kCuda);
    fusion::fused_unscale_(cpu, found_cpu, torch::full({1}, inv));
    fusion::fused_unscale_(gpu, found_gpu, torch::full({1}, inv, kCuda));
    CHECK(found_gpu.item<float>() == 0.0f);
    for (size_t i = 0; i < gpu.size(); ++i) CHECK(torch::equal(gpu[i].cpu(), cpu[i]));
  }
  for (const auto& [t, k] : std::vector<std::pair<size_t, int64_t>>{{0, 0}, {3, 100002}, {4, 32}, {6, 0}}) {
    for (float bad : {INFINITY, NAN}) {
      CAPTURE(t);
      CAPTURE(k);
      std::vector<torch::Tensor> gpu;
      for (const torch::Tensor& g : before) gpu.push_back(g.to(kCuda));
      gpu[t][k] = bad;
      torch::Tensor found = torch::zeros({1}, kCuda);
      fusion::fused_unscale_(gpu, found, torch::full({1}, 0.5f, kCuda));
      CHECK(found.item<float>() == 1.0f);
      CHECK(gpu[0][1].item<float>() == (before[0][1] * 0.5).item<float>());  // the others still unscaled
    }
  }
}
