// Checks for lesson 1, part B: the gradient scaler (steps 3-6) and the AMP training step (step 7).
// Run: bazel test //lesson1_amp:all   (one step: --test_arg=--test-case='*step4*')
// Several cases mirror PyTorch's own GradScaler tests (test/test_cuda.py: test_grad_scaling_*).
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

using doctest::Contains;

namespace {

using amp::examples::UnderflowModel;
using workshop::test::all_equal;
using workshop::test::max_abs_diff;

amp::GradScaler make_scaler(double init_scale, double growth = 2.0, double backoff = 0.5, int64_t interval = 2000,
                            amp::KernelPath kernels = amp::KernelPath::kAuto) {
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
UnderflowRun train_underflow_model(torch::Device device, bool scaling, amp::KernelPath kernels, int steps) {
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

}  // namespace

// ---- step 3: scale ---------------------------------------------------------------------------------------

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

// ---- step 4: unscale -------------------------------------------------------------------------------------

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

// ---- step 5: step ----------------------------------------------------------------------------------------

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

namespace {
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
}  // namespace

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

// ---- step 6: update and state ----------------------------------------------------------------------------

TEST_CASE("[step6] update_scale_plain follows the state machine: scale 4, growth 2, backoff 0.25, interval 2") {
  auto scale = torch::full({1}, 4.0f);
  auto tracker = torch::zeros({1}, torch::kInt);
  const auto clean = torch::zeros({1});
  const auto inf = torch::ones({1});
  amp::update_scale_plain(scale, tracker, clean, 2.0, 0.25, 2);
  INFO("after 1 clean step (interval 2): the tracker counts it, the scale stays");
  CHECK(tracker.item<int>() == 1);
  CHECK(scale.item<float>() == 4.0f);
  amp::update_scale_plain(scale, tracker, clean, 2.0, 0.25, 2);
  INFO("after 2 clean steps: the scale grows by 2 and the tracker resets to 0");
  CHECK(tracker.item<int>() == 0);
  CHECK(scale.item<float>() == 8.0f);
  amp::update_scale_plain(scale, tracker, inf, 2.0, 0.25, 2);
  INFO("after a step with inf: the scale backs off by 0.25 and the tracker resets to 0");
  CHECK(tracker.item<int>() == 0);
  CHECK(scale.item<float>() == 2.0f);
}

TEST_CASE(
    "[step6] update_scale_plain is ATen's kernel: a NaN flag is an overflow, growth when the count equals the interval") {
  auto scale = torch::full({1}, 4.0f);
  auto tracker = torch::full({1}, 1, torch::kInt);
  amp::update_scale_plain(scale, tracker, torch::full({1}, NAN), 2.0, 0.25, 2);  // `if (found_inf)`: NaN is true
  CHECK(scale.item<float>() == 1.0f);
  CHECK(tracker.item<int>() == 0);
  amp::update_scale_plain(scale, tracker, torch::full({1}, 2.0f), 2.0, 0.25, 2);  // two optimizers' flags summed
  CHECK(scale.item<float>() == 0.25f);
  // A tracker past the interval (never produced by a GradScaler) counts on without growth, as in the kernel.
  tracker.fill_(5);
  amp::update_scale_plain(scale, tracker, torch::zeros({1}), 2.0, 0.25, 2);
  CHECK(tracker.item<int>() == 6);
  CHECK(scale.item<float>() == 0.25f);
}

TEST_CASE("[step6] several optimizers on one scaler: an inf seen by any backs the scale off once per update") {
  Problem a(torch::kCPU, 7), b(torch::kCPU, 8);
  torch::optim::SGD sgd_a(a.model->parameters(), 0.01), sgd_b(b.model->parameters(), 0.01);
  amp::GradScaler scaler = make_scaler(1024.0, 2.0, 0.5, 2);
  struct Iteration {
    bool inf_a, inf_b;
    double scale_after;
    int64_t tracker_after;
  };
  // clean (tracker 1), inf in a, inf in b, inf in both (one back-off, not two), clean, clean (growth).
  const std::vector<Iteration> iterations{{false, false, 1024, 1}, {true, false, 512, 0},  {false, true, 256, 0},
                                          {true, true, 128, 0},    {false, false, 128, 1}, {false, false, 256, 0}};
  for (size_t i = 0; i < iterations.size(); ++i) {
    CAPTURE(i);
    sgd_a.zero_grad();
    sgd_b.zero_grad();
    scaler.scale(a.loss() + b.loss()).backward();
    {
      torch::NoGradGuard no_grad;
      if (iterations[i].inf_a) a.model->bias.grad().fill_(INFINITY);
      if (iterations[i].inf_b) b.model->bias.grad().fill_(NAN);
    }
    CHECK(scaler.step(sgd_a) == !iterations[i].inf_a);
    CHECK(scaler.step(sgd_b) == !iterations[i].inf_b);
    scaler.update();
    CHECK(scaler.get_scale() == iterations[i].scale_after);
    CHECK(scaler.get_growth_tracker() == iterations[i].tracker_after);
  }
}

TEST_CASE("[step6] update(new_scale) sets the scale, keeps the growth tracker and starts a new iteration") {
  Problem problem;
  torch::optim::SGD sgd(problem.model->parameters(), 0.01);
  amp::GradScaler scaler = make_scaler(1024.0, 2.0, 0.5, 3);
  CHECK_THROWS_WITH_AS(scaler.update(64.0), Contains("before scale"), c10::Error);
  auto iteration = [&] {
    sgd.zero_grad();
    scaler.scale(problem.loss()).backward();
    return scaler.step(sgd);
  };
  CHECK(iteration());
  scaler.update();  // tracker 1
  CHECK(iteration());
  scaler.update(100.0);
  CHECK(scaler.get_scale() == 100.0);
  CHECK(scaler.get_growth_tracker() == 1);
  CHECK(iteration());  // the per-optimizer state was reset: step() runs again
  scaler.update();     // tracker 2
  CHECK(scaler.get_scale() == 100.0);
  CHECK(iteration());
  scaler.update();  // tracker 3 == interval: growth
  CHECK(scaler.get_scale() == 200.0);
  CHECK(scaler.get_growth_tracker() == 0);
  scaler.update(8.0);  // no step needed before it
  CHECK(scaler.get_scale() == 8.0);
  CHECK_THROWS_WITH_AS(scaler.update(0.0), Contains("new_scale"), c10::Error);
  CHECK_THROWS_WITH_AS(scaler.update(std::numeric_limits<double>::infinity()), Contains("new_scale"), c10::Error);
  CHECK(scaler.get_scale() == 8.0);
  amp::GradScalerOptions off;
  off.enabled = false;
  amp::GradScaler disabled(off);
  disabled.update(5.0);  // a pass-through
  CHECK(disabled.get_scale() == 1.0);
}

TEST_CASE("[step6] from 128 with interval 1, three clean iterations and one with inf leave the scale at 512") {
  Problem problem;
  torch::optim::SGD sgd(problem.model->parameters(), 0.01);
  amp::GradScaler scaler = make_scaler(128.0, 2.0, 0.5, 1);
  for (int i = 0; i < 4; ++i) {
    sgd.zero_grad();
    scaler.scale(problem.loss()).backward();
    if (i == 3) {
      torch::NoGradGuard no_grad;
      problem.model->bias.grad().fill_(NAN);
    }
    CHECK(scaler.step(sgd) == (i != 3));
    scaler.update();
  }
  CHECK(scaler.get_scale() == 512.0);
  CHECK(scaler.get_growth_tracker() == 0);
}

TEST_CASE("[step6] growth never makes the scale inf") {
  const double largest_power_of_two = std::ldexp(1.0, 127);  // float32 max is just below 2^128
  auto scale = torch::full({1}, largest_power_of_two, torch::kFloat);
  auto tracker = torch::zeros({1}, torch::kInt);
  amp::update_scale_plain(scale, tracker, torch::zeros({1}), 2.0, 0.5, 1);
  CHECK(scale.item<double>() == largest_power_of_two);
  INFO("a growth the scale skips because it would be inf still resets the tracker, as ATen's _amp_update_scale_");
  CHECK(tracker.item<int>() == 0);

  Problem problem;
  torch::optim::SGD sgd(problem.model->parameters(), 0.0);
  amp::GradScaler scaler = make_scaler(largest_power_of_two, 2.0, 0.5, 1);
  scaler.scale(problem.loss() * 0).backward();  // zero loss: the scaled gradients stay finite
  scaler.step(sgd);
  scaler.update();
  CHECK(std::isfinite(scaler.get_scale()));
  CHECK(scaler.get_scale() == largest_power_of_two);
}

TEST_CASE("[step6] update() before any step gives a clear error") {
  Problem problem;
  amp::GradScaler scaler;
  CHECK_THROWS_WITH_AS(scaler.update(), Contains("before scale"), c10::Error);
  (void)scaler.scale(problem.loss());
  CHECK_THROWS_WITH_AS(scaler.update(), Contains("no inf checks"), c10::Error);
}

TEST_CASE("[step6] the state survives state_dict/load_state_dict and torch::save/torch::load") {
  Problem problem;
  torch::optim::SGD sgd(problem.model->parameters(), 0.01);
  amp::GradScaler scaler = make_scaler(256.0, 4.0, 0.125, 3);
  for (int i = 0; i < 2; ++i) {  // two clean steps: tracker 2, scale unchanged
    sgd.zero_grad();
    scaler.scale(problem.loss()).backward();
    scaler.step(sgd);
    scaler.update();
  }
  const amp::GradScalerState state = scaler.state_dict();
  CHECK(state.enabled);
  CHECK(state.scale == 256.0);
  CHECK(state.growth_factor == 4.0);
  CHECK(state.backoff_factor == 0.125);
  CHECK(state.growth_interval == 3);
  CHECK(state.growth_tracker == 2);

  SUBCASE("load_state_dict") {
    amp::GradScaler restored;
    restored.load_state_dict(state);
    const amp::GradScalerState again = restored.state_dict();
    CHECK(again.scale == state.scale);
    CHECK(again.growth_factor == state.growth_factor);
    CHECK(again.backoff_factor == state.backoff_factor);
    CHECK(again.growth_interval == state.growth_interval);
    CHECK(again.growth_tracker == state.growth_tracker);
    // The restored scaler continues the same schedule: one more clean step grows the scale by 4.
    sgd.zero_grad();
    restored.scale(problem.loss()).backward();
    restored.step(sgd);
    restored.update();
    CHECK(restored.get_scale() == 1024.0);
  }
  SUBCASE("torch::save / torch::load") {
    const char* tmp = std::getenv("TEST_TMPDIR");  // Bazel's scratch folder; /tmp elsewhere
    const std::string path = std::string(tmp ? tmp : "/tmp") + "/grad_scaler_state.pt";
    torch::save(scaler, path);
    amp::GradScaler restored;
    torch::load(restored, path);
    std::remove(path.c_str());
    CHECK(restored.get_scale() == 256.0);
    CHECK(restored.get_growth_tracker() == 2);
    CHECK(restored.state_dict().growth_interval == 3);
  }
}

TEST_CASE("[step6] state_dict saves the current scale and tracker, not the initial ones") {
  Problem problem;
  torch::optim::SGD sgd(problem.model->parameters(), 0.01);
  amp::GradScaler scaler = make_scaler(1024.0, 2.0, 0.5, 3);
  for (int i = 0; i < 4; ++i) {  // clean x3: growth to 2048; clean: tracker 1
    sgd.zero_grad();
    scaler.scale(problem.loss()).backward();
    scaler.step(sgd);
    scaler.update();
  }
  const amp::GradScalerState state = scaler.state_dict();
  CHECK(state.scale == 2048.0);
  CHECK(state.growth_tracker == 1);
}

TEST_CASE("[step6] load_state_dict into a scaler that has already scaled replaces its live scale and tracker") {
  // As PyTorch's test_grad_scaling_state_dict: the loading scaler has run before.
  Problem problem;
  torch::optim::SGD sgd(problem.model->parameters(), 0.01);
  amp::GradScaler running = make_scaler(65536.0, 2.0, 0.5, 2000);
  running.scale(problem.loss()).backward();
  running.step(sgd);
  running.update();
  REQUIRE(running.get_growth_tracker() == 1);
  amp::GradScalerState state;
  state.scale = 32.0;
  state.growth_factor = 4.0;
  state.backoff_factor = 0.25;
  state.growth_interval = 2;
  state.growth_tracker = 1;
  running.load_state_dict(state);
  CHECK(running.get_scale() == 32.0);
  CHECK(running.get_growth_tracker() == 1);
  const auto loss = torch::tensor(0.5f);
  CHECK(running.scale(loss).item<double>() == 16.0);  // the next scale() uses the loaded scale
  sgd.zero_grad();
  running.scale(problem.loss()).backward();
  running.step(sgd);
  running.update();  // tracker 2 == the loaded interval: grows by the loaded factor
  CHECK(running.get_scale() == 128.0);
  CHECK(running.get_growth_tracker() == 0);
}

TEST_CASE("[step6] load_state_dict rejects an invalid state and one saved from a disabled scaler") {
  amp::GradScaler scaler = make_scaler(512.0);
  amp::GradScalerState state;
  state.scale = 0.0;
  CHECK_THROWS_WITH_AS(scaler.load_state_dict(state), Contains("scale"), c10::Error);
  state = {};
  state.growth_tracker = state.growth_interval;
  CHECK_THROWS_WITH_AS(scaler.load_state_dict(state), Contains("growth_tracker"), c10::Error);

  // A disabled scaler has no state (PyTorch: an empty state dict); loading that must not reset the scale.
  amp::GradScalerOptions options;
  options.enabled = false;
  amp::GradScaler disabled(options);
  const amp::GradScalerState none = disabled.state_dict();
  CHECK_FALSE(none.enabled);
  CHECK_THROWS_WITH_AS(scaler.load_state_dict(none), Contains("disabled"), c10::Error);
  CHECK(scaler.get_scale() == 512.0);
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/disabled_scaler_state.pt";
  torch::save(disabled, path);
  CHECK_THROWS_WITH_AS(torch::load(scaler, path), Contains("disabled"), c10::Error);
  std::remove(path.c_str());
  CHECK(scaler.get_scale() == 512.0);

  // A disabled scaler is a pass-through: loading into it and updating it change nothing.
  disabled.load_state_dict(amp::GradScalerState{});
  disabled.update();
  CHECK(disabled.get_scale() == 1.0);
  CHECK(disabled.get_growth_tracker() == 0);
}

// ---- step 7: the full training step ----------------------------------------------------------------------

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

// ---- GPU -------------------------------------------------------------------------------------------------

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

GPU_TEST_CASE("[step6] on CUDA the fused and the plain scale update agree over a sequence") {
  auto s1 = torch::full({1}, 4.0f, torch::kCUDA), s2 = s1.clone();
  auto t1 = torch::zeros({1}, torch::dtype(torch::kInt).device(torch::kCUDA)), t2 = t1.clone();
  for (float inf : {0.f, 0.f, 1.f, 0.f, 0.f, 0.f, 1.f, 1.f}) {
    const auto found = torch::full({1}, inf, torch::kCUDA);
    amp::update_scale_fused(s1, t1, found, 2.0, 0.25, 2);
    amp::update_scale_plain(s2, t2, found, 2.0, 0.25, 2);
    CHECK(s1.item<float>() == s2.item<float>());
    CHECK(t1.item<int>() == t2.item<int>());
  }
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
