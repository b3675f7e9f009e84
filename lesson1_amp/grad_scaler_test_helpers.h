// Lesson 1's scaler checks share these: the seeded models and gradients, and the comparisons. One check file per
// step includes it (grad_scaler_step3_test.cc ... grad_scaler_step7_test.cc; steps 1 and 2 are in autocast_test.cc);
// run them all with bazel test //lesson1_amp:all.
// Several cases mirror PyTorch's own GradScaler tests (test/test_cuda.py: test_grad_scaling_*).
#pragma once

#include "tests/torch_doctest.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "lesson1_amp/autocast.h"
#include "lesson1_amp/grad_scaler.h"
#include "lesson1_amp/underflow_model.h"
#include "common/compat/compat.h"
#include "tests/check_helpers.h"

namespace scaler_checks {

using doctest::Contains;

using amp::examples::UnderflowModel;
using workshop::test::all_equal;
using workshop::test::max_abs_diff;

inline amp::GradScaler make_scaler(double init_scale, double growth = 2.0, double backoff = 0.5,
                                   int64_t interval = 2000, amp::KernelPath kernels = amp::KernelPath::kAuto) {
  amp::GradScalerOptions options;
  options.init_scale = init_scale;
  options.growth_factor = growth;
  options.backoff_factor = backoff;
  options.growth_interval = interval;
  options.kernels = kernels;
  return amp::GradScaler(options);
}

// A tiny regression problem with a linear model; the same seed gives the same model and data.
struct Problem {
  torch::nn::Linear model{nullptr};
  torch::Tensor x;  // [32, 8]
  torch::Tensor y;  // [32, 1]

  explicit Problem(torch::Device device = torch::kCPU, uint64_t seed = 7) {
    torch::manual_seed(seed);
    model = torch::nn::Linear(8, 1);
    model->to(device);
    x = torch::randn({32, 8}).to(device);
    y = torch::randn({32, 1}).to(device);
  }
  torch::Tensor loss() { return torch::mse_loss(model->forward(x), y); }
  std::vector<torch::Tensor> grads() { return workshop::test::grads_of(model->parameters()); }
  std::vector<torch::Tensor> params() { return workshop::test::values_of(model->parameters()); }
};

// [underflow_run]
struct UnderflowRun {
  double first_zero_grad_fraction;  // fraction of w.grad entries exactly 0 after the first backward
  double initial_loss;
  double final_loss;
};

// Trains UnderflowModel with Adam (its update does not depend on the gradients' scale, only on their sign
// and history, so the tiny true gradients are enough to learn from, if they survive).
inline UnderflowRun train_underflow_model(torch::Device device, bool scaling, amp::KernelPath kernels, int steps) {
  UnderflowModel m(device);
  torch::optim::Adam adam({m.w}, torch::optim::AdamOptions(0.1));
  amp::GradScalerOptions options;
  options.enabled = scaling;
  options.kernels = kernels;
  amp::GradScaler scaler(options);
  amp::StepOptions step_options;
  step_options.autocast = false;  // the forward casts to float16 itself
  UnderflowRun run{-1, m.true_loss(), 0};
  for (int i = 0; i < steps; ++i) {
    amp::train_step(
        adam, scaler, [&] { return m.loss(); }, step_options);
    if (i == 0) run.first_zero_grad_fraction = m.w.grad().eq(0).to(torch::kFloat).mean().item<double>();
  }
  run.final_loss = m.true_loss();
  return run;
}
// [underflow_run]

// A scaler whose unscale_ also raises the recorded inf flag, as lesson 5's ShardedGradScaler does when another
// rank found an inf: step() must unscale through the (virtual) unscale_ and read the flag it recorded.
class FlagRaisingScaler : public amp::GradScaler {
 public:
  using amp::GradScaler::GradScaler;
  void unscale_(torch::optim::Optimizer& optimizer) override {
    amp::GradScaler::unscale_(optimizer);
    recorded_found_inf(optimizer).fill_(1.0);
  }
};

}  // namespace scaler_checks
