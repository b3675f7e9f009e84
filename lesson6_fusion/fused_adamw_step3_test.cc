// Checks for lesson 6, step 3: the operator workshop::fused_adamw_.
// Run: bazel test //lesson6_fusion:all   (this step only: bazel test //lesson6_fusion:fused_adamw_step3_test)
// The shared state, oracle and helpers are in fused_adamw_test_helpers.h.
#include "lesson6_fusion/fused_adamw_test_helpers.h"

namespace adamw_checks {

TEST_CASE("[step3] the dispatcher finds workshop::fused_adamw_ by name, with its schema and a CPU kernel") {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(fusion::kOpName, "");
  std::ostringstream schema;
  schema << op.schema();
  CAPTURE(schema.str());
  CHECK(schema.str().find("workshop::fused_adamw_(Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg") == 0);
  CHECK(op.hasKernelForDispatchKey(c10::DispatchKey::CPU));
}

TEST_CASE("[step3] called through the dispatcher the operator gives the kernel's results") {
  const int64_t n = 5003;
  torch::manual_seed(9);
  const torch::Tensor start = torch::randn({n});
  State fused = make_state(start.clone()), plain = make_state(start.clone());
  const Worst worst = run_side_by_side(fused, plain, hyper_with(1e-2, 0.1), gradients(n, 10, 1.0), true);
  CHECK(worst.param <= kFloatTolerance);
  CHECK(worst.exp_avg <= kFloatTolerance);
  CHECK(worst.exp_avg_sq <= kFloatTolerance);
  // And a parameter that requires grad, as an optimizer holds it, is updated in place (no autograd error).
  torch::Tensor leaf = start.clone().requires_grad_(true);
  State s = make_state(leaf);
  fusion::fused_adamw_(s.param, torch::ones({n}), s.exp_avg, s.exp_avg_sq, fusion::AdamWHyper{}, 1);
  CHECK(leaf.detach().ne(start).all().item<bool>());
}

TEST_CASE(
    "[step3] the operator bumps the versions of what it writes: a graph that saved the parameter refuses backward") {
  // As torch's in-place ops (and torch::optim::AdamW's step, made of them) do: the graph below saved w for mul's
  // backward, so running it after the step would use the updated values where the forward pass used the old ones.
  torch::manual_seed(10);
  torch::Tensor w = torch::randn({100}).requires_grad_(true);
  const torch::Tensor loss = (w * w).sum();
  State s = make_state(w);
  const torch::Tensor grad = torch::randn({100});
  const int64_t before[] = {w._version(), s.exp_avg._version(), s.exp_avg_sq._version(), grad._version()};
  fusion::fused_adamw_(s.param, grad, s.exp_avg, s.exp_avg_sq, fusion::AdamWHyper{}, 1);
  CHECK(w._version() > before[0]);
  CHECK(s.exp_avg._version() > before[1]);
  CHECK(s.exp_avg_sq._version() > before[2]);
  CHECK(grad._version() == before[3]);  // only read
  CHECK_THROWS_WITH_AS(loss.backward(), Contains("modified by an inplace operation"), c10::Error);
  // torch::optim::AdamW refuses the same graph the same way.
  torch::Tensor w2 = w.detach().clone().requires_grad_(true);
  const torch::Tensor loss2 = (w2 * w2).sum();
  torch::optim::AdamW optimizer({w2}, fusion::adamw_options(fusion::AdamWHyper{}));
  w2.mutable_grad() = grad.clone();
  optimizer.step();
  CHECK_THROWS_WITH_AS(loss2.backward(), Contains("modified by an inplace operation"), c10::Error);
  // A refused call wrote nothing, and bumps nothing.
  const int64_t after = w._version();
  CHECK_THROWS(fusion::fused_adamw_(s.param, grad, s.exp_avg, s.exp_avg_sq, fusion::AdamWHyper{}, 0));
  CHECK(w._version() == after);
}

TEST_CASE("[step3] empty tensors are accepted and nothing happens") {
  State s = make_state(torch::empty({0}));
  fusion::fused_adamw_(s.param, torch::empty({0}), s.exp_avg, s.exp_avg_sq, fusion::AdamWHyper{}, 1);
  CHECK(s.param.numel() == 0);
  State s2 = make_state(torch::empty({3, 0}, torch::kBFloat16));
  fusion::fused_adamw_(s2.param, torch::empty({3, 0}, torch::kBFloat16), s2.exp_avg, s2.exp_avg_sq,
                       fusion::AdamWHyper{}, 7);
  CHECK(s2.param.numel() == 0);
}

TEST_CASE("[step3] non-contiguous inputs are refused, naming the tensor") {
  const torch::Tensor base = torch::randn({64, 64});
  State s = make_state(torch::randn({64, 64}));
  const torch::Tensor grad = torch::randn({64, 64});
  const fusion::AdamWHyper h;
  SUBCASE("param") {
    torch::Tensor p = base.t();
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_(p, grad, s.exp_avg, s.exp_avg_sq, h, 1),
                         Contains("param is not contiguous"), c10::Error);
  }
  SUBCASE("grad") {
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_(s.param, base.t(), s.exp_avg, s.exp_avg_sq, h, 1),
                         Contains("grad is not contiguous"), c10::Error);
  }
  SUBCASE("exp_avg") {
    torch::Tensor m = torch::zeros({64, 128}).slice(1, 0, 128, 2);
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_(s.param, grad, m, s.exp_avg_sq, h, 1),
                         Contains("exp_avg is not contiguous"), c10::Error);
  }
  SUBCASE("exp_avg_sq") {
    torch::Tensor v = torch::zeros({64, 64}).t();
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_(s.param, grad, s.exp_avg, v, h, 1),
                         Contains("exp_avg_sq is not contiguous"), c10::Error);
  }
  CHECK(torch::equal(s.exp_avg, torch::zeros({64, 64})));  // refused before anything was written
}

TEST_CASE("[step3] each bad input gives its named error") {
  const int64_t n = 16;
  State s = make_state(torch::randn({n}));
  const torch::Tensor grad = torch::randn({n});
  const fusion::AdamWHyper good;
  auto call = [&](torch::Tensor p, torch::Tensor g, torch::Tensor m, torch::Tensor v, fusion::AdamWHyper h,
                  int64_t step) { fusion::fused_adamw_(p, g, m, v, h, step); };
  auto with = [&](void (*change)(fusion::AdamWHyper&)) {
    fusion::AdamWHyper h = good;
    change(h);
    return h;
  };
  SUBCASE("undefined") {
    CHECK_THROWS_WITH_AS(fusion::check_adamw_args(s.param, torch::Tensor(), s.exp_avg, s.exp_avg_sq, good, 1),
                         Contains("grad is undefined"), c10::Error);
  }
  SUBCASE("shapes") {
    CHECK_THROWS_WITH_AS(call(s.param, torch::randn({n + 1}), s.exp_avg, s.exp_avg_sq, good, 1),
                         Contains("must have the same shape"), c10::Error);
    CHECK_THROWS_WITH_AS(call(s.param, grad, torch::zeros({4, 4}), s.exp_avg_sq, good, 1),
                         Contains("must have the same shape"), c10::Error);
  }
  SUBCASE("dtypes") {
    CHECK_THROWS_WITH_AS(call(torch::zeros({n}, torch::kDouble), grad.to(torch::kDouble), s.exp_avg, s.exp_avg_sq, good,
                              1),
                         Contains("param must be float32, bfloat16 or float16"), c10::Error);
    CHECK_THROWS_WITH_AS(call(s.param, grad.to(torch::kBFloat16), s.exp_avg, s.exp_avg_sq, good, 1),
                         Contains("grad must have param's dtype"), c10::Error);
    CHECK_THROWS_WITH_AS(call(s.param.to(torch::kBFloat16), grad.to(torch::kBFloat16), s.exp_avg.to(torch::kBFloat16),
                              s.exp_avg_sq, good, 1),
                         Contains("exp_avg and exp_avg_sq must be float32"), c10::Error);
    CHECK_THROWS_WITH_AS(call(s.param, grad, s.exp_avg, s.exp_avg_sq.to(torch::kDouble), good, 1),
                         Contains("exp_avg and exp_avg_sq must be float32"), c10::Error);
  }
  SUBCASE("devices") {
    // A meta tensor stands in for another device (this check needs no GPU); the kernel is called directly,
    // because the dispatcher would route a meta argument to a (missing) meta kernel.
    // Each of the four in turn on the other device: a rule that compares only one tensor with param misses two.
    const torch::Tensor meta = torch::empty({n}, torch::TensorOptions().device(c10::kMeta));
    CHECK_THROWS_WITH_AS(fusion::check_adamw_args(meta, grad, s.exp_avg, s.exp_avg_sq, good, 1),
                         Contains("all tensors must be on one device"), c10::Error);
    CHECK_THROWS_WITH_AS(fusion::check_adamw_args(s.param, meta, s.exp_avg, s.exp_avg_sq, good, 1),
                         Contains("all tensors must be on one device"), c10::Error);
    CHECK_THROWS_WITH_AS(fusion::check_adamw_args(s.param, grad, meta, s.exp_avg_sq, good, 1),
                         Contains("all tensors must be on one device"), c10::Error);
    CHECK_THROWS_WITH_AS(fusion::check_adamw_args(s.param, grad, s.exp_avg, meta, good, 1),
                         Contains("all tensors must be on one device"), c10::Error);
  }
  SUBCASE("overlap") {
    CHECK_THROWS_WITH_AS(call(s.param, s.param, s.exp_avg, s.exp_avg_sq, good, 1),
                         Contains("param and grad overlap in memory"), c10::Error);
    CHECK_THROWS_WITH_AS(call(s.param, grad, s.exp_avg, s.param, good, 1),
                         Contains("param and exp_avg_sq overlap in memory"), c10::Error);
    CHECK_THROWS_WITH_AS(call(s.param, grad, grad, s.exp_avg_sq, good, 1),
                         Contains("grad and exp_avg overlap in memory"), c10::Error);
    CHECK_THROWS_WITH_AS(call(s.param, grad, s.exp_avg, grad, good, 1),
                         Contains("grad and exp_avg_sq overlap in memory"), c10::Error);
    const torch::Tensor both = torch::zeros({n + 8});
    CHECK_THROWS_WITH_AS(call(s.param, grad, both.slice(0, 0, n), both.slice(0, 8, n + 8), good, 1),
                         Contains("exp_avg and exp_avg_sq overlap in memory"), c10::Error);
    // Neighbours in one buffer that do not share an element are fine.
    const torch::Tensor split = torch::zeros({2 * n});
    CHECK_NOTHROW(call(s.param, grad, split.slice(0, 0, n), split.slice(0, n, 2 * n), good, 1));
  }
  SUBCASE("step") {
    for (int64_t step : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
      CAPTURE(step);
      CHECK_THROWS_WITH_AS(call(s.param, grad, s.exp_avg, s.exp_avg_sq, good, step), Contains("step must be >= 1"),
                           c10::Error);
    }
  }
  SUBCASE("hyper-parameters") {
    const auto check = [&](fusion::AdamWHyper h, const char* message) {
      CAPTURE(message);
      CHECK_THROWS_WITH_AS(call(s.param, grad, s.exp_avg, s.exp_avg_sq, h, 1), Contains(message), c10::Error);
    };
    check(with([](fusion::AdamWHyper& h) { h.lr = -1e-3; }), "lr must be >= 0");
    check(with([](fusion::AdamWHyper& h) { h.lr = std::nan(""); }), "lr must be >= 0");
    check(with([](fusion::AdamWHyper& h) { h.eps = -1; }), "eps must be >= 0");
    check(with([](fusion::AdamWHyper& h) { h.weight_decay = -0.1; }), "weight_decay must be >= 0");
    check(with([](fusion::AdamWHyper& h) { h.beta1 = 1.0; }), "beta1 must be in [0, 1)");
    check(with([](fusion::AdamWHyper& h) { h.beta1 = -0.5; }), "beta1 must be in [0, 1)");
    check(with([](fusion::AdamWHyper& h) { h.beta2 = 1.5; }), "beta2 must be in [0, 1)");
    check(with([](fusion::AdamWHyper& h) { h.beta2 = 1.0; }), "beta2 must be in [0, 1)");  // 1 - beta2^t = 0
    // NaN compares false with everything: a rule written as !(x < 0) would let it through.
    check(with([](fusion::AdamWHyper& h) { h.eps = std::nan(""); }), "eps must be >= 0");
    check(with([](fusion::AdamWHyper& h) { h.weight_decay = std::nan(""); }), "weight_decay must be >= 0");
    check(with([](fusion::AdamWHyper& h) { h.beta1 = std::nan(""); }), "beta1 must be in [0, 1)");
    check(with([](fusion::AdamWHyper& h) { h.beta2 = std::nan(""); }), "beta2 must be in [0, 1)");
  }
  CHECK(torch::equal(s.exp_avg, torch::zeros({n})));  // no refused call wrote anything
}

}  // namespace adamw_checks
