// Checks for lesson 1, step 7: the full training step.
// Run: bazel test //lesson1_amp:all   (this step only: bazel test //lesson1_amp:grad_scaler_step7_test)
// The shared problems and helpers are in grad_scaler_test_helpers.h.
#include "lesson1_amp/grad_scaler_test_helpers.h"

namespace scaler_checks {

TEST_CASE("[step7] a model whose float16 gradients underflow does not learn without the scaler, learns with it") {
  const UnderflowRun without = train_underflow_model(torch::kCPU, false, amp::KernelPath::kAuto, 100);
  const UnderflowRun with = train_underflow_model(torch::kCPU, true, amp::KernelPath::kAuto, 100);
  CAPTURE(without.initial_loss);
  CAPTURE(without.final_loss);
  CAPTURE(with.final_loss);
  CAPTURE(with.first_zero_grad_fraction);
  CHECK(without.first_zero_grad_fraction == 1.0);     // every gradient was lost in float16 ...
  CHECK(without.final_loss == without.initial_loss);  // ... so the weights never moved
  CHECK(with.first_zero_grad_fraction == 0.0);        // with scaling none was lost ...
  CHECK(with.final_loss < 0.1 * with.initial_loss);   // ... and the model learned (10x lower loss)
}

TEST_CASE("[step7] train_step runs forward and loss under autocast, backward outside, and trains like float32") {
  auto train = [](bool autocast, std::vector<double>* losses) {
    Problem problem;
    torch::optim::SGD sgd(problem.model->parameters(), 0.05);
    amp::GradScaler scaler;
    amp::StepOptions options;  // CPU, bfloat16
    options.autocast = autocast;
    for (int i = 0; i < 40; ++i) {
      torch::ScalarType forward_dtype = torch::kFloat;
      const amp::StepResult result = amp::train_step(
          sgd, scaler,
          [&] {
            auto out = problem.model->forward(problem.x);
            forward_dtype = out.scalar_type();
            return torch::mse_loss(out.to(torch::kFloat), problem.y);
          },
          options);
      CHECK(result.stepped);
      CHECK(dtype_name(forward_dtype) == (autocast ? "BFloat16" : "Float"));
      CHECK_FALSE(workshop::compat::autocast_enabled(torch::kCPU));  // autocast ended with the forward
      CHECK_FALSE(result.loss.requires_grad());
      losses->push_back(result.loss.item<double>());
    }
    // Master weights stay float32 under autocast.
    CHECK(dtype_name(problem.model->weight.scalar_type()) == "Float");
  };
  std::vector<double> fp32, amp16;
  train(false, &fp32);
  train(true, &amp16);
  CAPTURE(fp32.front());
  CAPTURE(fp32.back());
  CAPTURE(amp16.back());
  CHECK(fp32.back() < 0.8 * fp32.front());
  CHECK(amp16.back() == doctest::Approx(fp32.back()).epsilon(0.02));  // bfloat16 keeps ~3 significant digits
}

TEST_CASE("[step7] train_step with max_grad_norm clips the unscaled gradients") {
  Problem reference, scaled;
  torch::optim::SGD ref_sgd(reference.model->parameters(), 0.5);
  reference.loss().backward();
  torch::nn::utils::clip_grad_norm_(reference.model->parameters(), 0.05);
  ref_sgd.step();

  torch::optim::SGD sgd(scaled.model->parameters(), 0.5);
  amp::GradScaler scaler;
  amp::StepOptions options;
  options.autocast = false;
  options.max_grad_norm = 0.05;
  CHECK(amp::train_step(
            sgd, scaler, [&] { return scaled.loss(); }, options)
            .stepped);
  CAPTURE(max_abs_diff(scaled.params(), reference.params()));
  CHECK(max_abs_diff(scaled.params(), reference.params()) <= 1e-6);
}

TEST_CASE("[step7] train_step zeroes the gradients each time and returns the unscaled loss") {
  Problem reference, trained;
  torch::optim::SGD ref_sgd(reference.model->parameters(), 0.1);
  torch::optim::SGD sgd(trained.model->parameters(), 0.1);
  amp::GradScaler scaler = make_scaler(1024.0);
  amp::StepOptions options;
  options.autocast = false;
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    ref_sgd.zero_grad();
    const auto ref_loss = reference.loss();
    ref_loss.backward();
    ref_sgd.step();
    const amp::StepResult result = amp::train_step(
        sgd, scaler, [&] { return trained.loss(); }, options);
    CHECK(result.stepped);
    CHECK(result.loss.item<double>() == doctest::Approx(ref_loss.item<double>()).epsilon(1e-6));
    CAPTURE(max_abs_diff(trained.params(), reference.params()));
    CHECK(max_abs_diff(trained.params(), reference.params()) <= 1e-6);
  }
}

TEST_CASE("[step7] train_step runs backward with autocast off") {
  Problem problem;
  torch::optim::SGD sgd(problem.model->parameters(), 0.1);
  amp::GradScaler scaler;
  int hooks = 0;
  bool autocast_in_backward = true;
  amp::train_step(sgd, scaler, [&] {
    auto loss = torch::mse_loss(problem.model->forward(problem.x).to(torch::kFloat), problem.y);
    // Runs when backward reaches the loss: it sees the autocast state backward runs under.
    loss.register_hook([&](const torch::Tensor& grad) {
      ++hooks;
      autocast_in_backward = workshop::compat::autocast_enabled(torch::kCPU);
      return grad;
    });
    return loss;
  });  // CPU, bfloat16 autocast for the forward
  REQUIRE(hooks == 1);
  CHECK_FALSE(autocast_in_backward);
}

TEST_CASE("[step7] train_step rejects a forward that does not return a scalar loss") {
  Problem problem;
  torch::optim::SGD sgd(problem.model->parameters(), 0.1);
  amp::GradScaler scaler;
  CHECK_THROWS_WITH_AS(amp::train_step(sgd, scaler, [&] { return problem.model->forward(problem.x); }),
                       Contains("scalar loss"), c10::Error);
}

GPU_TEST_CASE("[step7] on CUDA, float16 autocast training with the scaler matches float32 training") {
  auto train = [](bool amp_on) {
    torch::manual_seed(11);
    torch::nn::Sequential model(torch::nn::Linear(64, 256), torch::nn::ReLU(), torch::nn::Linear(256, 1));
    model->to(torch::kCUDA);
    const auto x = torch::randn({512, 64}, torch::kCUDA);
    const auto y = x.sum(1, true).sin();
    torch::optim::SGD sgd(model->parameters(), 0.05);
    amp::GradScalerOptions so;
    so.enabled = amp_on;
    amp::GradScaler scaler(so);
    amp::StepOptions options;
    options.device = torch::kCUDA;
    options.dtype = torch::kHalf;
    options.autocast = amp_on;
    double last = 0;
    for (int i = 0; i < 100; ++i) {
      last = amp::train_step(
                 sgd, scaler, [&] { return torch::mse_loss(model->forward(x).to(torch::kFloat), y); }, options)
                 .loss.item<double>();
    }
    return last;
  };
  const double fp32 = train(false), amp16 = train(true);
  CAPTURE(fp32);
  CAPTURE(amp16);
  CHECK(amp16 == doctest::Approx(fp32).epsilon(0.05));
}

GPU_TEST_CASE("[step7] on CUDA the underflow model learns only with the scaler (fused kernels)") {
  const UnderflowRun without = train_underflow_model(torch::kCUDA, false, amp::KernelPath::kFused, 100);
  const UnderflowRun with = train_underflow_model(torch::kCUDA, true, amp::KernelPath::kFused, 100);
  CHECK(without.first_zero_grad_fraction == 1.0);
  CHECK(without.final_loss == without.initial_loss);
  CHECK(with.first_zero_grad_fraction == 0.0);
  CHECK(with.final_loss < 0.1 * with.initial_loss);
}

}  // namespace scaler_checks
