// Checks for lesson 6, step 2: the fused kernel.
// Run: bazel test //lesson6_fusion:all   (this step only: bazel test //lesson6_fusion:fused_adamw_step2_test)
// The shared state, oracle and helpers are in fused_adamw_test_helpers.h.
#include "lesson6_fusion/fused_adamw_test_helpers.h"

namespace adamw_checks {

TEST_CASE("[step2] float32: the fused kernel follows torch::optim::AdamW for 100 steps") {
  const int64_t n = 10007;  // not a multiple of the vector width
  SUBCASE("no weight decay") {
    const double worst = worst_vs_torch(hyper_with(1e-2, 0.0), gradients(n, 100, 1.0), n);
    CAPTURE(worst);
    CHECK(worst <= kFloatTolerance);
  }
  SUBCASE("weight decay 0.1") {
    const double worst = worst_vs_torch(hyper_with(1e-2, 0.1), gradients(n, 100, 1.0), n);
    CAPTURE(worst);
    CHECK(worst <= kFloatTolerance);
  }
  SUBCASE("small gradients and a large eps (eps matters, outside the square root)") {
    const double worst = worst_vs_torch(hyper_with(1e-2, 0.05, 1e-3), gradients(n, 100, 1e-3), n);
    CAPTURE(worst);
    CHECK(worst <= kFloatTolerance);
  }
  SUBCASE("other betas") {
    fusion::AdamWHyper h = hyper_with(3e-3, 0.02);
    h.beta1 = 0.5;
    h.beta2 = 0.9;
    const double worst = worst_vs_torch(h, gradients(n, 100, 1.0), n);
    CAPTURE(worst);
    CHECK(worst <= kFloatTolerance);
  }
}

TEST_CASE("[step2] float32: both moments are written back and match the one-op-at-a-time step") {
  const int64_t n = 4099;
  torch::manual_seed(2);
  const torch::Tensor start = torch::randn({n});
  State fused = make_state(start.clone()), plain = make_state(start.clone());
  const Worst worst = run_side_by_side(fused, plain, hyper_with(1e-2, 0.1), gradients(n, 50, 0.5), false);
  CAPTURE(worst.param);
  CAPTURE(worst.exp_avg);
  CAPTURE(worst.exp_avg_sq);
  CHECK(worst.param <= kFloatTolerance);
  CHECK(worst.exp_avg <= kFloatTolerance);
  CHECK(worst.exp_avg_sq <= kFloatTolerance);
}

TEST_CASE("[step2] with a zero gradient only the weight decay moves the parameters") {
  const int64_t n = 1000;
  torch::manual_seed(4);
  const torch::Tensor start = torch::randn({n});
  const torch::Tensor zero = torch::zeros({n});
  SUBCASE("weight decay 0: nothing changes") {
    State s = make_state(start.clone());
    for (int i = 1; i <= 5; ++i)
      fusion::adamw_kernel_cpu(s.param, zero, s.exp_avg, s.exp_avg_sq, hyper_with(0.1, 0), i);
    CHECK(torch::equal(s.param, start));
    CHECK(s.exp_avg.abs().max().item<float>() == 0.0f);
    CHECK(s.exp_avg_sq.abs().max().item<float>() == 0.0f);
  }
  SUBCASE("weight decay 0.5, lr 0.1: p shrinks by 0.95 per step") {
    State s = make_state(start.clone());
    for (int i = 1; i <= 5; ++i)
      fusion::adamw_kernel_cpu(s.param, zero, s.exp_avg, s.exp_avg_sq, hyper_with(0.1, 0.5), i);
    const double worst = rel_error({s.param}, {start * std::pow(0.95, 5)});
    CAPTURE(worst);
    CHECK(worst <= kFloatTolerance);
  }
}

TEST_CASE("[step2] every element is updated, also in the last partial vector and across pieces of work") {
  for (int64_t n : {1, 3, 7, 9, 33, 100003}) {
    CAPTURE(n);
    torch::manual_seed(6);
    const torch::Tensor start = torch::randn({n});
    State fused = make_state(start.clone()), plain = make_state(start.clone());
    std::vector<torch::Tensor> grads = gradients(n, 3, 1.0);
    for (torch::Tensor& g : grads) g = g.abs() + 0.1;  // one sign: the three updates cannot cancel out
    const Worst worst = run_side_by_side(fused, plain, hyper_with(1e-2, 0.01), grads, false);
    CHECK(worst.param <= kFloatTolerance);
    CHECK(worst.exp_avg <= kFloatTolerance);
    CHECK(worst.exp_avg_sq <= kFloatTolerance);
    // Each element moved.
    CHECK(fused.param.ne(start).all().item<bool>());
  }
}

TEST_CASE("[step2] nothing past a tensor's end is read or written: every tail, every dtype, tensors against a wall") {
  // Each of the four tensors ends where an inaccessible page begins: a last vector loaded or stored whole, or a
  // 16-bit conversion loop that runs over all the lanes, crashes the binary here (SIGSEGV, the case named above
  // it in the log). The results must also be those of the same kernel on ordinary tensors.
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t n : tail_sizes()) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(n);
      torch::manual_seed(n);
      State plain = make_state(torch::randn({n}).to(dtype));
      plain.exp_avg = torch::rand({n});
      plain.exp_avg_sq = torch::rand({n});
      const torch::Tensor grad = torch::randn({n}).to(dtype);
      State walled;
      walled.param = guarded_copy(plain.param);
      walled.exp_avg = guarded_copy(plain.exp_avg);
      walled.exp_avg_sq = guarded_copy(plain.exp_avg_sq);
      fusion::adamw_kernel_cpu(walled.param, guarded_copy(grad), walled.exp_avg, walled.exp_avg_sq, hyper, 3);
      fusion::adamw_kernel_cpu(plain.param, grad, plain.exp_avg, plain.exp_avg_sq, hyper, 3);
      CHECK(torch::equal(walled.param, plain.param));
      CHECK(torch::equal(walled.exp_avg, plain.exp_avg));
      CHECK(torch::equal(walled.exp_avg_sq, plain.exp_avg_sq));
    }
  }
}

TEST_CASE("[step2] views that start anywhere in their buffers, each operand alone: the bits of aligned tensors") {
  // A view's first element may sit anywhere in a vector's width (a slice of a larger tensor): the kernel must start
  // at data_ptr() (the view's offset included) and load without assuming alignment.
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  const int64_t n = 32768 + 13;  // two pieces and a partial vector
  const char* names[4] = {"param", "grad", "exp_avg", "exp_avg_sq"};
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int which = 0; which < 4; ++which) {
      for (int64_t offset : {1, 3, 7}) {
        CAPTURE(dtype_name(dtype));
        CAPTURE(names[which]);
        CAPTURE(offset);
        torch::manual_seed(offset);
        const torch::Tensor values[4] = {torch::randn({n}).to(dtype), torch::randn({n}).to(dtype),
                                         torch::randn({n}) * 0.1, torch::rand({n})};
        torch::Tensor buffers[4], operands[4];
        for (int o = 0; o < 4; ++o) operands[o] = view_in_buffer(values[o], o == which ? offset : 0, buffers[o]);
        State aligned = make_state(values[0].clone());
        aligned.exp_avg = values[2].clone();
        aligned.exp_avg_sq = values[3].clone();
        fusion::adamw_kernel_cpu(operands[0], operands[1], operands[2], operands[3], hyper, 1, 0.5f);
        fusion::adamw_kernel_cpu(aligned.param, values[1], aligned.exp_avg, aligned.exp_avg_sq, hyper, 1, 0.5f);
        CHECK(torch::equal(operands[0], aligned.param));
        CHECK(torch::equal(operands[2], aligned.exp_avg));
        CHECK(torch::equal(operands[3], aligned.exp_avg_sq));
        CHECK(torch::equal(operands[1], values[1]));
        // Nothing written before the view or after it.
        const torch::Tensor& b = buffers[which];
        CHECK(b.narrow(0, 0, offset).eq(0.5).all().item<bool>());
        CHECK(b[-1].item<float>() == 0.5f);
      }
    }
  }
}

TEST_CASE("[step2] 16-bit parameters with float32 state: each step is the float32 step, rounded to nearest") {
  const int64_t n = 20011;
  for (const auto& [dtype, half_ulp] : {std::pair<torch::ScalarType, double>{torch::kBFloat16, std::ldexp(1.0, -8)},
                                        std::pair<torch::ScalarType, double>{torch::kHalf, std::ldexp(1.0, -11)}}) {
    CAPTURE(dtype_name(dtype));
    torch::manual_seed(8);
    State s = make_state(torch::randn({n}).to(dtype));
    const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
    const std::vector<torch::Tensor> grads = gradients(n, 20, 1.0);
    double worst_state = 0, worst_rounding = 0, exact_fraction = 1;
    for (const torch::Tensor& grad32 : grads) {
      const torch::Tensor grad = grad32.to(dtype);
      // The float32 master reference: this step from the same (rounded) parameter, state and gradient.
      State master = make_state(s.param.to(torch::kFloat));
      master.exp_avg = s.exp_avg.clone();
      master.exp_avg_sq = s.exp_avg_sq.clone();
      master.step = s.step;
      fusion::unfused_adamw_step(master.param, grad.to(torch::kFloat), master.exp_avg, master.exp_avg_sq, hyper,
                                 ++master.step);
      fusion::adamw_kernel_cpu(s.param, grad, s.exp_avg, s.exp_avg_sq, hyper, ++s.step);
      REQUIRE(dtype_name(s.param.scalar_type()) == dtype_name(dtype));
      REQUIRE(dtype_name(s.exp_avg.scalar_type()) == "Float");
      worst_state = std::max(
          {worst_state, rel_error({s.exp_avg}, {master.exp_avg}), rel_error({s.exp_avg_sq}, {master.exp_avg_sq})});
      // Rounding to nearest is off by at most half a unit in the last place: |x| * 2^-8 (bfloat16), 2^-11 (half),
      // and half of float16's smallest subnormal step near zero.
      const torch::Tensor error = (s.param.to(torch::kFloat) - master.param).abs();
      const torch::Tensor allowed = master.param.abs() * half_ulp * (1 + 1e-3) + std::ldexp(1.0, -25);
      worst_rounding = std::max(worst_rounding, (error / allowed).max().item<double>());
      exact_fraction =
          std::min(exact_fraction, s.param.eq(master.param.to(dtype)).to(torch::kDouble).mean().item<double>());
    }
    CAPTURE(worst_state);
    CAPTURE(worst_rounding);
    CAPTURE(exact_fraction);
    CHECK(worst_state <= kFloatTolerance);
    CHECK(worst_rounding <= 1.0);
    CHECK(exact_fraction >= 0.999);
  }
}

TEST_CASE("[step2] on 4 ATen threads the kernel runs its pieces in one parallel region, with the one-thread bits") {
  const int64_t n = (1 << 20) + 3;  // 33 pieces of 32768
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    CAPTURE(dtype_name(dtype));
    torch::manual_seed(12);
    const torch::Tensor start = torch::randn({n}).to(dtype);
    const torch::Tensor grad = torch::randn({n}).to(dtype);
    State one = make_state(start.clone()), four = make_state(start.clone());
    {
      const ThreadsFor threads(1);
      for (int step = 1; step <= 2; ++step)
        fusion::adamw_kernel_cpu(one.param, grad, one.exp_avg, one.exp_avg_sq, hyper_with(1e-2, 0.1), step);
    }
    const ThreadsFor threads(4);
    int regions = 0;
    for (int step = 1; step <= 2; ++step) {
      regions += parallel_regions([&] {
        fusion::adamw_kernel_cpu(four.param, grad, four.exp_avg, four.exp_avg_sq, hyper_with(1e-2, 0.1), step);
      });
    }
    CHECK(torch::equal(four.param, one.param));
    CHECK(torch::equal(four.exp_avg, one.exp_avg));
    CHECK(torch::equal(four.exp_avg_sq, one.exp_avg_sq));
    if (regions_are_counted()) {
      CHECK(regions == 2);  // one at::parallel_for per step
    } else {
      MESSAGE("parallel regions are not counted here (no OpenMP in this LibTorch)");
    }
  }
}

TEST_CASE("[step2] the same bits whichever instruction set runs the loop: the baseline's 4 lanes or AVX2's 8") {
  // The reference compiles its loop twice and picks one at run time (fused_adamw.h, cpu_isa()). Both must give the
  // same bits: every operation rounds the same in 4 lanes or 8, unless the compiler fuses a multiply and an add
  // into one FMA in the AVX2 copy (one rounding instead of two).
  if (!has_avx2_copy()) return;
  std::vector<int64_t> sizes = tail_sizes();
  sizes.push_back(2 * 32768 + 13);
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t n : sizes) {
      for (const auto& [weight_decay, multiplier] : {std::pair{0.0, 1.0f}, std::pair{0.1, 1.0f / 3}}) {
        CAPTURE(dtype_name(dtype));
        CAPTURE(n);
        CAPTURE(weight_decay);
        CAPTURE(multiplier);
        torch::manual_seed(31);
        const torch::Tensor start = torch::randn({n}).to(dtype);
        const std::vector<torch::Tensor> grads = {(torch::randn({n}) * 4096).to(dtype), torch::randn({n}).to(dtype),
                                                  (torch::randn({n}) * 1e-3).to(dtype)};
        State state[2] = {make_state(start.clone()), make_state(start.clone())};
        const fusion::CpuIsa isas[2] = {fusion::CpuIsa::kBaseline, fusion::CpuIsa::kAvx2};
        for (int k = 0; k < 2; ++k) {
          const IsaFor isa(isas[k]);
          State& s = state[k];
          for (const torch::Tensor& grad : grads)
            fusion::adamw_kernel_cpu(s.param, grad, s.exp_avg, s.exp_avg_sq, hyper_with(1e-2, weight_decay), ++s.step,
                                     multiplier);
        }
        CHECK(torch::equal(state[1].param, state[0].param));
        CHECK(torch::equal(state[1].exp_avg, state[0].exp_avg));
        CHECK(torch::equal(state[1].exp_avg_sq, state[0].exp_avg_sq));
      }
    }
  }
}

TEST_CASE("[step2] set_cpu_isa switches the loop's copy: each instruction set runs its own") {
  // The bits are the same either way (above), so only the copies' own count (note_loop_copy, given) shows that the
  // switch is not ignored. A kernel with one copy of its loop does not count them: then this is skipped.
  const int64_t n = 3 * 32768 + 5;
  State s = make_state(torch::randn({n}).to(torch::kBFloat16));
  const auto run = [&](fusion::CpuIsa isa) {
    const IsaFor chosen(isa);
    return copies_run_by([&] {
      fusion::adamw_kernel_cpu(s.param, torch::randn({n}).to(torch::kBFloat16), s.exp_avg, s.exp_avg_sq,
                               hyper_with(1e-2, 0.1), 1);
    });
  };
  const auto baseline = run(fusion::CpuIsa::kBaseline);
  if (baseline.first + baseline.second == 0) {
    MESSAGE("skipped: this kernel does not count its loop's copies (note_loop_copy): one copy, nothing to switch");
    return;
  }
  CHECK(baseline.first > 0);
  CHECK(baseline.second == 0);
  if (!has_avx2_copy()) return;
  const auto avx2 = run(fusion::CpuIsa::kAvx2);
  CHECK(avx2.second > 0);
  CHECK(avx2.first == 0);
}

TEST_CASE("[step2] the fused kernel allocates nothing: no temporaries, unlike the unfused step") {
  const int64_t n = 1 << 16;
  State s = make_state(torch::randn({n}));
  const torch::Tensor grad = torch::randn({n});
  fusion::adamw_kernel_cpu(s.param, grad, s.exp_avg, s.exp_avg_sq, fusion::AdamWHyper{}, 1);  // warm up threads
  workshop::MemoryMeter meter;
  fusion::adamw_kernel_cpu(s.param, grad, s.exp_avg, s.exp_avg_sq, fusion::AdamWHyper{}, 2);
  CHECK(meter.peak_bytes() == 0);
}

TEST_CASE("[step2] grad_multiplier: each gradient value is multiplied in float32 before the update, never stored") {
  // What step 5's scaler passes (1/scale): the step must be the step on grad x multiplier computed in float32, for
  // every dtype (a 16-bit gradient is not rounded again after the multiply), and the gradient stays as it was.
  const int64_t n = 2 * 32768 + 13;  // pieces and a partial last vector
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (float multiplier : {1.0f / 65536, static_cast<float>(1.0 / 3.0), 4.0f}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(multiplier);
      torch::manual_seed(17);
      const torch::Tensor start = torch::randn({n}).to(dtype);
      const torch::Tensor grad = (torch::randn({n}) * 4096).to(dtype);
      const torch::Tensor grad_before = grad.clone();
      State scaled = make_state(start.clone());
      State plain = make_state(start.to(torch::kFloat));  // the float32 step on the float32 product
      for (int64_t step = 1; step <= 2; ++step) {
        fusion::adamw_kernel_cpu(scaled.param, grad, scaled.exp_avg, scaled.exp_avg_sq, hyper, step, multiplier);
        fusion::adamw_kernel_cpu(plain.param, grad.to(torch::kFloat) * multiplier, plain.exp_avg, plain.exp_avg_sq,
                                 hyper, step);
        if (dtype != torch::kFloat) plain.param = plain.param.to(dtype).to(torch::kFloat);  // rounded each step
      }
      CHECK(torch::equal(scaled.param, plain.param.to(dtype)));
      CHECK(torch::equal(scaled.exp_avg, plain.exp_avg));
      CHECK(torch::equal(scaled.exp_avg_sq, plain.exp_avg_sq));
      CHECK(torch::equal(grad, grad_before));
    }
  }
}

}  // namespace adamw_checks
