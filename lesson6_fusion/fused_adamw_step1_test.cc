// Checks for lesson 6, step 1: the napkin math.
// Run: bazel test //lesson6_fusion:all   (this step only: bazel test //lesson6_fusion:fused_adamw_step1_test)
// The shared state, oracle and helpers are in fused_adamw_test_helpers.h.
#include "lesson6_fusion/fused_adamw_test_helpers.h"

namespace adamw_checks {

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

}  // namespace adamw_checks
