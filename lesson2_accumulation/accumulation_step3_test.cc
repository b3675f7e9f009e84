// Checks for lesson 2, step 3: accumulation with a gradient scaler.
// Run: bazel test //lesson2_accumulation:all   (this step only: bazel test //lesson2_accumulation:accumulation_step3_test)
// The shared problems and helpers are in accumulation_test_helpers.h.
#include "lesson2_accumulation/accumulation_test_helpers.h"

namespace accumulation_checks {

TEST_CASE("[step3] the scale stays fixed inside a window and is updated once per window") {
  Problem problem(24);
  torch::optim::SGD sgd(problem.model->parameters(), torch::optim::SGDOptions(0.1));
  amp::GradScaler scaler = make_scaler(1024.0, /*growth_interval=*/1);  // grows at every clean update
  std::vector<double> seen;                                             // the scale each micro-batch saw
  const accum::LossFn loss_fn = [&](const accum::MicroBatch& mb) {
    seen.push_back(scaler.get_scale());
    return torch::mse_loss(problem.model->forward(mb.input), mb.target);
  };
  accum::AccumulationOptions options;
  options.accumulation_steps = 3;
  const auto stats = accum::train_accumulated_amp(sgd, scaler, accum::split_batch(problem.x, problem.y, 3), loss_fn,
                                                  options, no_autocast());  // 8 micro-batches: 3 + 3 + 2
  CHECK(seen == std::vector<double>{1024, 1024, 1024, 2048, 2048, 2048, 4096, 4096});
  CHECK(scaler.get_scale() == 8192.0);  // three windows, three updates
  CHECK(stats.windows == 3);
  CHECK(stats.optimizer_steps == 3);
  CHECK(stats.skipped_windows == 0);
  CHECK(stats.backward_passes == 8);
}

TEST_CASE("[step3] an inf in one micro-batch skips its whole window and backs the scale off once") {
  Problem problem(24);
  amp::GradScaler scaler = make_scaler(1024.0, /*growth_interval=*/1000);  // no growth in this test
  const auto micro_batches = accum::split_batch(problem.x, problem.y, 4);  // 6 micro-batches of 4
  int calls = 0;
  const accum::LossFn loss_fn = [&](const accum::MicroBatch& mb) {
    const auto loss = torch::mse_loss(problem.model->forward(mb.input), mb.target);
    ++calls;
    // The 4th micro-batch (in the middle window) overflows; the others in its window are clean.
    return calls == 4 ? loss * std::numeric_limits<float>::infinity() : loss;
  };
  accum::AccumulationOptions options;
  options.accumulation_steps = 2;  // windows {0,1}, {2,3}, {4,5}
  CountingSGD counting(problem.model->parameters(), torch::optim::SGDOptions(0.1));
  const auto stats = accum::train_accumulated_amp(counting, scaler, micro_batches, loss_fn, options, no_autocast());
  CHECK(stats.windows == 3);
  CHECK(stats.skipped_windows == 1);
  CHECK(stats.optimizer_steps == 2);
  CHECK(counting.steps == 2);
  CHECK(scaler.get_scale() == 512.0);  // one back-off for the window, not one per micro-batch

  // The result equals plain accumulation over the two clean windows only.
  Problem reference(24);
  torch::optim::SGD reference_sgd(reference.model->parameters(), torch::optim::SGDOptions(0.1));
  const auto all = accum::split_batch(reference.x, reference.y, 4);
  accum::train_accumulated(reference_sgd, {all[0], all[1], all[4], all[5]}, reference.loss_fn(), options);
  const double error = rel_error(problem.params(), reference.params());
  CAPTURE(error);
  CHECK(error <= 1e-6);
}

TEST_CASE("[step3] without overflow, scaled accumulation over uneven micro-batches equals plain accumulation") {
  Problem scaled(23);
  torch::optim::Adam scaled_adam(scaled.model->parameters(), torch::optim::AdamOptions(0.01));
  amp::GradScaler scaler = make_scaler(65536.0, 2);
  accum::AccumulationOptions options;
  options.accumulation_steps = 3;  // micro-batches 5+5+5 | 5+3
  const auto stats = accum::train_accumulated_amp(scaled_adam, scaler, accum::split_batch(scaled.x, scaled.y, 5),
                                                  scaled.loss_fn(), options, no_autocast());
  CHECK(stats.optimizer_steps == 2);

  Problem plain(23);
  torch::optim::Adam plain_adam(plain.model->parameters(), torch::optim::AdamOptions(0.01));
  accum::train_accumulated(plain_adam, accum::split_batch(plain.x, plain.y, 5), plain.loss_fn(), options);
  const double error = rel_error(scaled.params(), plain.params());
  CAPTURE(error);
  CHECK(error <= 1e-6);  // power-of-two scales: scaling and unscaling are exact in float32
}

TEST_CASE("[step3] the window losses with a scaler are the unscaled means over each window's items") {
  Problem problem(23);  // micro-batches 5+5+5 | 5+3
  torch::optim::SGD sgd(problem.model->parameters(), torch::optim::SGDOptions(0.0));
  amp::GradScaler scaler = make_scaler(1024.0, 1000);
  accum::AccumulationOptions options;
  options.accumulation_steps = 3;
  const auto stats = accum::train_accumulated_amp(sgd, scaler, accum::split_batch(problem.x, problem.y, 5),
                                                  problem.loss_fn(), options, no_autocast());
  CHECK(stats.optimizer_steps == 2);
  check_window_losses(problem, stats, {15, 8});
}

TEST_CASE("[step3] with a scaler and max_grad_norm, each window's unscaled accumulated gradients are clipped") {
  const double max_norm = 0.02;
  accum::AccumulationOptions options;
  options.accumulation_steps = 2;  // micro-batches of 4: windows {0,1}, {2,3}, {4,5}
  Problem reference(24);
  torch::optim::SGD ref_sgd(reference.model->parameters(), torch::optim::SGDOptions(0.1));
  const auto ref_batches = accum::split_batch(reference.x, reference.y, 4);
  for (size_t begin = 0; begin < ref_batches.size(); begin += 2) {
    ref_sgd.zero_grad();
    accum::accumulate_window({ref_batches[begin], ref_batches[begin + 1]}, reference.loss_fn());
    const double norm = torch::nn::utils::clip_grad_norm_(reference.model->parameters(), max_norm);
    CAPTURE(norm);
    REQUIRE(norm > max_norm);  // the clip really acts
    ref_sgd.step();
  }
  Problem clipped(24);
  torch::optim::SGD sgd(clipped.model->parameters(), torch::optim::SGDOptions(0.1));
  amp::GradScaler scaler = make_scaler(65536.0, 1000);
  amp::StepOptions amp_options = no_autocast();
  amp_options.max_grad_norm = max_norm;
  const auto stats = accum::train_accumulated_amp(sgd, scaler, accum::split_batch(clipped.x, clipped.y, 4),
                                                  clipped.loss_fn(), options, amp_options);
  CHECK(stats.optimizer_steps == 3);
  const double error = rel_error(clipped.params(), reference.params());
  CAPTURE(error);
  CHECK(error <= 1e-6);
}

TEST_CASE("[step3] with a scaler, every micro-batch's backward runs with autocast off") {
  Problem problem(12);
  torch::optim::SGD sgd(problem.model->parameters(), torch::optim::SGDOptions(0.1));
  amp::GradScaler scaler = make_scaler(1024.0, 1000);
  std::vector<bool> forward_autocast, backward_autocast;
  const accum::LossFn loss_fn = [&](const accum::MicroBatch& mb) {
    forward_autocast.push_back(workshop::compat::autocast_enabled(torch::kCPU));
    auto loss = torch::mse_loss(problem.model->forward(mb.input).to(torch::kFloat), mb.target);
    loss.register_hook([&](const torch::Tensor& grad) {  // runs when backward reaches this micro-batch's loss
      backward_autocast.push_back(workshop::compat::autocast_enabled(torch::kCPU));
      return grad;
    });
    return loss;
  };
  accum::AccumulationOptions options;
  options.accumulation_steps = 3;
  accum::train_accumulated_amp(sgd, scaler, accum::split_batch(problem.x, problem.y, 4), loss_fn, options,
                               amp::StepOptions{});  // CPU, bfloat16 autocast for the forward
  CHECK(forward_autocast == std::vector<bool>{true, true, true});
  CHECK(backward_autocast == std::vector<bool>{false, false, false});
}

TEST_CASE("[step3] with bfloat16 autocast on CPU, accumulated AMP training tracks float32 accumulation") {
  Problem amp_run(32), fp32_run(32);
  torch::optim::SGD amp_sgd(amp_run.model->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD fp32_sgd(fp32_run.model->parameters(), torch::optim::SGDOptions(0.1));
  amp::GradScaler scaler = make_scaler(256.0, 1000);
  accum::AccumulationOptions options;
  options.accumulation_steps = 4;
  amp::StepOptions bf16;  // CPU, bfloat16, autocast on
  const auto before = amp_run.params();
  accum::train_accumulated_amp(amp_sgd, scaler, accum::split_batch(amp_run.x, amp_run.y, 4), amp_run.loss_fn(), options,
                               bf16);
  accum::train_accumulated(fp32_sgd, accum::split_batch(fp32_run.x, fp32_run.y, 4), fp32_run.loss_fn(), options);
  const double error = rel_error(minus(amp_run.params(), before), minus(fp32_run.params(), before));
  CAPTURE(error);
  CHECK(error <= 2e-2);  // bfloat16 keeps 8 significant bits: ~4e-3 relative per rounding
  for (const auto& p : amp_run.model->parameters()) CHECK(dtype_name(p.scalar_type()) == "Float");
}

TEST_CASE("[step3] bad input gets a clear error") {
  Problem problem(8);
  torch::optim::SGD sgd(problem.model->parameters(), torch::optim::SGDOptions(0.1));
  amp::GradScaler scaler = make_scaler(1024.0, 2);
  accum::AccumulationOptions options;
  options.accumulation_steps = 0;
  const auto micro_batches = accum::split_batch(problem.x, problem.y, 4);
  CHECK_THROWS_WITH_AS(accum::train_accumulated_amp(sgd, scaler, micro_batches, problem.loss_fn(), options),
                       Contains("accumulation_steps"), c10::Error);
  options.accumulation_steps = 2;
  CHECK_THROWS_WITH_AS(accum::train_accumulated_amp(sgd, scaler, {}, problem.loss_fn(), options),
                       Contains("empty batch"), c10::Error);
  const accum::MicroBatch mismatched{problem.x.narrow(0, 0, 4), problem.y.narrow(0, 0, 2)};
  CHECK_THROWS_WITH_AS(accum::train_accumulated_amp(sgd, scaler, {mismatched}, problem.loss_fn(), options),
                       Contains("mismatched sizes"), c10::Error);
}

GPU_TEST_CASE("[step3] on CUDA with float16 autocast, accumulated AMP training tracks float32 accumulation") {
  Problem amp_run(64, torch::kCUDA), fp32_run(64, torch::kCUDA);
  torch::optim::SGD amp_sgd(amp_run.model->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD fp32_sgd(fp32_run.model->parameters(), torch::optim::SGDOptions(0.1));
  amp::GradScaler scaler = make_scaler(65536.0, 1000);
  accum::AccumulationOptions options;
  options.accumulation_steps = 4;
  amp::StepOptions fp16;
  fp16.device = c10::DeviceType::CUDA;
  fp16.dtype = c10::ScalarType::Half;
  const auto before = amp_run.params();
  const auto stats = accum::train_accumulated_amp(amp_sgd, scaler, accum::split_batch(amp_run.x, amp_run.y, 8),
                                                  amp_run.loss_fn(), options, fp16);
  accum::train_accumulated(fp32_sgd, accum::split_batch(fp32_run.x, fp32_run.y, 8), fp32_run.loss_fn(), options);
  CHECK(stats.optimizer_steps == 2);
  const double error = rel_error(minus(amp_run.params(), before), minus(fp32_run.params(), before));
  CAPTURE(error);
  CHECK(error <= 1e-2);  // float16 keeps 11 bits of mantissa
}

}  // namespace accumulation_checks
