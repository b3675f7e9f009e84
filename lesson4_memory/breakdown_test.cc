// Checks for lesson 4, step 1: where the bytes of a training step go, and the cheap levers.
// Run: bazel test //lesson4_memory:all --test_arg=--test-case='*step1*'
#include "tests/torch_doctest.h"

#include <torch/torch.h>

#include "common/memory_meter.h"
#include "lesson4_memory/breakdown.h"
#include "lesson4_memory/workload.h"

using doctest::Contains;

namespace {

// An 8-layer MLP of width 64 and a batch of 256 rows: small enough to reason about every byte.
mem::MlpSpec small_spec() {
  mem::MlpSpec spec;
  spec.layers = 8;
  spec.width = 64;
  spec.batch = 256;
  return spec;
}

constexpr int64_t kParamBytes = 8 * (64 * 64 + 64) * 4;  // 8 × (weight + bias) float32 = 133,120
constexpr int64_t kActivation = 256 * 64 * 4;            // one [256, 64] float32 tensor = 65,536

}  // namespace

TEST_CASE("[step1] the meter measures a known allocation exactly, and bytes_of agrees") {
  workshop::MemoryMeter meter(torch::kCPU);
  const auto a = torch::empty({1000, 25}, torch::kFloat);   // 100,000 bytes
  const auto b = torch::empty({300}, torch::kDouble);       //   2,400 bytes
  const auto c = torch::empty({10, 10}, torch::kBFloat16);  //     200 bytes
  CHECK(meter.current_bytes() == 102600);
  CHECK(mem::bytes_of({a, b, c}) == 102600);
  CHECK(mem::bytes_of({a, torch::Tensor()}) == 100000);  // undefined tensors count zero
  CHECK(mem::bytes_of({}) == 0);
}

TEST_CASE("[step1] the breakdown of an MLP step with Adam: gradients = parameters, state = 2 x parameters") {
  const mem::MlpSpec spec = small_spec();
  auto model = mem::make_deep_mlp(spec, torch::kCPU);
  const auto batch = mem::make_batch(spec, torch::kCPU);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  const mem::Breakdown b = mem::measure_breakdown(
      model->parameters(), adam, [&] { return torch::mse_loss(model->forward(batch.first), batch.second); },
      torch::kCPU);
  CAPTURE(b.parameters);
  CAPTURE(b.gradients);
  CAPTURE(b.optimizer_state);
  CAPTURE(b.activations);
  CAPTURE(b.peak);
  CHECK(b.parameters == kParamBytes);
  CHECK(b.gradients == kParamBytes);
  CHECK(b.optimizer_state == 2 * kParamBytes);  // exp_avg and exp_avg_sq
  // Each layer keeps two [256, 64] tensors for backward (Linear's input, GELU's input); plus the loss.
  CHECK(b.activations >= 2 * 8 * kActivation);
  CHECK(b.activations <= 2 * 8 * kActivation + kActivation);
  // The meter's peak is explained by the parts: at least parameters + activations, at most all of them plus
  // one step's worth of temporaries (one activation and one parameter set).
  CHECK(b.peak >= b.parameters + b.activations);
  CHECK(b.peak <= b.total() + kActivation + kParamBytes);
}

TEST_CASE("[step1] SGD keeps no state; SGD with momentum keeps one buffer per parameter") {
  const mem::MlpSpec spec = small_spec();
  auto model = mem::make_deep_mlp(spec, torch::kCPU);
  const auto batch = mem::make_batch(spec, torch::kCPU);
  auto loss_fn = [&] { return torch::mse_loss(model->forward(batch.first), batch.second); };
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01));
  CHECK(mem::measure_breakdown(model->parameters(), sgd, loss_fn, torch::kCPU).optimizer_state == 0);
  torch::optim::SGD momentum(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  CHECK(mem::measure_breakdown(model->parameters(), momentum, loss_fn, torch::kCPU).optimizer_state == kParamBytes);
}

TEST_CASE("[step1] gradients set to none free their bytes at once; zeroing keeps them") {
  const mem::MlpSpec spec = small_spec();
  auto model = mem::make_deep_mlp(spec, torch::kCPU);
  const auto batch = mem::make_batch(spec, torch::kCPU);
  torch::mse_loss(model->forward(batch.first), batch.second).backward();
  workshop::MemoryMeter meter(torch::kCPU);
  for (auto& p : model->parameters()) p.mutable_grad().zero_();
  CHECK(meter.current_bytes() == 0);  // zeroing frees nothing
  mem::set_grads_to_none(model->parameters());
  CHECK(meter.current_bytes() == -kParamBytes);
  for (const auto& p : model->parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("[step1] evaluation under NoGradGuard keeps no activations and gives the same loss") {
  const mem::MlpSpec spec = small_spec();
  auto model = mem::make_deep_mlp(spec, torch::kCPU);
  const auto batch = mem::make_batch(spec, torch::kCPU);
  auto loss_fn = [&] { return torch::mse_loss(model->forward(batch.first), batch.second); };
  workshop::MemoryMeter meter(torch::kCPU);
  double with_grad = 0;
  int64_t kept_with_grad = 0;
  {
    const auto loss = loss_fn();
    kept_with_grad = meter.current_bytes();
    with_grad = loss.item<double>();
  }
  meter.reset();
  const double evaluated = mem::evaluate_loss(loss_fn);
  const int64_t eval_peak = meter.peak_bytes();
  CAPTURE(kept_with_grad);
  CAPTURE(eval_peak);
  CHECK(evaluated == doctest::Approx(with_grad).epsilon(1e-6));
  CHECK(eval_peak <= 3 * kActivation + 1024);  // a few live tensors at a time (and scalars), whatever the depth
  CHECK(kept_with_grad >= 16 * kActivation);
  CHECK(meter.current_bytes() == 0);
}

TEST_CASE("[step1] bad input is rejected with a clear message") {
  const mem::MlpSpec spec = small_spec();
  auto model = mem::make_deep_mlp(spec, torch::kCPU);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01));
  const auto x = torch::ones({4, 64});
  CHECK_THROWS_WITH_AS(mem::measure_breakdown(
                           {}, sgd, [&] { return model->forward(x).sum(); }, torch::kCPU),
                       Contains("no parameters"), c10::Error);
  CHECK_THROWS_WITH_AS(mem::measure_breakdown(
                           model->parameters(), sgd, [&] { return x.sum(); }, torch::kCPU),
                       Contains("requires grad"), c10::Error);
  CHECK_THROWS_WITH_AS(mem::evaluate_loss({}), Contains("empty"), c10::Error);
  CHECK_THROWS_WITH_AS(mem::evaluate_loss([&] { return x; }), Contains("one-element"), c10::Error);
  CHECK_THROWS_WITH_AS(mem::set_grads_to_none({torch::Tensor()}), Contains("undefined"), c10::Error);
}
