// Given (not an exercise): the lesson's model whose float16 gradients underflow, shared by the checks
// (grad_scaler_step*_test.cc) and the demo (demo.cc) so that both show the same numbers.
#pragma once

#include <cstdint>

#include <torch/types.h>

namespace amp {
namespace examples {

// [underflow_model]
// A model whose float16 gradients underflow. Master weights w stay float32; the forward pass multiplies in
// float16 (as autocast would on a GPU: on CPU, LibTorch 1.13's autocast has no float16, so we cast by hand)
// and the loss is computed in float32 with a small weight, as auxiliary losses often are. Backward brings
// d(loss)/d(pred) = 1e-6 * 2 * error / 1024 ≈ 2e-9 back into float16: below 2^-25, so it becomes 0.
struct UnderflowModel {
  static constexpr int64_t kSize = 1024;
  static constexpr double kLossWeight = 1e-6;
  torch::Tensor w;  // [1024] float32 master weights, start at 0
  torch::Tensor x;  // [1024] inputs, |x| in [0.5, 1.5]
  torch::Tensor y;  // [1024] targets x * w_true, |w_true| in [0.5, 1.5]

  explicit UnderflowModel(torch::Device device = torch::kCPU) {
    torch::manual_seed(3);
    auto plus_minus = [](int64_t n) {  // magnitudes in [0.5, 1.5], random signs
      return (torch::rand({n}) + 0.5) * (torch::randint(0, 2, {n}).to(torch::kFloat) * 2 - 1);
    };
    x = plus_minus(kSize).to(device);
    y = x * plus_minus(kSize).to(device);
    w = torch::zeros({kSize}, torch::dtype(torch::kFloat).device(device).requires_grad(true));
  }
  torch::Tensor loss() const {
    const auto pred = x.to(torch::kHalf) * w.to(torch::kHalf);  // [1024] float16
    return kLossWeight * torch::mse_loss(pred.to(torch::kFloat), y);
  }
  double true_loss() const {
    torch::NoGradGuard no_grad;
    return torch::mse_loss(x * w, y).item<double>();
  }
};
// [underflow_model]

}  // namespace examples
}  // namespace amp
