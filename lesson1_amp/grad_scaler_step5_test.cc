// Checks for lesson 1, step 5: step.
// Run: bazel test //lesson1_amp:all   (this step only: bazel test //lesson1_amp:grad_scaler_step5_test)
// The shared problems and helpers are in grad_scaler_test_helpers.h.
#include "lesson1_amp/grad_scaler_test_helpers.h"

namespace scaler_checks {

TEST_CASE("[step5] unscale_ after step() in the same iteration gives a clear error") {
  Problem problem;
  torch::optim::SGD sgd(problem.model->parameters(), 0.1);
  amp::GradScaler scaler;
  scaler.scale(problem.loss()).backward();
  scaler.step(sgd);
  CHECK_THROWS_WITH_AS(scaler.unscale_(sgd), Contains("after step"), c10::Error);
}

TEST_CASE(
    "[step5] several optimizers on one scaler: each steps on its own unscaled gradients, an inf skips only its own") {
  // As PyTorch's test_grad_scaling_multiple: two models, two optimizers, one scaler.
  Problem ref_a(torch::kCPU, 7), ref_b(torch::kCPU, 8), a(torch::kCPU, 7), b(torch::kCPU, 8);
  torch::optim::SGD ref_sgd_a(ref_a.model->parameters(), 0.1), ref_sgd_b(ref_b.model->parameters(), 0.1);
  (ref_a.loss() + ref_b.loss()).backward();
  ref_sgd_a.step();
  ref_sgd_b.step();

  torch::optim::SGD sgd_a(a.model->parameters(), 0.1), sgd_b(b.model->parameters(), 0.1);
  amp::GradScaler scaler = make_scaler(1024.0);
  scaler.scale(a.loss() + b.loss()).backward();
  scaler.unscale_(sgd_a);  // explicit for one, implicit in step() for the other
  CHECK(scaler.step(sgd_a));
  CHECK(scaler.step(sgd_b));
  CAPTURE(max_abs_diff(a.params(), ref_a.params()));
  CAPTURE(max_abs_diff(b.params(), ref_b.params()));
  CHECK(max_abs_diff(a.params(), ref_a.params()) <= 1e-6);
  CHECK(max_abs_diff(b.params(), ref_b.params()) <= 1e-6);

  // Another iteration (a fresh scaler: update() is step 6): an inf only in b's gradients skips b, not a.
  amp::GradScaler second = make_scaler(1024.0);
  sgd_a.zero_grad();
  sgd_b.zero_grad();
  second.scale(a.loss() + b.loss()).backward();
  {
    torch::NoGradGuard no_grad;
    b.model->weight.grad()[0][1] = INFINITY;
  }
  const auto a_before = a.params(), b_before = b.params();
  CHECK(second.step(sgd_a));
  CHECK_FALSE(second.step(sgd_b));
  CHECK_FALSE(all_equal(a.params(), a_before));
  CHECK(all_equal(b.params(), b_before));
}

TEST_CASE("[step5] step() unscales through the virtual unscale_ and skips on the flag a subclass recorded") {
  for (bool explicit_unscale : {false, true}) {
    CAPTURE(explicit_unscale);
    Problem problem;
    torch::optim::SGD sgd(problem.model->parameters(), 0.1);
    amp::GradScalerOptions options;
    options.init_scale = 1024.0;
    FlagRaisingScaler scaler(options);
    amp::GradScaler& base = scaler;  // called through the base class, as lesson 5's code does
    base.scale(problem.loss()).backward();
    if (explicit_unscale) base.unscale_(sgd);
    const auto before = problem.params();
    CHECK_FALSE(base.step(sgd));  // the gradients are finite: only the subclass's flag says skip
    CHECK(all_equal(problem.params(), before));
  }
}

TEST_CASE("[step5] a clean step runs the optimizer on the unscaled gradients") {
  Problem reference, scaled;
  torch::optim::SGD ref_sgd(reference.model->parameters(), 0.1);
  reference.loss().backward();
  ref_sgd.step();

  torch::optim::SGD sgd(scaled.model->parameters(), 0.1);
  amp::GradScaler scaler = make_scaler(4096.0);
  scaler.scale(scaled.loss()).backward();
  CHECK(scaler.step(sgd));
  CAPTURE(max_abs_diff(scaled.params(), reference.params()));
  CHECK(max_abs_diff(scaled.params(), reference.params()) <= 1e-6);
}

TEST_CASE("[step5] a step with an inf gradient is skipped and leaves the parameters unchanged") {
  Problem problem;
  torch::optim::SGD sgd(problem.model->parameters(), 0.1);
  amp::GradScaler scaler;
  const auto before = problem.params();
  scaler.scale(problem.loss()).backward();
  {
    torch::NoGradGuard no_grad;
    problem.model->weight.grad()[0][3] = INFINITY;
  }
  CHECK_FALSE(scaler.step(sgd));
  CHECK(all_equal(problem.params(), before));
}

TEST_CASE("[step5] misuse of step gives a clear error") {
  Problem problem;
  torch::optim::SGD sgd(problem.model->parameters(), 0.1);
  amp::GradScaler scaler;

  SUBCASE("before scale()") {
    problem.loss().backward();
    CHECK_THROWS_WITH_AS(scaler.step(sgd), Contains("before scale"), c10::Error);
  }
  SUBCASE("twice in one iteration") {
    scaler.scale(problem.loss()).backward();
    scaler.step(sgd);
    CHECK_THROWS_WITH_AS(scaler.step(sgd), Contains("already been called"), c10::Error);
  }
  SUBCASE("with no gradients") {
    (void)scaler.scale(problem.loss());  // scaled, but backward never ran
    CHECK_THROWS_WITH_AS(scaler.step(sgd), Contains("no parameter"), c10::Error);
  }
}

TEST_CASE("[step5] clipping after an explicit unscale_ equals clipping the unscaled gradients") {
  const double max_norm = 0.05;
  Problem reference, scaled;
  torch::optim::SGD ref_sgd(reference.model->parameters(), 0.5);
  reference.loss().backward();
  const double norm = torch::nn::utils::clip_grad_norm_(reference.model->parameters(), max_norm);
  REQUIRE(norm > max_norm);  // the clip really acts
  ref_sgd.step();

  torch::optim::SGD sgd(scaled.model->parameters(), 0.5);
  amp::GradScaler scaler = make_scaler(65536.0);
  scaler.scale(scaled.loss()).backward();
  scaler.unscale_(sgd);
  torch::nn::utils::clip_grad_norm_(scaled.model->parameters(), max_norm);
  CHECK(scaler.step(sgd));  // must not unscale a second time
  CAPTURE(max_abs_diff(scaled.params(), reference.params()));
  CHECK(max_abs_diff(scaled.params(), reference.params()) <= 1e-6);
}

TEST_CASE("[step5] a disabled scaler steps every time and never skips") {
  amp::GradScalerOptions options;
  options.enabled = false;
  amp::GradScaler scaler(options);
  Problem problem;
  torch::optim::SGD sgd(problem.model->parameters(), 0.1);
  const auto before = problem.params();
  scaler.scale(problem.loss()).backward();
  scaler.unscale_(sgd);  // no-op
  CHECK(scaler.step(sgd));
  CHECK_FALSE(all_equal(problem.params(), before));
  CHECK(scaler.get_scale() == 1.0);
}

}  // namespace scaler_checks
