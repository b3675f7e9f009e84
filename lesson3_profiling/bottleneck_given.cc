// Lesson 3, given code: the training loop with the planted problems, and the pieces both steps share.
#include <cmath>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard, at::AutoGradMode (ATen.h does not bring it in 2.x)

#include "lesson3_profiling/bottleneck.h"
#include "lesson3_profiling/phases.h"

namespace prof {

std::string problem_name(Problem problem) {
  switch (problem) {
    case Problem::kHostDeviceSync:
      return "host-device sync";
    case Problem::kDataInStep:
      return "data preparation in the step";
    case Problem::kTinyOps:
      return "many tiny ops";
  }
  TORCH_CHECK(false, "problem_name: unknown problem ", static_cast<int>(problem));
}

Trainer::Trainer(TrainerOptions options, c10::Device device) : options_(options), device_(device) {
  const auto& o = options_;
  TORCH_CHECK(o.batch >= 1 && o.features >= 1 && o.hidden >= 1 && o.classes >= 2,
              "Trainer: batch, features, hidden must be >= 1 and classes >= 2");
  TORCH_CHECK(o.samples >= o.batch && o.samples % o.batch == 0, "Trainer: samples (", o.samples,
              ") must be a positive multiple of batch (", o.batch, ")");
  at::manual_seed(o.seed);
  // [samples, features] 8-bit "pixels"; each feature has its own brightness range, so normalising matters.
  const auto offset = at::randint(0, 128, {1, o.features}, at::kLong);
  raw_ = (at::randint(0, 128, {o.samples, o.features}, at::kLong) + offset).to(at::kByte);
  // Labels a linear teacher gives the centred data: learnable, not trivial.
  const auto teacher = at::randn({o.features, o.classes});
  const auto centred = raw_.to(at::kFloat) - raw_.to(at::kFloat).mean(0, /*keepdim=*/true);
  labels_ = at::matmul(centred, teacher).argmax(1);  // [samples] int64

  const auto on = at::TensorOptions().dtype(at::kFloat).device(device_);
  w1_ = (at::randn({o.hidden, o.features}) / std::sqrt(static_cast<double>(o.features))).to(on).requires_grad_();
  b1_ = at::zeros({o.hidden}, on).requires_grad_();
  w2_ = (at::randn({o.classes, o.hidden}) / std::sqrt(static_cast<double>(o.hidden))).to(on).requires_grad_();
  b2_ = at::zeros({o.classes}, on).requires_grad_();
  loss_sum_ = at::zeros({}, on);
}

int64_t Trainer::next_batch_start() {
  const int64_t batches = options_.samples / options_.batch;
  return (steps_++ % batches) * options_.batch;
}

at::Tensor Trainer::forward_loss(const at::Tensor& x, const at::Tensor& y) {
  const auto hidden = at::relu(at::addmm(b1_, x, w1_.t()));  // [batch, hidden]
  const auto logits = at::addmm(b2_, hidden, w2_.t());       // [batch, classes]
  return at::nll_loss(at::log_softmax(logits, 1), y);        // [] mean cross-entropy
}

void Trainer::backward(const at::Tensor& loss) { loss.backward(); }

void Trainer::sgd_update() {
  at::NoGradGuard no_grad;
  for (at::Tensor* p : {&w1_, &b1_, &w2_, &b2_}) {
    p->sub_(p->grad(), options_.learning_rate);
    p->grad().zero_();
  }
}

// [slow_step]
void Trainer::slow_step() {
  const int64_t start = next_batch_start();
  at::Tensor x, y;
  {
    ScopedRange range(Phase::kData);
    // Planted: the dataset statistics are recomputed every step.
    const auto all = raw_.to(at::kFloat).div(255);
    const auto mean = all.mean(0);
    const auto std = all.std(0);
    // Planted: the batch is normalised and copied to the device sample by sample.
    std::vector<at::Tensor> rows;
    for (int64_t i = 0; i < options_.batch; ++i) {
      rows.push_back(raw_[start + i].to(at::kFloat).div(255).sub(mean).div(std).to(device_));
    }
    x = at::stack(rows);                                       // [batch, features]
    y = labels_.narrow(0, start, options_.batch).to(device_);  // [batch]
  }
  at::Tensor loss;
  {
    ScopedRange range(Phase::kForward);
    loss = forward_loss(x, y);
    // Planted: the host reads the loss every step (on CUDA: waits for all queued work).
    const double value = loss.item<double>();
    TORCH_CHECK(std::isfinite(value), "slow_step: the loss is not finite: ", value);
    loss_sum_.add_(loss.detach());
  }
  {
    ScopedRange range(Phase::kBackward);
    backward(loss);
  }
  {
    ScopedRange range(Phase::kOptimizer);
    sgd_update();
  }
}
// [slow_step]

at::Tensor Trainer::parameters_flat() const {
  at::NoGradGuard no_grad;
  return at::cat({w1_.flatten(), b1_.flatten(), w2_.flatten(), b2_.flatten()}).to(at::kCPU);
}

double Trainer::mean_loss() const {
  TORCH_CHECK(steps_ > 0, "mean_loss: no step has run yet");
  return loss_sum_.item<double>() / static_cast<double>(steps_);
}

}  // namespace prof
