// Checks for lesson 1, step 3: scale.
// Run: bazel test //lesson1_amp:all   (this step only: bazel test //lesson1_amp:grad_scaler_step3_test)
// The shared problems and helpers are in grad_scaler_test_helpers.h.
#include "lesson1_amp/grad_scaler_test_helpers.h"

namespace scaler_checks {

TEST_CASE("[step3] bad options are rejected with a message naming the option") {
  amp::GradScalerOptions options;
  options.growth_factor = 1.0;
  CHECK_THROWS_WITH_AS(amp::GradScaler{options}, Contains("growth_factor"), c10::Error);
  options = {};
  options.backoff_factor = 1.0;
  CHECK_THROWS_WITH_AS(amp::GradScaler{options}, Contains("backoff_factor"), c10::Error);
  options.backoff_factor = 0.0;
  CHECK_THROWS_WITH_AS(amp::GradScaler{options}, Contains("backoff_factor"), c10::Error);
  options = {};
  options.growth_interval = 0;
  CHECK_THROWS_WITH_AS(amp::GradScaler{options}, Contains("growth_interval"), c10::Error);
  options = {};
  options.init_scale = -1.0;
  CHECK_THROWS_WITH_AS(amp::GradScaler{options}, Contains("scale"), c10::Error);
  options.init_scale = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH_AS(amp::GradScaler{options}, Contains("scale"), c10::Error);
  options = {};
  CHECK_NOTHROW(amp::GradScaler{options});
}

TEST_CASE("[step3] scale() multiplies the loss by the current scale") {
  amp::GradScaler scaler;
  CHECK(scaler.get_scale() == 65536.0);
  const auto scaled = scaler.scale(torch::tensor(0.75f));
  CHECK(scaled.item<double>() == 0.75 * 65536.0);
  CHECK(dtype_name(scaled.scalar_type()) == "Float");
  // A float16 loss comes back float32: the [1]-shaped float32 scale takes part in type promotion (as in
  // PyTorch), so the product cannot overflow float16's 65504.
  const auto half_scaled = scaler.scale(torch::tensor(2.0f).to(torch::kHalf));
  CHECK(dtype_name(half_scaled.scalar_type()) == "Float");
  CHECK(half_scaled.item<double>() == 2.0 * 65536.0);
  CHECK_THROWS_WITH_AS(scaler.scale(torch::tensor(3)), Contains("floating"), c10::Error);
}

TEST_CASE("[step3] with scaling, no 1e-9..2.9e-8 gradient underflows in float16 and unscaling is accurate") {
  torch::manual_seed(1);
  const auto grads = (torch::rand({10000}) * (2.9e-8 - 1e-9) + 1e-9) * (torch::randint(0, 2, {10000}) * 2 - 1);
  REQUIRE(amp::underflow_fraction(grads.to(torch::kFloat)) == 1.0);  // without scaling: all lost
  amp::GradScaler scaler;
  const auto scaled = scaler.scale(grads.to(torch::kFloat));  // what backward of the scaled loss produces
  CHECK(amp::underflow_fraction(scaled) == 0.0);              // with scaling: none lost
  const auto recovered = scaled.to(torch::kHalf).to(torch::kFloat) / scaler.get_scale();
  const double rel_error = ((recovered - grads).abs() / grads.abs()).max().item<double>();
  CAPTURE(rel_error);
  CHECK(rel_error <= std::ldexp(1.0, -11));  // float16's rounding error for normal numbers
}

TEST_CASE("[step3] a disabled scaler's scale() is a pass-through and its scale is 1") {
  amp::GradScalerOptions options;
  options.enabled = false;
  amp::GradScaler scaler(options);
  CHECK_FALSE(scaler.is_enabled());
  const auto loss = torch::tensor(0.25f);
  CHECK(scaler.scale(loss).is_same(loss));
  CHECK(scaler.get_scale() == 1.0);
}

}  // namespace scaler_checks
