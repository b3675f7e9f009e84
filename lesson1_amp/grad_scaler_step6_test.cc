// Checks for lesson 1, step 6: update and state.
// Run: bazel test //lesson1_amp:all   (this step only: bazel test //lesson1_amp:grad_scaler_step6_test)
// The shared problems and helpers are in grad_scaler_test_helpers.h.
#include "lesson1_amp/grad_scaler_test_helpers.h"

namespace scaler_checks {

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

}  // namespace scaler_checks
