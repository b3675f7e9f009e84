// Checks for lesson 1, step 4: unscale.
// Run: bazel test //lesson1_amp:all   (this step only: bazel test //lesson1_amp:grad_scaler_step4_test)
// The shared problems and helpers are in grad_scaler_test_helpers.h.
#include "lesson1_amp/grad_scaler_test_helpers.h"

namespace scaler_checks {

TEST_CASE("[step4] unscaling finite gradients by a power-of-two scale is exact") {
  torch::manual_seed(0);
  std::vector<torch::Tensor> grads{torch::randn({10, 10}), torch::randn({7})};
  const std::vector<torch::Tensor> expected{grads[0] / 1024, grads[1] / 1024};
  auto found_inf = torch::zeros({1});
  const auto inv_scale = torch::full({1}, 1.0 / 1024);
  amp::unscale_grads_plain(grads, found_inf, inv_scale);
  CHECK(all_equal(grads, expected));
  CHECK(found_inf.item<float>() == 0.0f);
}

TEST_CASE("[step4] an inf or NaN in any gradient is found, also in non-contiguous gradients") {
  const auto inv_scale = torch::full({1}, 0.25f);
  auto found_inf = torch::zeros({1});
  std::vector<torch::Tensor> grads{torch::ones({4, 4}), torch::ones({4, 4}).t(), torch::ones({8, 8}).slice(1, 0, 8, 2)};
  REQUIRE_FALSE(grads[1].is_contiguous());
  REQUIRE_FALSE(grads[2].is_contiguous());

  SUBCASE("inf in a contiguous gradient") { grads[0][1][2] = INFINITY; }
  SUBCASE("-inf in a transposed gradient") { grads[1][3][0] = -INFINITY; }
  SUBCASE("NaN in a strided slice") { grads[2][5][1] = NAN; }
  amp::unscale_grads_plain(grads, found_inf, inv_scale);
  CHECK(found_inf.item<float>() == 1.0f);
  CHECK(grads[0][0][0].item<float>() == 0.25f);  // finite entries are still unscaled
}

TEST_CASE("[step4] unscale_ divides the optimizer's gradients by the scale") {
  Problem reference, scaled;
  reference.loss().backward();
  torch::optim::SGD sgd(scaled.model->parameters(), 0.1);
  amp::GradScaler scaler = make_scaler(1024.0);
  scaler.scale(scaled.loss()).backward();
  REQUIRE(torch::allclose(scaled.grads()[0], reference.grads()[0] * 1024));
  scaler.unscale_(sgd);
  CAPTURE(max_abs_diff(scaled.grads(), reference.grads()));
  CHECK(max_abs_diff(scaled.grads(), reference.grads()) <= 1e-6);
  CHECK(scaler.get_scale() == 1024.0);  // unscale_ does not change the scale
}

TEST_CASE("[step4] misuse of unscale_ gives a clear error") {
  Problem problem;
  torch::optim::SGD sgd(problem.model->parameters(), 0.1);
  amp::GradScaler scaler;

  SUBCASE("before scale()") {
    problem.loss().backward();
    CHECK_THROWS_WITH_AS(scaler.unscale_(sgd), Contains("before scale"), c10::Error);
  }
  SUBCASE("twice in one iteration") {
    scaler.scale(problem.loss()).backward();
    scaler.unscale_(sgd);
    CHECK_THROWS_WITH_AS(scaler.unscale_(sgd), Contains("already been called"), c10::Error);
  }
  SUBCASE("float16 master weights") {
    auto w = torch::ones({4}, torch::dtype(torch::kHalf).requires_grad(true));
    torch::optim::SGD half_sgd({w}, 0.1);
    scaler.scale((w * w).sum()).backward();
    CHECK_THROWS_WITH_AS(scaler.unscale_(half_sgd), Contains("float16"), c10::Error);
  }
}

TEST_CASE("[step4] unscale_grads_plain unscales gradients that require grad, recording no autograd history") {
  // A leaf that requires grad (what a gradient is after backward with create_graph): an in-place multiply
  // with grad mode on would be refused for a leaf, or recorded in the graph for any other tensor.
  std::vector<torch::Tensor> grads{torch::full({3}, 8.0f, torch::requires_grad())};
  auto found_inf = torch::zeros({1});
  amp::unscale_grads_plain(grads, found_inf, torch::full({1}, 0.25f));
  CHECK(torch::equal(grads[0].detach(), torch::full({3}, 2.0f)));
  CHECK(grads[0].grad_fn() == nullptr);
  CHECK(found_inf.item<float>() == 0.0f);
}

GPU_TEST_CASE("[step4] on CUDA the fused and the plain unscale agree, inf included") {
  torch::manual_seed(0);
  const auto base = torch::randn({64, 33}, torch::kCUDA);
  const auto inv_scale = torch::full({1}, 1.0f / 3.0f, torch::kCUDA);
  for (bool with_inf : {false, true}) {
    std::vector<torch::Tensor> fused{base.clone(), base.clone().t()}, plain{base.clone(), base.clone().t()};
    if (with_inf) {
      fused[1][2][5] = INFINITY;
      plain[1][2][5] = INFINITY;
    }
    auto found_fused = torch::zeros({1}, torch::kCUDA), found_plain = torch::zeros({1}, torch::kCUDA);
    amp::unscale_grads_fused(fused, found_fused, inv_scale);
    amp::unscale_grads_plain(plain, found_plain, inv_scale);
    CHECK(found_fused.item<float>() == found_plain.item<float>());
    CHECK(found_plain.item<float>() == (with_inf ? 1.0f : 0.0f));
    CHECK(torch::equal(fused[0], plain[0]));
  }
}

}  // namespace scaler_checks
