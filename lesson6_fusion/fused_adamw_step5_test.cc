// Checks for lesson 6, step 5: the scaler's fused unscale and the scaler inside the AdamW pass.
// Run: bazel test //lesson6_fusion:all   (this step only: bazel test //lesson6_fusion:fused_adamw_step5_test)
// The shared state, oracle and helpers are in fused_adamw_test_helpers.h.
#include "lesson6_fusion/fused_adamw_test_helpers.h"

namespace adamw_checks {

TEST_CASE("[step5] the dispatcher finds workshop::fused_unscale_ with ATen's unscale schema and a CPU kernel") {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(fusion::kUnscaleOpName, "");
  std::ostringstream schema;
  schema << op.schema();
  CAPTURE(schema.str());
  CHECK(schema.str() == "workshop::fused_unscale_(Tensor(a!)[] grads, Tensor(b!) found_inf, Tensor inv_scale) -> ()");
  CHECK(op.hasKernelForDispatchKey(c10::DispatchKey::CPU));
}

TEST_CASE("[step5] finite gradients are multiplied by inv_scale, each rounded once to its dtype; found_inf stays 0") {
  std::vector<torch::Tensor> before = scaled_grads(21);
  // A scale below 1 (inv_scale 16): a float32 1e38 and a float16 60000 overflow when multiplied. The values read
  // were finite, so found_inf stays 0 (ATen tests the value before the multiply).
  before.push_back(torch::full({9}, 1e38f));
  before.push_back(torch::full({13}, 60000.0).to(torch::kHalf));
  for (float inv : {1.0f / 1024, 0.1f, 1.0f, 16.0f}) {
    CAPTURE(inv);
    std::vector<torch::Tensor> grads = clones(before);
    torch::Tensor found_inf = torch::zeros({1});
    fusion::fused_unscale_(grads, found_inf, torch::full({1}, inv));
    CHECK(found_inf.item<float>() == 0.0f);
    for (size_t i = 0; i < grads.size(); ++i) {
      CAPTURE(i);
      REQUIRE(grads[i].dtype() == before[i].dtype());
      // float32 arithmetic on the value as read, rounded to the gradient's dtype: as ATen's kernel does it.
      CHECK(torch::equal(grads[i], (before[i].to(torch::kFloat) * inv).to(before[i].scalar_type())));
    }
  }
}

TEST_CASE("[step5] every finite 16-bit value, unscaled, is rounded as Tensor::to rounds it: ties, subnormals, inf") {
  // All 65536 bit patterns of the dtype but inf and NaN, read, multiplied in float32 and rounded back. inv_scale
  // 1 + 2^-8 (1 + 2^-11) puts many products exactly halfway between two bfloat16 (float16) values: ties go to the
  // even one. 2^-10 makes subnormal results, 4 overflows the largest values to inf, 1/3 rounds everything else.
  for (torch::ScalarType dtype : {torch::kBFloat16, torch::kHalf}) {
    const torch::Tensor every = torch::arange(-32768, 32768, torch::kInt32).to(torch::kInt16).view(dtype);
    const torch::Tensor finite = every.masked_select(torch::isfinite(every));
    for (float inv :
         {1.0f + std::ldexp(1.0f, -8), 1.0f + std::ldexp(1.0f, -11), std::ldexp(1.0f, -10), 4.0f, 1.0f / 3}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(inv);
      std::vector<torch::Tensor> grads = {finite.clone()};
      torch::Tensor found_inf = torch::zeros({1});
      fusion::fused_unscale_(grads, found_inf, torch::full({1}, inv));
      CHECK(found_inf.item<float>() == 0.0f);
      const torch::Tensor want = (finite.to(torch::kFloat) * inv).to(dtype);
      const int64_t differing = grads[0].view(torch::kInt16).ne(want.view(torch::kInt16)).sum().item<int64_t>();
      CHECK(differing == 0);
    }
  }
}

TEST_CASE("[step5] an inf or a NaN anywhere sets found_inf to 1, and every value is still unscaled") {
  const std::vector<torch::Tensor> before = scaled_grads(22);
  // (gradient, element): the first element of all, the last of a piece-crossing tensor, a 16-bit tail, the last.
  const std::vector<std::pair<size_t, int64_t>> places = {{0, 0}, {3, 100002}, {3, 32768 * 2 + 5}, {4, 32}, {5, 4999},
                                                          {6, 0}, {2, 6}};
  for (const auto& [t, k] : places) {
    for (float bad : {INFINITY, -INFINITY, NAN}) {
      for (float inv : {0.5f, 1.0f}) {  // at a scale of 1 nothing is multiplied, but the check still runs
        CAPTURE(t);
        CAPTURE(k);
        CAPTURE(bad);
        CAPTURE(inv);
        std::vector<torch::Tensor> grads = clones(before);
        grads[t][k] = bad;
        std::vector<torch::Tensor> expected = clones(grads);
        torch::Tensor found_inf = torch::zeros({1});
        fusion::fused_unscale_(grads, found_inf, torch::full({1}, inv));
        CHECK(found_inf.item<float>() == 1.0f);
        for (size_t i = 0; i < grads.size(); ++i) {  // every element, those after the bad one included
          const torch::Tensor want = (expected[i].to(torch::kFloat) * inv).to(expected[i].scalar_type());
          CHECK(torch::equal(grads[i].nan_to_num(0, 1, -1), want.nan_to_num(0, 1, -1)));
        }
      }
    }
  }
}

TEST_CASE("[step5] found_inf is only ever set: a 1 stays 1 over finite gradients, an empty list changes nothing") {
  std::vector<torch::Tensor> grads = scaled_grads(23);
  torch::Tensor found_inf = torch::ones({1});
  fusion::fused_unscale_(grads, found_inf, torch::full({1}, 0.25f));
  CHECK(found_inf.item<float>() == 1.0f);
  std::vector<torch::Tensor> empty = {torch::empty({0}), torch::empty({3, 0})};
  found_inf.zero_();
  CHECK_NOTHROW(fusion::fused_unscale_(empty, found_inf, torch::full({1}, 0.25f)));
  CHECK(found_inf.item<float>() == 0.0f);
}

TEST_CASE("[step5] bad inputs give their named errors, and nothing is written") {
  std::vector<torch::Tensor> grads = scaled_grads(24);
  const std::vector<torch::Tensor> before = clones(grads);
  torch::Tensor found_inf = torch::zeros({1});
  const torch::Tensor inv = torch::full({1}, 0.5f);
  auto refused = [&](std::vector<torch::Tensor> g, torch::Tensor f, torch::Tensor i, const char* message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(fusion::fused_unscale_(g, f, i), Contains(message), c10::Error);
  };
  refused(grads, torch::zeros({2}), inv, "fused_unscale_: found_inf must be a defined one-element float32 tensor");
  refused(grads, torch::zeros({1}, torch::kDouble), inv, "found_inf must be a defined one-element float32 tensor");
  refused(grads, found_inf, torch::full({1}, 0.5, torch::kDouble), "inv_scale must be a defined one-element float32");
  refused(grads, found_inf, torch::full({2}, 0.5f), "inv_scale must be a defined one-element float32 tensor");
  {
    std::vector<torch::Tensor> g = clones(before);
    g[3] = torch::ones({4}, torch::kInt);
    refused(g, found_inf, inv, "grad 3 must be float32, bfloat16 or float16");
    g[3] = torch::randn({8}).slice(0, 0, 8, 2);
    refused(g, found_inf, inv, "fused_unscale_: grad 3 is not contiguous");
    g[3] = torch::Tensor();
    refused(g, found_inf, inv, "fused_unscale_: grad 3 is undefined");
  }
  {
    std::vector<torch::Tensor> g = clones(before);
    const torch::Tensor shared = torch::randn({100});
    g[0] = shared.slice(0, 0, 60);
    g[6] = shared.slice(0, 59, 60);  // the last element of grads[0]
    refused(g, found_inf, inv, "grads[6] and grads[0] overlap in memory");
    g[6] = torch::randn({1});
    g[4] = g[3].slice(0, 1000, 1033).to(torch::kHalf);  // a copy: no overlap
    g[5] = g[3].slice(0, 500, 600);                     // a view inside grads[3]
    refused(g, found_inf, inv, "grads[5] and grads[3] overlap in memory");
  }
  // Another device: the kernel's own check (through the dispatcher a meta tensor would select no CPU kernel).
  CHECK_THROWS_WITH_AS(fusion::check_unscale_args({torch::empty({4}, torch::Device(torch::kMeta))}, found_inf, inv),
                       Contains("is not on found_inf's device"), c10::Error);
  CHECK_THROWS_WITH_AS(fusion::check_unscale_args(grads, torch::zeros({1}, torch::Device(torch::kMeta)), inv),
                       Contains("found_inf and inv_scale must be on one device"), c10::Error);
  for (size_t i = 0; i < grads.size(); ++i) CHECK(torch::equal(grads[i], before[i]));  // nothing written
  CHECK(found_inf.item<float>() == 0.0f);
}

TEST_CASE("[step5] the unscale bumps the versions of the gradients and of found_inf; a counted step, state_step's") {
  std::vector<torch::Tensor> grads = scaled_grads(26);
  torch::Tensor found_inf = torch::zeros({1});
  const torch::Tensor inv_scale = torch::full({1}, 0.5f);
  std::vector<int64_t> before;
  for (const torch::Tensor& g : grads) before.push_back(g._version());
  const int64_t found_before = found_inf._version(), inv_before = inv_scale._version();
  fusion::fused_unscale_(grads, found_inf, inv_scale);
  for (size_t i = 0; i < grads.size(); ++i) CHECK(grads[i]._version() > before[i]);
  CHECK(found_inf._version() > found_before);
  CHECK(inv_scale._version() == inv_before);  // only read
  State s = make_state(torch::randn({10}));
  torch::Tensor count = torch::zeros({1}), scale = torch::ones({1});
  const int64_t count_before = count._version(), scale_before = scale._version();
  fusion::fused_adamw_(s.param, torch::randn({10}), s.exp_avg, s.exp_avg_sq, fusion::AdamWHyper{}, 0, scale,
                       torch::zeros({1}), count);
  CHECK(count._version() > count_before);
  CHECK(scale._version() == scale_before);
}

TEST_CASE("[step5] lesson 1's GradScaler takes its fused path through workshop::fused_unscale_") {
  REQUIRE(amp::fused_unscale_kernel(c10::DeviceType::CPU) == fusion::kUnscaleOpName);
  // The same training steps with the fused path and with lesson 1's plain tensor ops: the same parameters, the
  // same skip on an inf, the same scales.
  std::vector<double> scales[2];
  std::vector<torch::Tensor> params[2];
  std::vector<bool> stepped[2];
  const amp::KernelPath paths[2] = {amp::KernelPath::kFused, amp::KernelPath::kPlain};
  for (int p = 0; p < 2; ++p) {
    torch::manual_seed(5);
    torch::Tensor w = torch::randn({50000}).requires_grad_(true), b = torch::randn({3}).requires_grad_(true);
    torch::optim::SGD sgd({w, b}, 0.1);
    amp::GradScalerOptions options;
    options.init_scale = 1024;
    options.growth_interval = 2;
    options.kernels = paths[p];
    amp::GradScaler scaler(options);
    for (int it = 0; it < 5; ++it) {
      sgd.zero_grad();
      torch::Tensor loss = (w * w).sum() * 1e-3 + b.sum();
      if (it == 2) loss = loss * std::numeric_limits<float>::infinity();  // an overflow: inf gradients
      scaler.scale(loss).backward();
      stepped[p].push_back(scaler.step(sgd));
      scaler.update();
      scales[p].push_back(scaler.get_scale());
    }
    params[p] = {w.detach(), b.detach()};
  }
  CHECK(stepped[0] == std::vector<bool>{true, true, false, true, true});
  CHECK(stepped[0] == stepped[1]);
  CHECK(scales[0] == scales[1]);
  CHECK(scales[0] == std::vector<double>{1024, 2048, 1024, 1024, 2048});
  CHECK(torch::equal(params[0][0], params[1][0]));
  CHECK(torch::equal(params[0][1], params[1][1]));
}

TEST_CASE("[step5] on 4 ATen threads the unscale is one parallel region, with the one-thread bits and flag") {
  std::vector<torch::Tensor> before = scaled_grads(24);
  // Large 16-bit gradients: each thread's share takes long enough that the threads really overlap in time.
  before.push_back((torch::randn({(1 << 22) + 5}) * 1024).to(torch::kBFloat16));
  before.push_back((torch::randn({1 << 21}) * 1024).to(torch::kHalf));
  for (bool with_inf : {false, true, false}) {
    CAPTURE(with_inf);
    std::vector<torch::Tensor> one = clones(before), four = clones(before);
    if (with_inf) {
      one[7][3000000] = INFINITY;
      four[7][3000000] = INFINITY;
    }
    torch::Tensor found_one = torch::zeros({1}), found_four = torch::zeros({1});
    {
      const ThreadsFor threads(1);
      fusion::fused_unscale_(one, found_one, torch::full({1}, 0.25f));
    }
    const ThreadsFor threads(4);
    const int regions = parallel_regions([&] { fusion::fused_unscale_(four, found_four, torch::full({1}, 0.25f)); });
    CHECK(found_four.item<float>() == (with_inf ? 1.0f : 0.0f));
    CHECK(found_four.item<float>() == found_one.item<float>());
    for (size_t i = 0; i < one.size(); ++i)
      CHECK(torch::equal(four[i].nan_to_num(0, 1, -1), one[i].nan_to_num(0, 1, -1)));
    if (regions_are_counted()) {
      CHECK(regions == 1);
    } else {
      MESSAGE("parallel regions are not counted here (no OpenMP in this LibTorch)");
    }
  }
}

TEST_CASE("[step5] lesson 1's GradScaler, auto and fused, unscales float64 gradients that the operator refuses") {
  REQUIRE(amp::fused_unscale_kernel(c10::DeviceType::CPU) == fusion::kUnscaleOpName);
  // The operator takes float32, bfloat16 and float16 only; ATen's unscale also takes float64, so the scaler falls
  // back to another kernel for it instead of throwing.
  std::vector<torch::Tensor> params[3];
  std::vector<bool> stepped[3];
  const amp::KernelPath paths[3] = {amp::KernelPath::kAuto, amp::KernelPath::kFused, amp::KernelPath::kPlain};
  for (int p = 0; p < 3; ++p) {
    CAPTURE(p);
    torch::manual_seed(6);
    torch::Tensor w = torch::randn({5000}, torch::kDouble).requires_grad_(true);
    torch::Tensor b = torch::randn({3}).requires_grad_(true);  // float32 beside it: a list of two dtypes
    torch::optim::SGD sgd({w, b}, 0.1);
    amp::GradScalerOptions options;
    options.init_scale = 256;
    options.kernels = paths[p];
    amp::GradScaler scaler(options);
    for (int it = 0; it < 3; ++it) {
      sgd.zero_grad();
      torch::Tensor loss = (w * w).sum() * 1e-3 + b.sum();
      if (it == 1) loss = loss * std::numeric_limits<double>::infinity();
      scaler.scale(loss).backward();
      stepped[p].push_back(scaler.step(sgd));
      scaler.update();
    }
    params[p] = {w.detach(), b.detach()};
  }
  CHECK(stepped[0] == std::vector<bool>{true, false, true});
  for (int p = 0; p < 2; ++p) {
    CHECK(stepped[p] == stepped[2]);
    CHECK(torch::equal(params[p][0], params[2][0]));
    CHECK(torch::equal(params[p][1], params[2][1]));
  }
}

TEST_CASE("[step5] nothing past a gradient's end is read or written: every tail and dtype against walls") {
  // Every gradient ends at an inaccessible page (guarded_copy). A 16-bit tail read whole would also see
  // whatever lies past the end, and could set found_inf from it.
  std::vector<torch::Tensor> plain;
  torch::manual_seed(15);
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t n : tail_sizes()) plain.push_back((torch::randn({n}) * 1024).to(dtype));
  }
  for (float inv : {0.5f, 1.0f}) {
    CAPTURE(inv);
    std::vector<torch::Tensor> walled;
    for (const torch::Tensor& g : plain) walled.push_back(guarded_copy(g));
    torch::Tensor found_inf = torch::zeros({1});
    fusion::fused_unscale_(walled, found_inf, torch::full({1}, inv));
    CHECK(found_inf.item<float>() == 0.0f);
    for (size_t i = 0; i < plain.size(); ++i) {
      CAPTURE(i);
      CHECK(torch::equal(walled[i], (plain[i].to(torch::kFloat) * inv).to(plain[i].scalar_type())));
    }
  }
}

TEST_CASE("[step5] one pass with grad_scale is GradScaler's unscale and then the step, bit for bit (float32)") {
  // 65536: a power of two, 3: a scale whose inverse rounds, 0.5: a scale below 1.
  const int64_t n = 40003;
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (float scale : {65536.0f, 3.0f, 0.5f}) {
    for (bool with_flag : {false, true}) {  // found_inf given and 0 changes nothing
      CAPTURE(scale);
      CAPTURE(with_flag);
      torch::manual_seed(19);
      State one_pass = make_state(torch::randn({n}));
      State two_passes = copy_of(one_pass);
      for (int64_t step = 1; step <= 3; ++step) {
        const torch::Tensor grad = torch::randn({n}) * scale;
        const torch::Tensor grad_before = grad.clone();
        fusion::fused_adamw_(one_pass.param, grad, one_pass.exp_avg, one_pass.exp_avg_sq, hyper, step,
                             scaler_with(scale, with_flag ? 0.0f : NAN).grad_scale,
                             scaler_with(scale, with_flag ? 0.0f : NAN).found_inf);
        CHECK(torch::equal(grad, grad_before));  // read, never written
        std::vector<torch::Tensor> unscaled = {grad.clone()};
        torch::Tensor found_inf = torch::zeros({1});
        fusion::fused_unscale_(unscaled, found_inf, torch::full({1}, inverse_of(scale)));
        REQUIRE(found_inf.item<float>() == 0.0f);
        fusion::fused_adamw_(two_passes.param, unscaled[0], two_passes.exp_avg, two_passes.exp_avg_sq, hyper, step);
        CHECK(same_state(one_pass, two_passes));
      }
    }
  }
}

TEST_CASE("[step5] 16-bit parameters: the float32 step on the float32 unscaled gradient, rounded once") {
  const int64_t n = 32768 + 7;
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (torch::ScalarType dtype : {torch::kBFloat16, torch::kHalf}) {
    CAPTURE(dtype_name(dtype));
    torch::manual_seed(23);
    const torch::Tensor start = torch::randn({n}).to(dtype);
    const torch::Tensor grad = (torch::randn({n}) * 1024).to(dtype);
    State scaled = make_state(start.clone());
    fusion::fused_adamw_(scaled.param, grad, scaled.exp_avg, scaled.exp_avg_sq, hyper, 1, torch::full({1}, 1024.0f),
                         torch::zeros({1}));
    State master = make_state(start.to(torch::kFloat));
    fusion::fused_adamw_(master.param, grad.to(torch::kFloat) * inverse_of(1024.0f), master.exp_avg, master.exp_avg_sq,
                         hyper, 1);
    CHECK(torch::equal(scaled.param, master.param.to(dtype)));
    CHECK(torch::equal(scaled.exp_avg, master.exp_avg));
    CHECK(torch::equal(scaled.exp_avg_sq, master.exp_avg_sq));
  }
}

TEST_CASE("[step5] a found_inf that is not 0 skips the step: nothing written, in one tensor and in a list") {
  // 1 as a scaler sets it, 2 as a flag summed over two ranks, NaN; with and without grad_scale; a skipped step does
  // not look at the scale (0 here would otherwise be refused).
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (float flag : {1.0f, 2.0f, NAN}) {
    for (float scale : {1024.0f, NAN, 0.0f}) {
      CAPTURE(flag);
      CAPTURE(scale);
      Scaler scaler = scaler_with(scale, 0.0f);
      scaler.found_inf = torch::full({1}, flag);
      torch::manual_seed(29);
      State s = make_state(torch::randn({1000}));
      s.exp_avg.normal_();
      s.exp_avg_sq.uniform_();
      const State before = copy_of(s);
      const torch::Tensor grad = torch::randn({1000});
      fusion::fused_adamw_(s.param, grad, s.exp_avg, s.exp_avg_sq, hyper, 2, scaler.grad_scale, scaler.found_inf);
      CHECK(same_state(s, before));
      std::vector<torch::Tensor> params = {s.param, torch::randn({33}).to(torch::kBFloat16)};
      const std::vector<torch::Tensor> params_before = clones(params);
      fusion::fused_adamw_multi_(params, {grad, torch::randn({33}).to(torch::kBFloat16)},
                                 {s.exp_avg, torch::zeros({33})}, {s.exp_avg_sq, torch::zeros({33})}, hyper, 2,
                                 scaler.grad_scale, scaler.found_inf);
      for (size_t i = 0; i < params.size(); ++i) CHECK(torch::equal(params[i], params_before[i]));
      CHECK(same_state(s, before));
    }
  }
}

TEST_CASE("[step5] a skipped step does not count: state_step, no host read of found_inf, the unscaled steps") {
  // A caller that never reads found_inf (the point of passing it to the step) cannot know the step's number: the
  // operators count the steps taken in state_step, and a skipped one does not count (as ATen's optimizer keeps its
  // state_steps on the device). Against the same operators on the unscaled gradients of the steps taken only.
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  const std::vector<float> flags = {0, 1, 0, 1, 1, 0, 0, 2, 0};
  const float scale = 1024.0f;
  torch::manual_seed(33);
  State scaled = make_state(torch::randn({5001}));
  State reference = copy_of(scaled);
  std::vector<torch::Tensor> multi_params = {scaled.param.clone(), torch::randn({7}).to(torch::kBFloat16)};
  std::vector<torch::Tensor> multi_m = {torch::zeros({5001}), torch::zeros({7})}, multi_v = clones(multi_m);
  std::vector<torch::Tensor> ref_params = clones(multi_params), ref_m = clones(multi_m), ref_v = clones(multi_v);
  torch::Tensor state_step = torch::zeros({1}), multi_state_step = torch::zeros({1});
  int64_t taken = 0;
  for (float flag : flags) {
    CAPTURE(taken);
    CAPTURE(flag);
    const torch::Tensor grad = torch::randn({5001}) * scale;
    const torch::Tensor grad16 = (torch::randn({7}) * scale).to(torch::kBFloat16);
    fusion::fused_adamw_(scaled.param, grad, scaled.exp_avg, scaled.exp_avg_sq, hyper, 0, torch::full({1}, scale),
                         torch::full({1}, flag), state_step);
    fusion::fused_adamw_multi_(multi_params, {grad, grad16}, multi_m, multi_v, hyper, 0, torch::full({1}, scale),
                               torch::full({1}, flag), multi_state_step);
    if (flag == 0) {  // the reference steps only when nothing overflowed, on the unscaled gradient
      ++taken;
      const torch::Tensor unscaled = grad * inverse_of(scale);
      const torch::Tensor unscaled16 = (grad16.to(torch::kFloat) * inverse_of(scale)).to(torch::kBFloat16);  // exact
      fusion::fused_adamw_(reference.param, unscaled, reference.exp_avg, reference.exp_avg_sq, hyper, taken);
      fusion::fused_adamw_multi_(ref_params, {unscaled, unscaled16}, ref_m, ref_v, hyper, taken);
    }
    CHECK(state_step.item<float>() == static_cast<float>(taken));
    CHECK(multi_state_step.item<float>() == static_cast<float>(taken));
    CHECK(same_state(scaled, reference));
    for (size_t i = 0; i < multi_params.size(); ++i) {
      CHECK(torch::equal(multi_params[i], ref_params[i]));
      CHECK(torch::equal(multi_m[i], ref_m[i]));
      CHECK(torch::equal(multi_v[i], ref_v[i]));
    }
  }
  // Without grad_scale and found_inf, state_step alone counts every step: the host-counted operator's bits.
  State alone = make_state(torch::randn({100})), host = copy_of(alone);
  torch::Tensor count = torch::full({1}, 41.0f);  // resumed: 41 steps taken before
  for (int64_t step = 42; step <= 44; ++step) {
    const torch::Tensor grad = torch::randn({100});
    fusion::fused_adamw_(alone.param, grad, alone.exp_avg, alone.exp_avg_sq, hyper, 0, c10::nullopt, c10::nullopt,
                         count);
    fusion::fused_adamw_(host.param, grad, host.exp_avg, host.exp_avg_sq, hyper, step);
    CHECK(same_state(alone, host));
  }
  CHECK(count.item<float>() == 44.0f);
}

TEST_CASE("[step5] state_step's rules: a one-element float32 tensor beside the parameters, a whole count, step 0") {
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  struct Bad {
    std::string what;
    torch::Tensor state_step;
    int64_t step;
    std::string message;  // after the operator's name
  };
  const std::vector<Bad> cases = {
      {"two elements", torch::zeros({2}), 0, "state_step must be a one-element float32 tensor, got 2"},
      {"int64", torch::zeros({1}, torch::kLong), 0, "state_step must be a one-element float32 tensor"},
      {"a host step beside it", torch::zeros({1}), 3, "step must be 0 when state_step is given, got 3"},
      {"a negative host step beside it", torch::zeros({1}), -1, "step must be 0 when state_step is given, got -1"},
      {"a fraction", torch::full({1}, 2.5f), 0, "state_step must hold a whole number in [0, 2^24), got 2.5"},
      {"below 0", torch::full({1}, -1.0f), 0, "state_step must hold a whole number in [0, 2^24), got -1"},
      {"NaN", torch::full({1}, NAN), 0, "state_step must hold a whole number"},
      {"2^24: one more would not count", torch::full({1}, 16777216.0f), 0, "state_step must hold a whole number"},
  };
  for (const Bad& bad : cases) {
    CAPTURE(bad.what);
    torch::manual_seed(38);
    State s = make_state(torch::randn({100}));
    const State before = copy_of(s);
    const torch::Tensor grad = torch::randn({100});
    const torch::Tensor count_before = bad.state_step.clone();
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_(s.param, grad, s.exp_avg, s.exp_avg_sq, hyper, bad.step, c10::nullopt,
                                              c10::nullopt, bad.state_step),
                         Contains(("fused_adamw_: " + bad.message).c_str()), c10::Error);
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_({s.param}, {grad}, {s.exp_avg}, {s.exp_avg_sq}, hyper, bad.step,
                                                    c10::nullopt, c10::nullopt, bad.state_step),
                         Contains(("fused_adamw_multi_: " + bad.message).c_str()), c10::Error);
    CHECK(same_state(s, before));
    CHECK(torch::equal(bad.state_step.nan_to_num(7), count_before.nan_to_num(7)));  // not advanced
  }
  // The largest count that can still advance exactly, and a skipped step that does not look at the count.
  State s = make_state(torch::randn({10}));
  torch::Tensor last = torch::full({1}, 16777215.0f);
  fusion::fused_adamw_(s.param, torch::randn({10}), s.exp_avg, s.exp_avg_sq, hyper, 0, c10::nullopt, c10::nullopt,
                       last);
  CHECK(last.item<float>() == 16777216.0f);
  torch::Tensor fraction = torch::full({1}, 2.5f);
  CHECK_NOTHROW(fusion::fused_adamw_(s.param, torch::randn({10}), s.exp_avg, s.exp_avg_sq, hyper, 0, c10::nullopt,
                                     torch::ones({1}), fraction));
  CHECK(fraction.item<float>() == 2.5f);
  // On another device than the parameters (the CPU kernel called directly: the dispatcher would look for a meta one).
  const torch::Tensor meta = torch::empty({1}, torch::TensorOptions().device(torch::kMeta));
  CHECK_THROWS_WITH_AS(fusion::check_scaler_args("fused_adamw_", torch::Device(torch::kCPU), 0, c10::nullopt,
                                                 c10::nullopt, meta),
                       Contains("state_step is not on param's device (cpu), got meta"), c10::Error);
}

TEST_CASE("[step5] an empty list gets the scaler's checks too, and its state_step counts the call") {
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  const std::vector<torch::Tensor> none;
  CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(none, none, none, none, hyper, 1, torch::ones({2}), c10::nullopt),
                       Contains("grad_scale must be a one-element float32 tensor"), c10::Error);
  CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(none, none, none, none, hyper, 1, torch::zeros({1}),
                                                  torch::zeros({1})),
                       Contains("grad_scale must be finite and > 0, got 0"), c10::Error);
  CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(none, none, none, none, hyper, 1, c10::nullopt, torch::zeros({3})),
                       Contains("found_inf must be a one-element float32 tensor"), c10::Error);
  torch::Tensor count = torch::zeros({1});
  fusion::fused_adamw_multi_(none, none, none, none, hyper, 0, torch::ones({1}), torch::zeros({1}), count);
  CHECK(count.item<float>() == 1.0f);
  fusion::fused_adamw_multi_(none, none, none, none, hyper, 0, torch::ones({1}), torch::ones({1}), count);
  CHECK(count.item<float>() == 1.0f);  // skipped
}

TEST_CASE("[step5] the multi-tensor operator with grad_scale gives each tuple what the single operator gives it") {
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  const std::vector<std::pair<int64_t, torch::ScalarType>> shapes = {
      {40000, torch::kFloat}, {7, torch::kBFloat16}, {0, torch::kFloat}, {33, torch::kHalf}, {5001, torch::kFloat}};
  torch::manual_seed(31);
  std::vector<State> multi, single;
  std::vector<torch::Tensor> grads;
  for (const auto& [numel, dtype] : shapes) {
    multi.push_back(make_state(torch::randn({numel}).to(dtype)));
    single.push_back(copy_of(multi.back()));
    grads.push_back((torch::randn({numel}) * 3).to(dtype));
  }
  std::vector<torch::Tensor> params, exp_avgs, exp_avg_sqs;
  for (State& s : multi) {
    params.push_back(s.param);
    exp_avgs.push_back(s.exp_avg);
    exp_avg_sqs.push_back(s.exp_avg_sq);
  }
  fusion::fused_adamw_multi_(params, grads, exp_avgs, exp_avg_sqs, hyper, 1, torch::full({1}, 3.0f), torch::zeros({1}));
  for (size_t i = 0; i < shapes.size(); ++i) {
    CAPTURE(i);
    fusion::fused_adamw_(single[i].param, grads[i], single[i].exp_avg, single[i].exp_avg_sq, hyper, 1,
                         torch::full({1}, 3.0f), torch::zeros({1}));
    CHECK(same_state(multi[i], single[i]));
  }
}

TEST_CASE("[step5] bad scaler tensors give their named errors, and nothing is written") {
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  struct Bad {
    std::string what;
    Scaler scaler;
    std::string message;  // after the operator's name
  };
  std::vector<Bad> cases = {
      {"two-element grad_scale", {torch::ones({2}), {}}, "grad_scale must be a one-element float32 tensor, got 2"},
      {"float64 grad_scale", {torch::ones({1}, torch::kDouble), {}}, "grad_scale must be a one-element float32 tensor"},
      {"int found_inf", {{}, torch::zeros({1}, torch::kInt)}, "found_inf must be a one-element float32 tensor"},
      {"empty found_inf", {{}, torch::zeros({0})}, "found_inf must be a one-element float32 tensor, got 0"},
      {"grad_scale first", {torch::ones({3}), torch::zeros({0})}, "grad_scale must be"},
      {"zero scale", {torch::zeros({1}), torch::zeros({1})}, "grad_scale must be finite and > 0, got 0"},
      {"negative scale", {torch::full({1}, -2.0f), {}}, "grad_scale must be finite and > 0, got -2"},
      {"infinite scale", {torch::full({1}, INFINITY), {}}, "grad_scale must be finite and > 0, got inf"},
      {"NaN scale", {torch::full({1}, NAN), {}}, "grad_scale must be finite and > 0, got nan"},
      // Positive and finite, but 1 / 1e-40 overflows float32: every updated value would be inf or NaN.
      {"subnormal scale", {torch::full({1}, 1e-40f), {}}, "grad_scale's inverse must be finite"},
      {"the smallest subnormal",
       {torch::full({1}, std::numeric_limits<float>::denorm_min()), {}},
       "grad_scale's inverse must be finite"},
  };
  for (const Bad& bad : cases) {
    CAPTURE(bad.what);
    torch::manual_seed(37);
    State s = make_state(torch::randn({100}));
    const State before = copy_of(s);
    const torch::Tensor grad = torch::randn({100});
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_(s.param, grad, s.exp_avg, s.exp_avg_sq, hyper, 1, bad.scaler.grad_scale,
                                              bad.scaler.found_inf),
                         Contains(("fused_adamw_: " + bad.message).c_str()), c10::Error);
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_({s.param}, {grad}, {s.exp_avg}, {s.exp_avg_sq}, hyper, 1,
                                                    bad.scaler.grad_scale, bad.scaler.found_inf),
                         Contains(("fused_adamw_multi_: " + bad.message).c_str()), c10::Error);
    CHECK(same_state(s, before));
  }
  SUBCASE("a scaler tensor on another device than the parameter") {
    // Called as the CPU kernel directly: the dispatcher would pick the meta kernel for a meta tensor.
    State s = make_state(torch::randn({10}));
    const State before = copy_of(s);
    const torch::Tensor meta = torch::empty({1}, torch::TensorOptions().device(torch::kMeta));
    for (int which : {0, 1}) {
      CAPTURE(which);
      const c10::optional<at::Tensor> given = meta, none;
      const std::string name = which == 0 ? "grad_scale" : "found_inf";
      CHECK_THROWS_WITH_AS(fusion::fused_adamw_cpu(s.param, torch::randn({10}), s.exp_avg, s.exp_avg_sq, 1e-2, 0.9,
                                                   0.999, 1e-8, 0.1, 1, which == 0 ? given : none,
                                                   which == 1 ? given : none, none),
                           Contains(("fused_adamw_: " + name + " is not on param's device (cpu), got meta").c_str()),
                           c10::Error);
      CHECK_THROWS_WITH_AS(fusion::check_scaler_args("fused_adamw_multi_", s.param.device(), 1,
                                                     which == 0 ? given : none, which == 1 ? given : none, none),
                           Contains(("fused_adamw_multi_: " + name + " is not on param's device").c_str()), c10::Error);
    }
    CHECK(same_state(s, before));
  }
}

}  // namespace adamw_checks
