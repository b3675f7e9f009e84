// Checks for lesson 6, step 4: the multi-tensor operator workshop::fused_adamw_multi_.
// Run: bazel test //lesson6_fusion:all   (this step only: bazel test //lesson6_fusion:fused_adamw_step4_test)
// The shared state, oracle and helpers are in fused_adamw_test_helpers.h.
#include "lesson6_fusion/fused_adamw_test_helpers.h"

namespace adamw_checks {

TEST_CASE("[step4] the multi-tensor op gives every tensor exactly what the single-tensor op gives it") {
  Lists multi = make_lists(12), single = make_lists(12);
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (int64_t step = 1; step <= 3; ++step) {
    fusion::fused_adamw_multi_(multi.params, multi.grads, multi.exp_avgs, multi.exp_avg_sqs, hyper, step);
    for (size_t i = 0; i < single.params.size(); ++i) {
      fusion::fused_adamw_(single.params[i], single.grads[i], single.exp_avgs[i], single.exp_avg_sqs[i], hyper, step);
    }
  }
  for (size_t i = 0; i < multi.params.size(); ++i) {
    CAPTURE(i);
    CHECK(torch::equal(multi.params[i], single.params[i]));  // the same arithmetic: the same bits
    CHECK(torch::equal(multi.exp_avgs[i], single.exp_avgs[i]));
    CHECK(torch::equal(multi.exp_avg_sqs[i], single.exp_avg_sqs[i]));
  }
}

TEST_CASE("[step4] the multi-tensor op gives the same bits on the baseline's 4 lanes and on AVX2's 8") {
  if (!has_avx2_copy()) return;
  Lists lists[2] = {make_lists(14), make_lists(14)};
  const fusion::CpuIsa isas[2] = {fusion::CpuIsa::kBaseline, fusion::CpuIsa::kAvx2};
  for (int k = 0; k < 2; ++k) {
    const IsaFor isa(isas[k]);
    Lists& l = lists[k];
    for (int64_t step = 1; step <= 3; ++step)
      fusion::fused_adamw_multi_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, hyper_with(1e-2, 0.1), step);
  }
  for (size_t i = 0; i < lists[0].params.size(); ++i) {
    CAPTURE(i);
    CHECK(torch::equal(lists[1].params[i], lists[0].params[i]));
    CHECK(torch::equal(lists[1].exp_avgs[i], lists[0].exp_avgs[i]));
    CHECK(torch::equal(lists[1].exp_avg_sqs[i], lists[0].exp_avg_sqs[i]));
  }
}

TEST_CASE("[step4] set_cpu_isa switches the multi-tensor kernel's copy of the loop too") {
  Lists l = make_lists(19);
  const auto run = [&](fusion::CpuIsa isa) {
    const IsaFor chosen(isa);
    return copies_run_by([&] {
      fusion::adamw_multi_kernel_cpu(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, hyper_with(1e-2, 0.1), 1);
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

TEST_CASE("[step4] the dispatcher finds workshop::fused_adamw_multi_, and empty tensors are accepted") {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(fusion::kMultiOpName, "");
  std::ostringstream schema;
  schema << op.schema();
  CAPTURE(schema.str());
  CHECK(schema.str().find("workshop::fused_adamw_multi_(Tensor(a!)[] params, Tensor[] grads") == 0);
  CHECK(op.hasKernelForDispatchKey(c10::DispatchKey::CPU));
  const std::vector<torch::Tensor> none;
  CHECK_NOTHROW(fusion::fused_adamw_multi_(none, none, none, none, fusion::AdamWHyper{}, 1));  // nothing to update
  const std::vector<torch::Tensor> empty = {torch::empty({0}), torch::empty({2, 0})};
  CHECK_NOTHROW(fusion::fused_adamw_multi_(empty, empty, {torch::zeros({0}), torch::zeros({2, 0})},
                                           {torch::zeros({0}), torch::zeros({2, 0})}, fusion::AdamWHyper{}, 1));
}

TEST_CASE("[step4] an empty list gets the single operator's checks of the step and the hyper-parameters") {
  // Nothing to update is no reason to accept what a call with one tuple refuses (issue 43).
  const std::vector<torch::Tensor> none;
  const auto with = [](void (*change)(fusion::AdamWHyper&)) {
    fusion::AdamWHyper h;
    change(h);
    return h;
  };
  const auto check = [&](const fusion::AdamWHyper& h, int64_t step, const char* message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(none, none, none, none, h, step), Contains(message), c10::Error);
    // ... and through the CPU kernel, as the dispatcher calls it (no tensor: given.cc calls it directly too).
    CHECK_THROWS_WITH_AS(fusion::check_adamw_multi_args(none, none, none, none, h, step), Contains(message),
                         c10::Error);
  };
  check(fusion::AdamWHyper{}, 0, "fused_adamw_multi_: step must be >= 1, got 0");
  check(fusion::AdamWHyper{}, -3, "fused_adamw_multi_: step must be >= 1, got -3");
  check(with([](fusion::AdamWHyper& h) { h.lr = std::nan(""); }), 1, "lr must be >= 0");
  check(with([](fusion::AdamWHyper& h) { h.eps = -1; }), 1, "eps must be >= 0");
  check(with([](fusion::AdamWHyper& h) { h.weight_decay = -1; }), 1, "weight_decay must be >= 0");
  check(with([](fusion::AdamWHyper& h) { h.beta1 = 1; }), 1, "beta1 must be in [0, 1)");
  check(with([](fusion::AdamWHyper& h) { h.beta2 = -0.1; }), 1, "beta2 must be in [0, 1)");
  // A list with tuples: the same messages, checked before the tuples (so also when one tuple is bad as well).
  Lists l = make_lists(16);
  CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, fusion::AdamWHyper{},
                                                  0),
                       Contains("fused_adamw_multi_: step must be >= 1, got 0"), c10::Error);
}

TEST_CASE("[step4] bad lists give their named errors, and nothing is written") {
  Lists l = make_lists(13);
  const fusion::AdamWHyper h;
  SUBCASE("lengths") {
    std::vector<torch::Tensor> short_grads(l.grads.begin(), l.grads.end() - 1);
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(l.params, short_grads, l.exp_avgs, l.exp_avg_sqs, h, 1),
                         Contains("the lists must have one length"), c10::Error);
  }
  SUBCASE("one tuple's error, with its index") {
    l.grads[3] = torch::randn({14}).to(torch::kBFloat16).slice(0, 0, 14, 2);  // 7 elements, strided
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, h, 1),
                         Contains("tensor 3"), c10::Error);
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, h, 1),
                         Contains("grad is not contiguous"), c10::Error);
  }
  SUBCASE("two tuples sharing memory") {
    const torch::Tensor shared = torch::randn({100});
    l.params[0] = shared.slice(0, 0, 60);
    l.grads[0] = torch::randn({60});
    l.exp_avgs[0] = torch::zeros({60});
    l.exp_avg_sqs[0] = torch::zeros({60});
    l.params[1] = shared.slice(0, 59, 60);  // the last element of params[0]
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, h, 1),
                         Contains("params[1] and params[0] overlap in memory"), c10::Error);
    l.params[1] = torch::randn({1});
    l.exp_avg_sqs[6] = l.exp_avgs[4].slice(0, 0, 5000);  // a moment inside another tuple's moment
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, h, 1),
                         Contains("overlap in memory"), c10::Error);
  }
  SUBCASE("a gradient inside another tuple's parameter") {
    // A gradient is only read, but that parameter is written in the same pass: the gradient would change under the
    // kernel. Tuple 3 is bfloat16 of 7 elements, tuple 6 bfloat16 of 5000.
    const torch::Tensor big = torch::randn({5007}).to(torch::kBFloat16);
    l.params[6] = big.slice(0, 0, 5000);
    l.grads[3] = big.slice(0, 5000, 5007);  // right after params[6]: the two touch and share nothing
    CHECK_NOTHROW(fusion::check_adamw_multi_args(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, h, 1));
    l.grads[3] = big.slice(0, 4999, 5006);  // its first element is params[6]'s last
    CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, h, 1),
                         Contains("grads[3] and params[6] overlap in memory"), c10::Error);
  }
  SUBCASE("tuples on two devices") {
    // Tuple 2 (empty) on another device: each tuple is on one device, but the list is not. A meta tensor stands in
    // for a GPU (the check is called directly: the dispatcher would look for a meta kernel).
    const torch::Tensor meta = torch::empty({0}, torch::TensorOptions().device(c10::kMeta));
    Lists mixed = l;
    mixed.params[2] = meta;
    mixed.grads[2] = meta.clone();
    mixed.exp_avgs[2] = meta.clone();
    mixed.exp_avg_sqs[2] = meta.clone();
    CHECK_THROWS_WITH_AS(fusion::check_adamw_multi_args(mixed.params, mixed.grads, mixed.exp_avgs, mixed.exp_avg_sqs, h,
                                                        1),
                         Contains("all tensors must be on one device"), c10::Error);
  }
  for (const torch::Tensor& m : l.exp_avgs) CHECK(m.abs().sum().item<float>() == 0.0f);
}

TEST_CASE("[step4] tensors that touch (views of one flat buffer), starting mid-vector: the bits of separate tensors") {
  // A piece that runs past its tensor's end would update the next tensor's first elements a second time; a kernel
  // that assumes aligned addresses would read the wrong ones. Against the single operator on separate tensors.
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t offset : {0, 1, 3}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(offset);
      torch::manual_seed(17 + offset);
      std::vector<torch::Tensor> p, g, m, v;
      for (int64_t n : {5, 32768 + 3, 8, 1, 40000, 7}) {
        p.push_back(torch::randn({n}).to(dtype));
        g.push_back(torch::randn({n}).to(dtype));
        m.push_back(torch::randn({n}) * 0.1);
        v.push_back(torch::rand({n}));
      }
      torch::Tensor buffers[4];
      std::vector<torch::Tensor> params = touching_views(p, offset, buffers[0]);
      const std::vector<torch::Tensor> grads = touching_views(g, offset, buffers[1]);
      std::vector<torch::Tensor> exp_avgs = touching_views(m, offset + 2, buffers[2]);  // another offset
      std::vector<torch::Tensor> exp_avg_sqs = touching_views(v, offset + 1, buffers[3]);
      for (int step = 1; step <= 2; ++step) {
        fusion::fused_adamw_multi_(params, grads, exp_avgs, exp_avg_sqs, hyper, step);
        for (size_t i = 0; i < p.size(); ++i) fusion::fused_adamw_(p[i], g[i], m[i], v[i], hyper, step);
      }
      for (size_t i = 0; i < p.size(); ++i) {
        CAPTURE(i);
        CHECK(torch::equal(params[i], p[i]));
        CHECK(torch::equal(exp_avgs[i], m[i]));
        CHECK(torch::equal(exp_avg_sqs[i], v[i]));
      }
      for (const torch::Tensor& b : buffers) CHECK(b[-1].item<float>() == 0.5f);  // the guard after the last view
    }
  }
}

TEST_CASE("[step4] the multi-tensor operator bumps the versions of the tensors it writes") {
  Lists l = make_lists(18);
  std::vector<int64_t> before;
  for (const auto* list : {&l.params, &l.grads, &l.exp_avgs, &l.exp_avg_sqs}) {
    for (const torch::Tensor& t : *list) before.push_back(t._version());
  }
  fusion::fused_adamw_multi_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, hyper_with(1e-2, 0.1), 1);
  size_t k = 0;
  for (const auto* list : {&l.params, &l.grads, &l.exp_avgs, &l.exp_avg_sqs}) {
    for (const torch::Tensor& t : *list) {
      CAPTURE(k);
      if (list == &l.grads) {
        CHECK(t._version() == before[k]);  // only read
      } else {
        CHECK(t._version() > before[k]);
      }
      ++k;
    }
  }
}

TEST_CASE("[step4] on 4 ATen threads the whole list is one parallel region, with the one-thread bits") {
  // Five tensors of three pieces each, and small ones: one region in all, not one per tensor.
  const auto lists = [] {
    Lists l = make_lists(14);
    torch::manual_seed(15);
    for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kFloat, torch::kHalf, torch::kFloat}) {
      l.params.push_back(torch::randn({70000}).to(dtype));
      l.grads.push_back(torch::randn({70000}).to(dtype));
      l.exp_avgs.push_back(torch::zeros({70000}));
      l.exp_avg_sqs.push_back(torch::zeros({70000}));
    }
    return l;
  };
  Lists one = lists(), four = lists();
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  {
    const ThreadsFor threads(1);
    fusion::fused_adamw_multi_(one.params, one.grads, one.exp_avgs, one.exp_avg_sqs, hyper, 1);
  }
  const ThreadsFor threads(4);
  const int regions = parallel_regions(
      [&] { fusion::fused_adamw_multi_(four.params, four.grads, four.exp_avgs, four.exp_avg_sqs, hyper, 1); });
  for (size_t i = 0; i < one.params.size(); ++i) {
    CAPTURE(i);
    CHECK(torch::equal(four.params[i], one.params[i]));
    CHECK(torch::equal(four.exp_avgs[i], one.exp_avgs[i]));
    CHECK(torch::equal(four.exp_avg_sqs[i], one.exp_avg_sqs[i]));
  }
  if (regions_are_counted()) {
    CHECK(regions == 1);
  } else {
    MESSAGE("parallel regions are not counted here (no OpenMP in this LibTorch)");
  }
}

TEST_CASE("[step4] nothing past a tensor's end is read or written: a list of every tail and dtype against walls") {
  // Every tensor of the list ends at an inaccessible page (guarded_copy): pieces that span tensors must stop
  // at each tensor's own end.
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  Lists walled, plain;
  torch::manual_seed(14);
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t n : tail_sizes()) {
      plain.params.push_back(torch::randn({n}).to(dtype));
      plain.grads.push_back(torch::randn({n}).to(dtype));
      plain.exp_avgs.push_back(torch::rand({n}));
      plain.exp_avg_sqs.push_back(torch::rand({n}));
      walled.params.push_back(guarded_copy(plain.params.back()));
      walled.grads.push_back(guarded_copy(plain.grads.back()));
      walled.exp_avgs.push_back(guarded_copy(plain.exp_avgs.back()));
      walled.exp_avg_sqs.push_back(guarded_copy(plain.exp_avg_sqs.back()));
    }
  }
  fusion::fused_adamw_multi_(walled.params, walled.grads, walled.exp_avgs, walled.exp_avg_sqs, hyper, 2);
  for (size_t i = 0; i < plain.params.size(); ++i) {
    fusion::fused_adamw_(plain.params[i], plain.grads[i], plain.exp_avgs[i], plain.exp_avg_sqs[i], hyper, 2);
  }
  for (size_t i = 0; i < plain.params.size(); ++i) {
    CAPTURE(i);
    CHECK(torch::equal(walled.params[i], plain.params[i]));
    CHECK(torch::equal(walled.exp_avgs[i], plain.exp_avgs[i]));
    CHECK(torch::equal(walled.exp_avg_sqs[i], plain.exp_avg_sqs[i]));
  }
}

// Tagged step 4: both schemas are registered once steps 3 and 4 are done; step 5 gives the two arguments meaning.
TEST_CASE("[step4] both AdamW operators take grad_scale and found_inf as ATen's do: optional, keyword-only, last") {
  for (const char* name : {fusion::kOpName, fusion::kMultiOpName}) {
    CAPTURE(name);
    const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
    const auto& args = op.schema().arguments();
    REQUIRE(args.size() == 13);
    CHECK(args[9].name() == "step");
    CHECK_FALSE(args[9].kwarg_only());
    const char* names[] = {"grad_scale", "found_inf", "state_step"};
    for (size_t i : {10, 11, 12}) {
      CAPTURE(i);
      CHECK(args[i].name() == names[i - 10]);
      CHECK(args[i].kwarg_only());
      CHECK(args[i].type()->str() == "Tensor?");
      // Written: state_step only (the counter the operator advances).
      CHECK((args[i].alias_info() != nullptr && args[i].alias_info()->isWrite()) == (i == 12));
    }
  }
}

}  // namespace adamw_checks
