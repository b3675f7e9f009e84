// Checks for lesson 1, part A: underflow measurement (step 1) and the autocast guard (step 2).
// Run: bazel test //lesson1_amp:all   (one step: --test_arg=--test-case='*step2*')
#include "tests/torch_doctest.h"

#include <cmath>
#include <stdexcept>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "lesson1_amp/autocast.h"
#include "common/compat/compat.h"

using doctest::Contains;

namespace {

// [tiny_gradients]
// Gradient-like values with magnitudes in [1e-9, 2.9e-8] and random signs: all below 2^-25 ≈ 2.98e-8, the
// point under which float16 rounds to zero (its smallest subnormal is 2^-24 ≈ 5.96e-8).
torch::Tensor tiny_gradients(int64_t n) {
  torch::manual_seed(1);
  const auto magnitude = torch::rand({n}) * (2.9e-8 - 1e-9) + 1e-9;
  const auto sign = torch::randint(0, 2, {n}).to(torch::kFloat) * 2 - 1;
  return magnitude * sign;  // [n] float32
}
// [tiny_gradients]

bool cpu_autocast_on() { return workshop::compat::autocast_enabled(torch::kCPU); }
std::string cpu_autocast_dtype() { return dtype_name(workshop::compat::autocast_dtype(torch::kCPU)); }

// The dtype a CPU matmul produces right now: what autocast decided for it.
std::string matmul_dtype() { return dtype_name(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type()); }

// Sets the CPU autocast dtype (autocast stays off) for the life of this object, as a user or an enclosing
// library could; puts back what was there, whatever the checks in between did.
class CpuDtypeSetting {
 public:
  explicit CpuDtypeSetting(c10::ScalarType dtype) : saved_(workshop::compat::autocast_dtype(torch::kCPU)) {
    workshop::compat::set_autocast_dtype(torch::kCPU, dtype);
  }
  ~CpuDtypeSetting() { workshop::compat::set_autocast_dtype(torch::kCPU, saved_); }

 private:
  c10::ScalarType saved_;
};

}  // namespace

TEST_CASE("[step1] float16 flushes all gradients of magnitude 1e-9..2.9e-8 to zero; bfloat16 keeps them") {
  const torch::Tensor grads = tiny_gradients(10000);
  REQUIRE(grads.abs().max().item<double>() < std::ldexp(1.0, -25));
  CHECK(amp::underflow_fraction(grads, torch::kHalf) == 1.0);
  CHECK(amp::underflow_fraction(grads) == 1.0);  // float16 is the default
  CHECK(amp::underflow_fraction(grads, torch::kBFloat16) == 0.0);
  CHECK(amp::underflow_fraction(grads, torch::kFloat) == 0.0);
}

TEST_CASE("[step1] underflow_fraction counts only the non-zero finite entries") {
  // Candidates: 1e-9 (lost in float16), 1.0 and 6.1e-5 (kept). Zero, inf and NaN are not counted.
  const auto values = torch::tensor({0.0f, 1e-9f, 1.0f, 6.1e-5f, INFINITY, NAN});
  CHECK(amp::underflow_fraction(values) == doctest::Approx(1.0 / 3.0));
  // Between 2^-25 and 2^-24 float16 rounds up to its smallest subnormal: not lost.
  CHECK(amp::underflow_fraction(torch::tensor({4e-8f})) == 0.0);
}

TEST_CASE("[step1] underflow_fraction rejects input it cannot measure") {
  CHECK_THROWS_WITH_AS(amp::underflow_fraction(torch::tensor({1, 2, 3})), Contains("floating"), c10::Error);
  CHECK_THROWS_WITH_AS(amp::underflow_fraction(torch::zeros({4})), Contains("non-zero"), c10::Error);
  CHECK_THROWS_WITH_AS(amp::underflow_fraction(torch::Tensor()), Contains("undefined"), c10::Error);
  CHECK_THROWS_WITH_AS(amp::underflow_fraction(torch::ones({2}), torch::kInt), Contains("low_precision"), c10::Error);
}

TEST_CASE("[step2] inside an AutocastGuard a CPU matmul runs in bfloat16, outside in float32") {
  REQUIRE_FALSE(cpu_autocast_on());
  CHECK(matmul_dtype() == "Float");
  {
    amp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    CHECK(cpu_autocast_on());
    CHECK(matmul_dtype() == "BFloat16");
    // Ops autocast does not list keep their input dtype.
    CHECK(dtype_name((torch::ones({2}) + torch::ones({2})).scalar_type()) == "Float");
  }
  CHECK_FALSE(cpu_autocast_on());
  CHECK(matmul_dtype() == "Float");
}

TEST_CASE("[step2] the one-argument guard picks the device's usual dtype") {
  CHECK(dtype_name(amp::AutocastGuard::default_dtype(torch::kCUDA)) == "Half");
  amp::AutocastGuard autocast(torch::kCPU);
  CHECK(cpu_autocast_on());
  CHECK(cpu_autocast_dtype() == "BFloat16");
  CHECK(matmul_dtype() == "BFloat16");
}

TEST_CASE("[step2] nested guards restore the outer state when they exit") {
  amp::AutocastGuard outer(torch::kCPU, torch::kBFloat16);
  {
    amp::AutocastGuard off(torch::kCPU, torch::kBFloat16, /*enabled=*/false);
    CHECK_FALSE(cpu_autocast_on());
    CHECK(matmul_dtype() == "Float");
    {
      amp::AutocastGuard on_again(torch::kCPU);
      CHECK(matmul_dtype() == "BFloat16");
    }
    CHECK_FALSE(cpu_autocast_on());
  }
  CHECK(cpu_autocast_on());
  CHECK(cpu_autocast_dtype() == "BFloat16");
  CHECK(matmul_dtype() == "BFloat16");
}

TEST_CASE("[step2] the guard restores the dtype that was set before it, not only the enabled flag") {
  if (!workshop::compat::cpu_autocast_supports(torch::kHalf)) {
    // LibTorch 1.13 refuses any CPU autocast dtype but bfloat16, so there is no other dtype to restore; the
    // CUDA case checks the restore there (float16 outside, bfloat16 inside).
    MESSAGE("CPU autocast here is bfloat16 only: the dtype restore is checked by the CUDA case");
    {
      amp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
      CHECK(cpu_autocast_dtype() == "BFloat16");
    }
    CHECK(cpu_autocast_dtype() == "BFloat16");
    CHECK_FALSE(cpu_autocast_on());
    return;
  }
  const CpuDtypeSetting half(torch::kHalf);  // set while autocast is off, as a user could
  REQUIRE(cpu_autocast_dtype() == "Half");
  {
    amp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    CHECK(cpu_autocast_dtype() == "BFloat16");
  }
  CHECK(cpu_autocast_dtype() == "Half");
  CHECK_FALSE(cpu_autocast_on());
}

TEST_CASE("[step2] on exit a guard puts back the device's dtype, even when code inside changed it") {
  // Works without a GPU: a guard that turns CUDA autocast *off* needs no CUDA, and the CUDA dtype is a plain
  // setting that any dtype can be written to.
  const c10::ScalarType before = workshop::compat::autocast_dtype(torch::kCUDA);
  const c10::ScalarType other = before == torch::kBFloat16 ? torch::kHalf : torch::kBFloat16;
  {
    amp::AutocastGuard off(torch::kCUDA, before, /*enabled=*/false);
    workshop::compat::set_autocast_dtype(torch::kCUDA, other);  // e.g. a library call inside the scope
  }
  const c10::ScalarType after = workshop::compat::autocast_dtype(torch::kCUDA);
  workshop::compat::set_autocast_dtype(torch::kCUDA, before);  // leave the next checks a clean state
  CHECK(dtype_name(after) == dtype_name(before));
  CHECK_FALSE(workshop::compat::autocast_enabled(torch::kCUDA));
}

TEST_CASE("[step2] the one-argument guard takes the dtype set for the device, as torch.autocast without a dtype") {
  {
    amp::AutocastGuard outer(torch::kCPU, torch::kBFloat16);
    amp::AutocastGuard inner(torch::kCPU);
    CHECK(cpu_autocast_dtype() == "BFloat16");
  }
  // An enclosing setting of float16 (where CPU autocast has one; the CUDA case checks it on CUDA): the
  // one-argument guard must use it rather than fall back to the device's usual bfloat16.
  if (workshop::compat::cpu_autocast_supports(torch::kHalf)) {
    const CpuDtypeSetting half(torch::kHalf);
    amp::AutocastGuard autocast(torch::kCPU);
    CHECK(cpu_autocast_dtype() == "Half");
    CHECK(matmul_dtype() == "Half");
  }
  CHECK(cpu_autocast_dtype() == "BFloat16");
}

TEST_CASE("[step2] the guard restores autocast's cache-enabled flag") {
  REQUIRE(at::autocast::is_autocast_cache_enabled());
  {
    amp::AutocastGuard autocast(torch::kCPU);
    at::autocast::set_autocast_cache_enabled(false);  // code inside the scope turns weight caching off
  }
  const bool restored = at::autocast::is_autocast_cache_enabled();
  at::autocast::set_autocast_cache_enabled(true);  // whatever happened, leave the next checks a clean state
  CHECK(restored);
}

TEST_CASE("[step2] the previous state is restored when an exception leaves the guarded scope") {
  REQUIRE_FALSE(cpu_autocast_on());
  bool reached = false;
  try {
    amp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    reached = cpu_autocast_on();
    throw std::runtime_error("forward pass failed");
  } catch (const std::runtime_error&) {
  }
  CHECK(reached);
  CHECK_FALSE(cpu_autocast_on());
  CHECK(matmul_dtype() == "Float");
}

TEST_CASE("[step2] the outermost guard clears the cache of 16-bit weight copies, an inner one does not") {
  // Autocast caches the bfloat16 copy of a float32 leaf that requires grad (a weight), holding a weak
  // reference to the weight; clearing the cache drops that reference.
  const auto weight = torch::randn({4, 4}, torch::requires_grad());
  const auto input = torch::randn({2, 4});
  const size_t weak_before = weight.weak_use_count();
  CAPTURE(weak_before);
  INFO(
      "weak_use_count() counts weak references to the weight; autocast's cache of its bfloat16 copy holds one "
      "until the cache is cleared (at::autocast::clear_cache() when the outermost guard exits)");
  {
    amp::AutocastGuard outer(torch::kCPU);
    {
      amp::AutocastGuard inner(torch::kCPU);
      (void)torch::mm(input, weight);
      CHECK(weight.weak_use_count() == weak_before + 1);  // cached
    }
    CHECK(weight.weak_use_count() == weak_before + 1);  // still cached: not the outermost guard
  }
  CHECK(weight.weak_use_count() == weak_before);  // cleared by the outermost guard
}

TEST_CASE("[step2] the guard rejects a device or dtype autocast cannot use, with a clear message") {
  CHECK_THROWS_WITH_AS(amp::AutocastGuard(torch::kCPU, torch::kFloat), Contains("float16 or bfloat16"), c10::Error);
  CHECK_THROWS_WITH_AS(amp::AutocastGuard(torch::kCPU, torch::kDouble), Contains("float16 or bfloat16"), c10::Error);
  if (!workshop::compat::cpu_autocast_supports(torch::kHalf)) {
    CHECK_THROWS_WITH_AS(amp::AutocastGuard(torch::kCPU, torch::kHalf), Contains("bfloat16 only"), c10::Error);
  }
  if (!torch::cuda::is_available()) {
    CHECK_THROWS_WITH_AS(amp::AutocastGuard{torch::kCUDA}, Contains("CUDA"), c10::Error);
  }
  CHECK_FALSE(cpu_autocast_on());  // a rejected guard changed nothing
  {
    // Inside a working guard, a rejected one leaves the outer state (on, bfloat16) exactly as it was.
    amp::AutocastGuard outer(torch::kCPU, torch::kBFloat16);
    CHECK_THROWS_WITH_AS(amp::AutocastGuard(torch::kCPU, torch::kFloat), Contains("float16 or bfloat16"), c10::Error);
    CHECK(cpu_autocast_on());
    CHECK(c10::toString(workshop::compat::autocast_dtype(torch::kCPU)) == std::string("BFloat16"));
  }
  CHECK_FALSE(cpu_autocast_on());
  {
    amp::AutocastGuard off(torch::kCPU, torch::kFloat, /*enabled=*/false);  // "no autocast" takes any dtype
    CHECK_FALSE(cpu_autocast_on());
  }
}

GPU_TEST_CASE("[step2] on CUDA the guard runs a matmul in float16 and restores float32 after") {
  const auto a = torch::randn({64, 64}, torch::kCUDA);
  {
    amp::AutocastGuard autocast(torch::kCUDA);
    CHECK(workshop::compat::autocast_enabled(torch::kCUDA));
    CHECK(dtype_name(torch::mm(a, a).scalar_type()) == "Half");
    {
      amp::AutocastGuard bf16(torch::kCUDA, torch::kBFloat16);
      CHECK(dtype_name(torch::mm(a, a).scalar_type()) == "BFloat16");
      amp::AutocastGuard inner(torch::kCUDA);  // no dtype: the enclosing guard's bfloat16
      CHECK(dtype_name(torch::mm(a, a).scalar_type()) == "BFloat16");
    }
    CHECK(dtype_name(torch::mm(a, a).scalar_type()) == "Half");
  }
  CHECK_FALSE(workshop::compat::autocast_enabled(torch::kCUDA));
  CHECK(dtype_name(torch::mm(a, a).scalar_type()) == "Float");
}
