// Checks for lesson 6, step 6: the CUDA kernels, on a simulated grid on the CPU and, where there is one, on a GPU.
// Run: bazel test //lesson6_fusion:all   (this step only: bazel test //lesson6_fusion:fused_adamw_step6_test)
// The shared state, oracle and helpers are in fused_adamw_test_helpers.h.
#include "lesson6_fusion/fused_adamw_test_helpers.h"

namespace adamw_checks {

TEST_CASE("[step6] launch_shape: a thread per pack, blocks rounded up, at most 4 blocks per multiprocessor") {
  using fusion::cuda::launch_shape;
  const fusion::cuda::LaunchShape none = launch_shape(0, 4, 132);
  CHECK(none.blocks == 0);
  CHECK(none.threads == 256);
  CHECK(launch_shape(1, 4, 132).blocks == 1);     // one partial pack still needs a block
  CHECK(launch_shape(1024, 4, 132).blocks == 1);  // 256 packs: one block of 256 threads
  CHECK(launch_shape(1025, 4, 132).blocks == 2);  // 257 packs (the last partial): a second block
  CHECK(launch_shape(1025, 1, 132).blocks == 5);  // one element per pack
  CHECK(launch_shape(8192, 8, 132).blocks == 4);
  CHECK(launch_shape(int64_t{1} << 26, 4, 132).blocks == 528);  // 64 Mi elements: the cap, 132 x 4
  CHECK(launch_shape(int64_t{1} << 40, 1, 1).blocks == 4);
  // Whatever the size: the grid either covers every pack with one thread, without a block to spare, or is capped.
  for (int64_t numel : {2, 255, 256, 257, 4097, 100003, 1 << 20}) {
    for (int width : {1, 2, 4, 8}) {
      CAPTURE(numel);
      CAPTURE(width);
      const fusion::cuda::LaunchShape s = launch_shape(numel, width, 8);
      CHECK(s.threads == 256);
      const int64_t covered = s.blocks * s.threads * width;
      CHECK((s.blocks == 32 || (covered >= numel && covered - s.threads * width < numel)));
      CHECK(s.blocks <= 32);
      CHECK(s.blocks >= 1);
    }
  }
}

TEST_CASE("[step6] launch_shape refuses a negative size, an odd vector width and no multiprocessors") {
  using fusion::cuda::launch_shape;
  CHECK_THROWS_WITH_AS(launch_shape(-1, 4, 8), Contains("launch_shape: numel must be >= 0, got -1"), c10::Error);
  CHECK_THROWS_WITH_AS(launch_shape(16, 3, 8), Contains("launch_shape: vector_width must be 1, 2, 4 or 8, got 3"),
                       c10::Error);
  CHECK_THROWS_WITH_AS(launch_shape(16, 0, 8), Contains("vector_width must be 1, 2, 4 or 8"), c10::Error);
  CHECK_THROWS_WITH_AS(launch_shape(16, 4, 0), Contains("launch_shape: multiprocessors must be >= 1, got 0"),
                       c10::Error);
}

namespace {

// A simulated grid of `multiprocessors` multiprocessors (so at most 4 x 256 x that many threads: every size below
// that grid's reach makes the grid-stride loops go round), its blocks shuffled by `seed`.
fusion::cuda::Target cpu_grid(int multiprocessors, uint64_t seed) {
  fusion::cuda::Target target;
  target.simulated_multiprocessors = multiprocessors;
  target.seed = seed;
  return target;
}

fusion::cuda::Dtype kernel_dtype(torch::ScalarType dtype) {
  if (dtype == torch::kBFloat16) return fusion::cuda::Dtype::BFloat16;
  if (dtype == torch::kHalf) return fusion::cuda::Dtype::Float16;
  REQUIRE(dtype_name(dtype) == "Float");
  return fusion::cuda::Dtype::Float32;
}

// One AdamW step of fused_adamw_cuda.cu's kernel on the CPU grid, for CPU tensors (raw pointers).
void grid_adamw(State& s, const torch::Tensor& grad, const fusion::AdamWHyper& hyper,
                const fusion::cuda::Target& target) {
  ++s.step;
  const char* error =
      fusion::cuda::launch_adamw(kernel_dtype(s.param.scalar_type()), s.param.data_ptr(), grad.data_ptr(),
                                 s.exp_avg.data_ptr<float>(), s.exp_avg_sq.data_ptr<float>(), s.param.numel(), hyper,
                                 s.step, target);
  INFO("launch_adamw: " << (error == nullptr ? "ok" : error));
  REQUIRE(error == nullptr);
}

// The multi-tensor unscale on the CPU grid for the whole list, one call (as given_cuda.cc makes it); the launches.
int64_t grid_unscale(std::vector<torch::Tensor>& grads, torch::Tensor& found_inf, float inv,
                     const fusion::cuda::Target& target) {
  const torch::Tensor inv_scale = torch::full({1}, inv);
  std::vector<fusion::cuda::GradPointer> pointers;
  for (torch::Tensor& g : grads) {
    fusion::cuda::GradPointer p;
    p.dtype = kernel_dtype(g.scalar_type());
    p.grad = g.data_ptr();
    p.numel = g.numel();
    pointers.push_back(p);
  }
  int64_t launches = -1;
  const char* error =
      fusion::cuda::launch_unscale(pointers.data(), static_cast<int64_t>(pointers.size()), found_inf.data_ptr<float>(),
                                   inv_scale.data_ptr<float>(), target, &launches);
  INFO("launch_unscale: " << (error == nullptr ? "ok" : error));
  REQUIRE(error == nullptr);
  return launches;
}

// How far one grid step of `s` lands from the float32 step of given.cc on the same state and gradient, per element:
// the state within a relative 1e-6 (a GPU rounds with fused multiply-adds, the ATen ops on a CPU without), the
// parameter within one unit in its last place (its float32 results may straddle a rounding boundary of a 16-bit
// type), and a 16-bit parameter exactly the rounded float32 result in at least 99 % of the elements (a kernel that
// truncates differs in about half). Every element is compared, so one that is updated twice or not at all shows.
void check_grid_step(State& s, const torch::Tensor& grad, const fusion::AdamWHyper& hyper,
                     const fusion::cuda::Target& target) {
  const torch::ScalarType dtype = s.param.scalar_type();
  State master = make_state(s.param.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true));
  master.exp_avg = s.exp_avg.clone();
  master.exp_avg_sq = s.exp_avg_sq.clone();
  master.step = s.step;
  fusion::unfused_adamw_step(master.param, grad.to(torch::kFloat), master.exp_avg, master.exp_avg_sq, hyper,
                             ++master.step);
  grid_adamw(s, grad, hyper, target);
  const double ulp = dtype == torch::kFloat      ? std::ldexp(1.0, -22)
                     : dtype == torch::kBFloat16 ? std::ldexp(1.0, -7)
                                                 : std::ldexp(1.0, -10);
  // Relative to each element, with a floor of 1e-6 of the largest (where a sum nearly cancels, one rounding more
  // or less is large against the result).
  const auto within = [](const torch::Tensor& got, const torch::Tensor& want, double relative) {
    const double floor = 1e-6 * want.abs().max().item<double>();
    return ((got.to(torch::kFloat) - want).abs() <= want.abs() * relative + floor).all().item<bool>();
  };
  CHECK(within(s.exp_avg, master.exp_avg, 1e-6));
  CHECK(within(s.exp_avg_sq, master.exp_avg_sq, 1e-6));
  CHECK(within(s.param, master.param, ulp));
  if (dtype != torch::kFloat) {  // (in float32, a multiply-add differs in the last bit of about 2 % of the elements)
    const double exact = s.param.eq(master.param.to(dtype)).to(torch::kDouble).mean().item<double>();
    CAPTURE(exact);
    CHECK(exact >= 0.99);
  }
}

}  // namespace

TEST_CASE(
    "[step6] CPU grid: the CUDA kernel follows torch::optim::AdamW for 100 steps, grid-stride loops going round") {
  const int64_t n = 10007;  // packs of 4 and a tail of 3; 2.4 times the reach of a one-multiprocessor grid
  REQUIRE(fusion::cuda::launch_shape(n, 4, 1).blocks * 256 * 4 < n);
  for (double weight_decay : {0.0, 0.1}) {
    CAPTURE(weight_decay);
    const fusion::AdamWHyper hyper = hyper_with(1e-2, weight_decay);
    torch::manual_seed(3);
    const torch::Tensor start = torch::randn({n});
    torch::Tensor reference = start.clone().requires_grad_(true);
    torch::optim::AdamW optimizer({reference}, fusion::adamw_options(hyper));
    State grid = make_state(start.clone());
    double worst = 0;
    uint64_t seed = 1;
    for (const torch::Tensor& grad : gradients(n, 100, 1.0)) {
      reference.mutable_grad() = grad.clone();
      optimizer.step();
      grid_adamw(grid, grad, hyper, cpu_grid(1, seed++));
      worst = std::max(worst, rel_error({grid.param}, {reference.detach()}));
    }
    CAPTURE(worst);
    CHECK(worst <= kFloatTolerance);
  }
}

TEST_CASE("[step6] CPU grid: every size, tail and alignment, in every dtype, is the float32 step rounded once") {
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  std::vector<int64_t> sizes;
  for (int64_t r = 0; r < 8; ++r) sizes.insert(sizes.end(), {r + 1, 8 + r, 3 * 4096 + r, (1 << 16) + r});
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t n : sizes) {
      for (int64_t offset : {0, 1}) {  // 0: every pointer aligned to a pack; 1: a view that starts mid-pack
        CAPTURE(dtype_name(dtype));
        CAPTURE(n);
        CAPTURE(offset);
        torch::manual_seed(n);
        torch::Tensor param_buffer, m_buffer, v_buffer, grad_buffer;
        State s;
        s.param = view_in_buffer(torch::randn({n}).to(dtype), offset, param_buffer);
        s.exp_avg = view_in_buffer(torch::zeros({n}), offset, m_buffer);
        s.exp_avg_sq = view_in_buffer(torch::zeros({n}), offset, v_buffer);
        const int multiprocessors = n % 2 == 0 ? 1 : 3;
        for (const torch::Tensor& grad32 : gradients(n, 2, 1.0)) {
          const torch::Tensor grad = view_in_buffer(grad32.to(dtype), offset, grad_buffer);
          check_grid_step(s, grad, hyper, cpu_grid(multiprocessors, static_cast<uint64_t>(n + s.step)));
        }
        // Nothing written outside the tensors: the element before a view, the guard after each.
        for (const torch::Tensor& buffer : {param_buffer, m_buffer, v_buffer}) {
          if (offset == 1) CHECK(buffer[0].item<float>() == 0.5f);
          CHECK(buffer[offset + n].item<float>() == 0.5f);
        }
      }
    }
  }
}

TEST_CASE("[step6] CPU grid: parameters of every size and dtype in one list, as the CUDA multi-tensor operator runs") {
  Lists lists = make_lists(31);
  std::vector<State> states;
  for (size_t i = 0; i < lists.params.size(); ++i) {
    State s;
    s.param = lists.params[i];
    s.exp_avg = lists.exp_avgs[i];
    s.exp_avg_sq = lists.exp_avg_sqs[i];
    states.push_back(s);
  }
  for (int step = 1; step <= 3; ++step) {
    for (size_t i = 0; i < states.size(); ++i) {
      CAPTURE(i);
      if (states[i].param.numel() == 0) {
        grid_adamw(states[i], lists.grads[i], hyper_with(1e-2, 0.1), cpu_grid(2, i));  // an empty tensor: no-op
        continue;
      }
      check_grid_step(states[i], lists.grads[i], hyper_with(1e-2, 0.1), cpu_grid(2, i + 10 * step));
    }
  }
}

TEST_CASE("[step6] CPU grid unscale: each value multiplied and rounded once, found_inf from the values as read") {
  std::vector<torch::Tensor> before = scaled_grads(41);
  for (int64_t r = 1; r < 8; ++r) before.push_back((torch::randn({4096 * 3 + r}) * 1024).to(torch::kHalf));
  before.push_back(torch::full({9}, 1e38f));                      // float32 x 16 overflows: the value read was finite
  before.push_back(torch::full({13}, 60000.0).to(torch::kHalf));  // float16 x 4 overflows to inf
  for (float inv : {1.0f / 1024, 0.1f, 1.0f, 16.0f}) {
    for (int multiprocessors : {1, 3}) {
      CAPTURE(inv);
      CAPTURE(multiprocessors);
      std::vector<torch::Tensor> grads = clones(before);
      torch::Tensor found_inf = torch::zeros({1});
      grid_unscale(grads, found_inf, inv, cpu_grid(multiprocessors, 5));
      CHECK(found_inf.item<float>() == 0.0f);
      for (size_t i = 0; i < grads.size(); ++i) {
        CAPTURE(i);
        CHECK(torch::equal(grads[i], (before[i].to(torch::kFloat) * inv).to(before[i].scalar_type())));
      }
    }
  }
}

TEST_CASE(
    "[step6] CPU grid unscale: an inf or a NaN anywhere sets found_inf, at any scale, and every value is still unscaled") {
  std::vector<torch::Tensor> before = scaled_grads(42);
  before.push_back((torch::randn({4096 * 3 + 5}) * 1024).to(torch::kHalf));
  // (gradient, element): the first of all, the end of the float32 tensor past a grid's reach, a 16-bit tail, the
  // last element of the list, a one-element gradient.
  const std::vector<std::pair<size_t, int64_t>> places = {{0, 0}, {3, 100002}, {4, 32}, {7, 4096 * 3 + 4}, {6, 0}};
  for (const auto& [t, k] : places) {
    for (float bad : {INFINITY, NAN}) {
      for (float inv : {0.5f, 1.0f}) {   // at a scale of 1 nothing is multiplied, but the check still runs
        for (int64_t offset : {0, 1}) {  // 1: the gradients start mid-pack: the one-element path
          CAPTURE(t);
          CAPTURE(k);
          CAPTURE(bad);
          CAPTURE(inv);
          CAPTURE(offset);
          std::vector<torch::Tensor> buffers(before.size()), grads;
          for (size_t i = 0; i < before.size(); ++i) grads.push_back(view_in_buffer(before[i], offset, buffers[i]));
          grads[t][k] = bad;
          const std::vector<torch::Tensor> expected = clones(grads);
          torch::Tensor found_inf = torch::zeros({1});
          grid_unscale(grads, found_inf, inv, cpu_grid(1, 9));
          CHECK(found_inf.item<float>() == 1.0f);
          for (size_t i = 0; i < grads.size(); ++i) {  // every element, those after the bad one included
            const torch::Tensor want = (expected[i].to(torch::kFloat) * inv).to(expected[i].scalar_type());
            CHECK(torch::equal(grads[i].nan_to_num(0, 1, -1), want.nan_to_num(0, 1, -1)));
          }
        }
      }
    }
  }
}

TEST_CASE("[step6] CPU grid: the AdamW kernel unscales in its pass and skips on found_inf, read on the device") {
  const int64_t n = 10007;  // beyond a one-multiprocessor grid's reach: the grid-stride loop goes round
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (int64_t offset : {0, 1}) {  // 1: a view that starts mid-pack, the one-element path
    CAPTURE(offset);
    torch::manual_seed(41);
    torch::Tensor p_buffer, q_buffer;
    const torch::Tensor start = torch::randn({n});
    State scaled = make_state(view_in_buffer(start, offset, p_buffer));
    State plain = make_state(view_in_buffer(start, offset, q_buffer));
    const float scale = 3.0f, zero = 0.0f;
    for (int64_t step = 1; step <= 2; ++step) {
      const torch::Tensor grad = torch::randn({n}) * scale;
      const torch::Tensor grad_before = grad.clone();
      const torch::Tensor unscaled = grad * inverse_of(scale);  // the float32 product, as the kernel forms it
      const char* error =
          fusion::cuda::launch_adamw(fusion::cuda::Dtype::Float32, scaled.param.data_ptr(), grad.data_ptr(),
                                     scaled.exp_avg.data_ptr<float>(), scaled.exp_avg_sq.data_ptr<float>(), n, hyper,
                                     step, cpu_grid(1, 5 + step), &scale, &zero);
      REQUIRE(error == nullptr);
      error = fusion::cuda::launch_adamw(fusion::cuda::Dtype::Float32, plain.param.data_ptr(), unscaled.data_ptr(),
                                         plain.exp_avg.data_ptr<float>(), plain.exp_avg_sq.data_ptr<float>(), n, hyper,
                                         step, cpu_grid(1, 5 + step));
      REQUIRE(error == nullptr);
      CHECK(same_state(scaled, plain));
      CHECK(torch::equal(grad, grad_before));
    }
    for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      CAPTURE(dtype_name(dtype));
      State s = make_state(torch::randn({n}).to(dtype));
      const State before = copy_of(s);
      const torch::Tensor grad = torch::randn({n}).to(dtype);
      const float flag = 1.0f;
      const char* error = fusion::cuda::launch_adamw(kernel_dtype(dtype), s.param.data_ptr(), grad.data_ptr(),
                                                     s.exp_avg.data_ptr<float>(), s.exp_avg_sq.data_ptr<float>(), n,
                                                     hyper, 1, cpu_grid(2, 3), &scale, &flag);
      REQUIRE(error == nullptr);
      CHECK(same_state(s, before));
    }
  }
}

namespace {

// Every state of `states` with its gradient, through launch_adamw_multi on the CPU grid; the launches.
int64_t grid_adamw_multi(std::vector<State>& states, const std::vector<torch::Tensor>& grads,
                         const fusion::AdamWHyper& hyper, int64_t step, const fusion::cuda::Target& target,
                         const float* grad_scale = nullptr, const float* found_inf = nullptr,
                         float* state_step = nullptr) {
  std::vector<fusion::cuda::TensorPointers> tensors;
  for (size_t i = 0; i < states.size(); ++i) {
    fusion::cuda::TensorPointers t;
    t.dtype = kernel_dtype(states[i].param.scalar_type());
    t.param = states[i].param.data_ptr();
    t.grad = grads[i].data_ptr();
    t.exp_avg = states[i].exp_avg.data_ptr<float>();
    t.exp_avg_sq = states[i].exp_avg_sq.data_ptr<float>();
    t.numel = states[i].param.numel();
    tensors.push_back(t);
  }
  int64_t launches = -1;
  const char* error = fusion::cuda::launch_adamw_multi(tensors.data(), static_cast<int64_t>(tensors.size()), hyper,
                                                       step, target, grad_scale, found_inf, state_step, &launches);
  INFO("launch_adamw_multi: " << (error == nullptr ? "ok" : error));
  REQUIRE(error == nullptr);
  return launches;
}

}  // namespace

TEST_CASE(
    "[step6] CPU grid multi-tensor: each tensor gets launch_adamw's bits, in as few launches as the limits allow") {
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  const auto check_against_single = [&](std::vector<State>& multi, const std::vector<torch::Tensor>& grads,
                                        int64_t expected_launches, const float* grad_scale) {
    std::vector<State> single;
    for (const State& s : multi) single.push_back(copy_of(s));
    CHECK(grid_adamw_multi(multi, grads, hyper, 1, cpu_grid(2, 7), grad_scale) == expected_launches);
    for (size_t i = 0; i < multi.size(); ++i) {
      if (single[i].param.numel() == 0) continue;
      const char* error =
          fusion::cuda::launch_adamw(kernel_dtype(single[i].param.scalar_type()), single[i].param.data_ptr(),
                                     grads[i].data_ptr(), single[i].exp_avg.data_ptr<float>(),
                                     single[i].exp_avg_sq.data_ptr<float>(), single[i].param.numel(), hyper, 1,
                                     cpu_grid(1, 3), grad_scale);
      REQUIRE(error == nullptr);
      CAPTURE(i);
      CHECK(same_state(multi[i], single[i]));
    }
  };
  SUBCASE("100 small float32 tensors, an empty one among them: 36 + 36 + 27 tensors, three launches") {
    torch::manual_seed(43);
    std::vector<State> states;
    std::vector<torch::Tensor> grads;
    for (int k = 0; k < 100; ++k) {
      const int64_t numel = k == 50 ? 0 : (k * 997) % 5003 + 1;  // 1..5003 elements: tails of every length
      states.push_back(make_state(torch::randn({numel})));
      grads.push_back(torch::randn({numel}));
    }
    check_against_single(states, grads, 3, nullptr);
  }
  SUBCASE("grad_scale in every launch, and a found_inf of 1 writes nothing") {
    torch::manual_seed(47);
    std::vector<State> states;
    std::vector<torch::Tensor> grads;
    for (int k = 0; k < 40; ++k) {
      states.push_back(make_state(torch::randn({k * 31 + 5}).to(torch::kHalf)));
      grads.push_back((torch::randn({k * 31 + 5}) * 8).to(torch::kHalf));
    }
    const float scale = 8.0f, flag = 1.0f;
    std::vector<State> before;
    for (const State& s : states) before.push_back(copy_of(s));
    CHECK(grid_adamw_multi(states, grads, hyper, 1, cpu_grid(2, 5), &scale, &flag) == 2);
    for (size_t i = 0; i < states.size(); ++i) CHECK(same_state(states[i], before[i]));
    check_against_single(states, grads, 2, &scale);
  }
  SUBCASE("views that start mid-pack: one element at a time, the same bits") {
    torch::manual_seed(53);
    std::vector<torch::Tensor> buffers(6);
    std::vector<State> states;
    std::vector<torch::Tensor> grads;
    for (int k = 0; k < 6; ++k) {
      states.push_back(make_state(view_in_buffer(torch::randn({70001 + k}).to(torch::kBFloat16), k % 2, buffers[k])));
      grads.push_back(torch::randn({70001 + k}).to(torch::kBFloat16));
    }
    check_against_single(states, grads, 1, nullptr);  // 12 chunks: one launch
  }
  SUBCASE("a tensor of 321 chunks fills a launch and goes on in the next, with the two small tensors after it") {
    torch::manual_seed(59);
    const int64_t big = 320 * fusion::cuda::kChunkElements + 5;
    std::vector<State> states = {make_state(torch::randn({big}).to(torch::kBFloat16)),
                                 make_state(torch::randn({3}).to(torch::kBFloat16)),
                                 make_state(torch::randn({65537}).to(torch::kBFloat16))};
    std::vector<torch::Tensor> grads;
    for (const State& s : states) grads.push_back(torch::randn({s.param.numel()}).to(torch::kBFloat16));
    check_against_single(states, grads, 2, nullptr);
  }
  SUBCASE("only empty tensors: no launch") {
    std::vector<State> states = {make_state(torch::zeros({0})), make_state(torch::zeros({0}))};
    std::vector<torch::Tensor> grads = {torch::zeros({0}), torch::zeros({0})};
    CHECK(grid_adamw_multi(states, grads, hyper, 1, cpu_grid(1, 1)) == 0);
  }
}

TEST_CASE("[step6] CPU grid: state_step counts the steps taken on the device; a skipped step does not count") {
  // Issue 43: a caller that does not read found_inf cannot know the step's number; the kernels read it from
  // state_step (the steps taken so far) and advance it after the update unless found_inf skipped the step. Against
  // the same kernels given the number of the steps taken on the host, bit for bit.
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  const std::vector<float> flags = {0, 1, 0, 1, 1, 0, 0, 2};
  const float scale = 1024.0f;
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
    CAPTURE(dtype_name(dtype));
    const int64_t n = 10007;  // beyond a one-multiprocessor grid's reach
    torch::manual_seed(61);
    State counted = make_state(torch::randn({n}).to(dtype));
    State reference = copy_of(counted);
    std::vector<State> multi = {make_state(torch::randn({70001}).to(dtype)), make_state(torch::randn({33})),
                                make_state(torch::randn({5}).to(torch::kHalf))};
    std::vector<State> multi_reference;
    for (const State& s : multi) multi_reference.push_back(copy_of(s));
    float state_step = 0, multi_state_step = 0;
    int64_t taken = 0;
    uint64_t seed = 1;
    for (float flag : flags) {
      CAPTURE(flag);
      const torch::Tensor grad = (torch::randn({n}) * scale).to(dtype);
      std::vector<torch::Tensor> grads;
      for (const State& s : multi) grads.push_back((torch::randn({s.param.numel()}) * scale).to(s.param.scalar_type()));
      const char* error =
          fusion::cuda::launch_adamw(kernel_dtype(dtype), counted.param.data_ptr(), grad.data_ptr(),
                                     counted.exp_avg.data_ptr<float>(), counted.exp_avg_sq.data_ptr<float>(), n, hyper,
                                     0, cpu_grid(1, seed++), &scale, &flag, &state_step);
      REQUIRE(error == nullptr);
      grid_adamw_multi(multi, grads, hyper, 0, cpu_grid(2, seed++), &scale, &flag, &multi_state_step);
      if (flag == 0) {  // the reference steps only when nothing overflowed, its number counted on the host
        ++taken;
        error = fusion::cuda::launch_adamw(kernel_dtype(dtype), reference.param.data_ptr(), grad.data_ptr(),
                                           reference.exp_avg.data_ptr<float>(), reference.exp_avg_sq.data_ptr<float>(),
                                           n, hyper, taken, cpu_grid(1, seed++), &scale);
        REQUIRE(error == nullptr);
        grid_adamw_multi(multi_reference, grads, hyper, taken, cpu_grid(2, seed++), &scale);
      }
      CHECK(state_step == static_cast<float>(taken));
      CHECK(multi_state_step == static_cast<float>(taken));
      CHECK(same_state(counted, reference));
      for (size_t i = 0; i < multi.size(); ++i) CHECK(same_state(multi[i], multi_reference[i]));
    }
  }
  {  // an empty list's call still counts its step, once
    std::vector<State> none;
    float state_step = 4, flag = 0;
    CHECK(grid_adamw_multi(none, {}, hyper, 0, cpu_grid(1, 1), nullptr, &flag, &state_step) == 0);
    CHECK(state_step == 5.0f);
    flag = 1;
    grid_adamw_multi(none, {}, hyper, 0, cpu_grid(1, 1), nullptr, &flag, &state_step);
    CHECK(state_step == 5.0f);
  }
}

TEST_CASE("[step6] CPU grid: nothing past a tensor's end is read or written: every tail and dtype against walls") {
  // Each tensor ends at an inaccessible page (guarded_copy): a read or a write of one element past the end crashes.
  // A tensor that ends at a page starts mid-pack unless its size is a multiple of 4: the one-element path runs there.
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  std::vector<int64_t> sizes = tail_sizes();
  sizes.push_back(fusion::cuda::kChunkElements + 3);  // a second chunk of 3 in the multi-tensor launch
  std::vector<State> walled, plain;
  std::vector<torch::Tensor> walled_grads, plain_grads;
  torch::manual_seed(63);
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t n : sizes) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(n);
      State p = make_state(torch::randn({n}).to(dtype));
      p.exp_avg.normal_();
      p.exp_avg_sq.uniform_();
      const torch::Tensor g = torch::randn({n}).to(dtype);
      State w;
      w.param = guarded_copy(p.param);
      w.exp_avg = guarded_copy(p.exp_avg);
      w.exp_avg_sq = guarded_copy(p.exp_avg_sq);
      const torch::Tensor wg = guarded_copy(g);
      // One tensor at a time, then the same again in one list below.
      State single = copy_of(p), single_walled = copy_of(w);
      single_walled.param = guarded_copy(p.param);
      single_walled.exp_avg = guarded_copy(p.exp_avg);
      single_walled.exp_avg_sq = guarded_copy(p.exp_avg_sq);
      grid_adamw(single, g, hyper, cpu_grid(1, 3));
      grid_adamw(single_walled, wg, hyper, cpu_grid(1, 3));
      CHECK(same_state(single_walled, single));
      walled.push_back(w);
      plain.push_back(p);
      walled_grads.push_back(wg);
      plain_grads.push_back(g);
    }
  }
  CHECK(grid_adamw_multi(walled, walled_grads, hyper, 1, cpu_grid(2, 5)) ==
        grid_adamw_multi(plain, plain_grads, hyper, 1, cpu_grid(2, 5)));
  for (size_t i = 0; i < walled.size(); ++i) {
    CAPTURE(i);
    CHECK(same_state(walled[i], plain[i]));
  }
  for (float inv : {0.5f, 1.0f}) {  // the unscale reads past the end: a read would find_inf from what lies there
    CAPTURE(inv);
    std::vector<torch::Tensor> grads = clones(plain_grads), guarded;
    for (const torch::Tensor& g : plain_grads) guarded.push_back(guarded_copy(g));
    torch::Tensor found = torch::zeros({1}), found_guarded = torch::zeros({1});
    grid_unscale(grads, found, inv, cpu_grid(2, 7));
    grid_unscale(guarded, found_guarded, inv, cpu_grid(2, 7));
    CHECK(found_guarded.item<float>() == 0.0f);
    for (size_t i = 0; i < grads.size(); ++i) CHECK(torch::equal(guarded[i], grads[i]));
  }
}

TEST_CASE("[step6] CPU grid multi-tensor: sizes at and around multiples of the chunk, every chunk updated once") {
  // A kernel that takes the last chunk's length as numel % kChunkElements leaves the last chunk of an exact multiple
  // alone; one that does not clip it to the tensor updates the next tensor's first elements too (the views touch).
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  const int64_t chunk = fusion::cuda::kChunkElements;
  // The first six keep every view aligned to a pack (packs of 4 run); the last two put the views after them mid-pack
  // (one element at a time).
  const std::vector<int64_t> aligned = {chunk - 4, chunk, chunk + 4, 2 * chunk - 4, 2 * chunk, 2 * chunk + 4};
  std::vector<int64_t> mixed = aligned;
  mixed.insert(mixed.end(), {chunk - 1, chunk + 1, 7});
  for (const std::vector<int64_t>& sizes : {aligned, mixed}) {
    int64_t total = 0;
    for (int64_t n : sizes) total += n;
    for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
      CAPTURE(dtype_name(dtype));
      torch::manual_seed(65);
      // Views of four flat buffers, one after the other (each tensor's first element follows the last of the one
      // before), one guard element after each buffer.
      const torch::Tensor p_buffer = torch::randn({total + 1}).to(dtype),
                          g_buffer = torch::randn({total + 1}).to(dtype);
      const torch::Tensor m_buffer = torch::randn({total + 1}), v_buffer = torch::rand({total + 1});
      std::vector<State> views, separate;
      std::vector<torch::Tensor> view_grads, separate_grads;
      int64_t at = 0;
      for (int64_t n : sizes) {
        State s;
        s.param = p_buffer.narrow(0, at, n);
        s.exp_avg = m_buffer.narrow(0, at, n);
        s.exp_avg_sq = v_buffer.narrow(0, at, n);
        view_grads.push_back(g_buffer.narrow(0, at, n));
        separate.push_back(copy_of(s));
        separate_grads.push_back(view_grads.back().clone());
        views.push_back(s);
        at += n;
      }
      const torch::Tensor guards[] = {p_buffer[total].clone(), m_buffer[total].clone(), v_buffer[total].clone()};
      CHECK(grid_adamw_multi(views, view_grads, hyper, 1, cpu_grid(2, 11)) == 1);  // 11 or 16 chunks: one launch
      for (size_t i = 0; i < sizes.size(); ++i) {
        CAPTURE(sizes[i]);
        grid_adamw(separate[i], separate_grads[i], hyper, cpu_grid(1, 13));  // launch_adamw's bits, tensor by tensor
        CHECK(same_state(views[i], separate[i]));
      }
      // The unscale, the same walk over the same gradients' views.
      std::vector<torch::Tensor> unscaled = clones(separate_grads);
      torch::Tensor found = torch::zeros({1});
      CHECK(grid_unscale(view_grads, found, 0.25f, cpu_grid(2, 15)) == 1);
      for (size_t i = 0; i < sizes.size(); ++i) {
        CAPTURE(sizes[i]);
        CHECK(torch::equal(view_grads[i], (unscaled[i].to(torch::kFloat) * 0.25f).to(dtype)));
      }
      CHECK(found.item<float>() == 0.0f);
      CHECK(torch::equal(p_buffer[total], guards[0]));
      CHECK(torch::equal(m_buffer[total], guards[1]));
      CHECK(torch::equal(v_buffer[total], guards[2]));
    }
  }
}

TEST_CASE("[step6] CPU grid: each operand alone starting mid-pack, in every position of a launch, is taken whole") {
  // A packed load from a pointer that is not aligned to its pack stops the grid ("misaligned address", as a GPU
  // would): every pointer must be looked at, not only the parameter's, and in every tensor of a launch.
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  const char* names[4] = {"param", "grad", "exp_avg", "exp_avg_sq"};
  // Tuple `k` of `count` float32 tuples of `n` elements, operand `which` (0-3) one element into its buffer; the
  // others aligned. The buffers are kept in `keep`.
  const auto tuples = [](int64_t count, int64_t n, int64_t k, int which, std::vector<torch::Tensor>& keep,
                         std::vector<torch::Tensor>& grads) {
    std::vector<State> states;
    for (int64_t t = 0; t < count; ++t) {
      torch::manual_seed(t + 70);
      const int64_t offset[4] = {0, 0, 0, 0};
      torch::Tensor views[4];
      const torch::Tensor values[4] = {torch::randn({n}), torch::randn({n}), torch::randn({n}) * 0.1, torch::rand({n})};
      for (int o = 0; o < 4; ++o) {
        keep.emplace_back();
        views[o] = view_in_buffer(values[o], (t == k && o == which) ? 1 : offset[o], keep.back());
      }
      State s;
      s.param = views[0];
      s.exp_avg = views[2];
      s.exp_avg_sq = views[3];
      states.push_back(s);
      grads.push_back(views[1]);
    }
    return states;
  };
  for (int which = 0; which < 4; ++which) {
    CAPTURE(names[which]);
    {  // launch_adamw
      std::vector<torch::Tensor> keep, grads;
      std::vector<State> one = tuples(1, 4096 + 8, 0, which, keep, grads);
      State aligned = copy_of(one[0]);
      grid_adamw(one[0], grads[0], hyper, cpu_grid(1, 3));
      grid_adamw(aligned, grads[0].clone(), hyper, cpu_grid(1, 3));
      CHECK(same_state(one[0], aligned));
    }
    // 40 tuples: two launches (36 + 4). The odd one first, in the middle and last of the first launch, first of the
    // second.
    for (int64_t k : {0, 17, 35, 36}) {
      CAPTURE(k);
      std::vector<torch::Tensor> keep, grads;
      std::vector<State> multi = tuples(40, 1024, k, which, keep, grads);
      std::vector<State> single;
      for (const State& s : multi) single.push_back(copy_of(s));
      CHECK(grid_adamw_multi(multi, grads, hyper, 1, cpu_grid(2, 5)) == 2);
      for (size_t i = 0; i < multi.size(); ++i) {
        grid_adamw(single[i], grads[i].clone(), hyper, cpu_grid(1, 3));
        CHECK(same_state(multi[i], single[i]));
      }
    }
  }
  {                                        // a gradient mid-pack among aligned ones, in the multi-tensor unscale
    for (int64_t k : {0, 55, 109, 110}) {  // first, middle, last of the first launch; first of the second
      CAPTURE(k);
      std::vector<torch::Tensor> keep(120), grads, expected;
      torch::manual_seed(72);
      for (int64_t t = 0; t < 120; ++t) {
        grads.push_back(view_in_buffer(torch::randn({64}) * 8, t == k ? 1 : 0, keep[t]));
        expected.push_back(grads.back() * 0.5f);
      }
      torch::Tensor found = torch::zeros({1});
      CHECK(grid_unscale(grads, found, 0.5f, cpu_grid(2, 9)) == 2);
      for (size_t t = 0; t < grads.size(); ++t) CHECK(torch::equal(grads[t], expected[t]));
    }
  }
}

TEST_CASE("[step6] CPU grid multi-tensor: the tensors per launch at their limit, and one past it") {
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  const int limit = fusion::cuda::kMaxTensorsPerLaunch;
  for (int count : {limit - 1, limit, limit + 1, 2 * limit, 2 * limit + 1}) {
    CAPTURE(count);
    torch::manual_seed(count);
    std::vector<State> multi, single;
    std::vector<torch::Tensor> grads;
    for (int t = 0; t < count; ++t) {
      multi.push_back(make_state(torch::randn({t % 5 + 1})));  // small: the tensors fill a launch before its blocks
      single.push_back(copy_of(multi.back()));
      grads.push_back(torch::randn({t % 5 + 1}));
    }
    CHECK(grid_adamw_multi(multi, grads, hyper, 1, cpu_grid(1, 2)) == (count + limit - 1) / limit);
    for (int t = 0; t < count; ++t) {
      grid_adamw(single[t], grads[t], hyper, cpu_grid(1, 3));
      CHECK(same_state(multi[t], single[t]));
    }
  }
  const int grads_limit = fusion::cuda::kMaxGradsPerLaunch;
  for (int count : {grads_limit, grads_limit + 1}) {
    CAPTURE(count);
    std::vector<torch::Tensor> grads, expected;
    for (int t = 0; t < count; ++t) {
      grads.push_back(torch::randn({t % 7 + 1}) * 4);
      expected.push_back(grads.back() * 0.25f);
    }
    torch::Tensor found = torch::zeros({1});
    CHECK(grid_unscale(grads, found, 0.25f, cpu_grid(1, 2)) == (count + grads_limit - 1) / grads_limit);
    for (int t = 0; t < count; ++t) CHECK(torch::equal(grads[t], expected[t]));
    CHECK(found.item<float>() == 0.0f);
  }
}

namespace {

// The GPU cases need the kernels in the binary: Bazel builds them where LibTorch has CUDA and nvcc was found.
void require_cuda_kernels() {
  if (!WORKSHOP_CUDA_KERNELS) {
    FAIL(
        "step 6's CUDA kernels are not in this build: Bazel found no nvcc (or no libcudart) when it configured "
        "@libtorch. Install the CUDA toolkit or set NVCC=/path/to/nvcc, then `bazel sync --configure`.");
  }
}

State on_device(const State& s, const torch::Device& device) {
  State out;
  out.param = s.param.to(device, /*non_blocking=*/false, /*copy=*/true);
  out.exp_avg = s.exp_avg.to(device, false, true);
  out.exp_avg_sq = s.exp_avg_sq.to(device, false, true);
  out.step = s.step;
  return out;
}

const torch::Device kCuda(torch::kCUDA, 0);

}  // namespace

GPU_TEST_CASE("[step6] CUDA: the three operators have a CUDA kernel behind their names") {
  require_cuda_kernels();
  for (const char* name : {fusion::kOpName, fusion::kMultiOpName, fusion::kUnscaleOpName}) {
    CAPTURE(name);
    CHECK(c10::Dispatcher::singleton().findSchemaOrThrow(name, "").hasKernelForDispatchKey(c10::DispatchKey::CUDA));
  }
  CHECK(amp::fused_unscale_kernel(c10::DeviceType::CUDA) == fusion::kUnscaleOpName);  // lesson 1 picks it up
}

GPU_TEST_CASE("[step6] CUDA float32: the operator follows torch::optim::AdamW on the GPU for 100 steps") {
  require_cuda_kernels();
  const int64_t n = 100003;  // not a multiple of the pack: the tail runs too
  for (double weight_decay : {0.0, 0.1}) {
    CAPTURE(weight_decay);
    const fusion::AdamWHyper hyper = hyper_with(1e-2, weight_decay);
    torch::manual_seed(3);
    const torch::Tensor start = torch::randn({n}, kCuda);
    torch::Tensor reference = start.clone().requires_grad_(true);
    torch::optim::AdamW optimizer({reference}, fusion::adamw_options(hyper));
    State fused = on_device(make_state(start.cpu()), kCuda);
    double worst = 0;
    for (const torch::Tensor& grad : gradients(n, 100, 1.0)) {
      const torch::Tensor g = grad.to(kCuda);
      reference.mutable_grad() = g.clone();
      optimizer.step();
      fusion::fused_adamw_(fused.param, g, fused.exp_avg, fused.exp_avg_sq, hyper, ++fused.step);
      worst = std::max(worst, rel_error({fused.param.cpu()}, {reference.detach().cpu()}));
    }
    CAPTURE(worst);
    CHECK(worst <= kFloatTolerance);
  }
}

GPU_TEST_CASE("[step6] CUDA: every size and alignment gives the CPU operator's results, in every dtype") {
  require_cuda_kernels();
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t n : {1, 3, 4, 5, 1023, 1025, (1 << 20) + 3}) {
      for (int64_t offset : {0, 1}) {  // offset 1: a view that starts mid-pack, so the one-element path runs
        CAPTURE(dtype_name(dtype));
        CAPTURE(n);
        CAPTURE(offset);
        torch::manual_seed(n);
        const torch::Tensor base = torch::randn({n + offset}).to(dtype);
        State cpu = make_state(base.narrow(0, offset, n).clone());
        State gpu;
        const torch::Tensor gpu_base = base.to(kCuda);
        gpu.param = gpu_base.narrow(0, offset, n);
        const torch::Tensor moments = torch::zeros({2, n + offset}, torch::TensorOptions().device(kCuda));
        gpu.exp_avg = moments[0].narrow(0, offset, n);
        gpu.exp_avg_sq = moments[1].narrow(0, offset, n);
        for (const torch::Tensor& grad32 : gradients(n, 3, 1.0)) {
          const torch::Tensor grad = grad32.to(dtype);
          fusion::fused_adamw_(cpu.param, grad, cpu.exp_avg, cpu.exp_avg_sq, hyper, ++cpu.step);
          const torch::Tensor g = torch::zeros({n + offset}, torch::TensorOptions().dtype(dtype).device(kCuda));
          g.narrow(0, offset, n).copy_(grad);
          fusion::fused_adamw_(gpu.param, g.narrow(0, offset, n), gpu.exp_avg, gpu.exp_avg_sq, hyper, ++gpu.step);
        }
        // float32 arithmetic on both sides; a 16-bit parameter may round the other way where the two float32
        // results straddle a rounding boundary: one unit in the last place.
        const double ulp = dtype == torch::kFloat      ? 0.0
                           : dtype == torch::kBFloat16 ? std::ldexp(1.0, -7)
                                                       : std::ldexp(1.0, -10);
        const torch::Tensor p_cpu = cpu.param.to(torch::kFloat), p_gpu = gpu.param.cpu().to(torch::kFloat);
        CHECK(((p_gpu - p_cpu).abs() <= p_cpu.abs() * ulp + 1e-6 * p_cpu.abs().max()).all().item<bool>());
        // ... and only rarely: a kernel that truncates instead of rounding to nearest differs in about half.
        CHECK(gpu.param.cpu().eq(cpu.param).to(torch::kDouble).mean().item<double>() >= 0.99);
        CHECK(rel_error({gpu.exp_avg.cpu()}, {cpu.exp_avg}) <= 1e-5);
        CHECK(rel_error({gpu.exp_avg_sq.cpu()}, {cpu.exp_avg_sq}) <= 1e-5);
        if (offset == 1) {  // the element before the view: untouched
          CHECK(gpu_base[0].item<float>() == base[0].item<float>());
          CHECK(moments[0][0].item<float>() == 0.0f);
        }
      }
    }
  }
}

GPU_TEST_CASE("[step6] CUDA: the kernels run on the current stream, also when it is not the default one") {
  // A stream from LibTorch's pool does not wait for the default stream, nor the default stream for it. Work is
  // queued on it (a chain of matmuls that keeps the GPU busy, then the gradients written), then the operators are
  // called with it current. A kernel launched on the default stream (a launch with no stream, or stream 0) would
  // start at once and read the zeros still in the gradients: its results would be those of a zero gradient.
  require_cuda_kernels();
  const c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  const c10::Stream side = impl.getStreamFromGlobalPool(kCuda);
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  const int64_t n = (1 << 22) + 3;
  torch::manual_seed(8);
  const torch::Tensor grad_cpu = torch::randn({n});
  const std::vector<torch::Tensor> scaled = scaled_grads(24);
  State cpu = make_state(torch::randn({n}));
  State gpu = on_device(cpu, kCuda);
  const torch::Tensor grad_src = grad_cpu.to(kCuda);
  std::vector<torch::Tensor> scaled_src, scaled_gpu;
  for (const torch::Tensor& g : scaled) {
    scaled_src.push_back(g.to(kCuda));
    scaled_gpu.push_back(torch::zeros_like(scaled_src.back()));
  }
  torch::Tensor grad = torch::zeros({n}, kCuda);
  torch::Tensor busy = torch::randn({2048, 2048}, kCuda);
  torch::Tensor found_inf = torch::zeros({1}, kCuda);
  const torch::Tensor inv_scale = torch::full({1}, 1.0f / 1024, kCuda);
  torch::cuda::synchronize();
  {
    const c10::StreamGuard on_side(side);
    REQUIRE(impl.getStream(kCuda) == side);
    for (int i = 0; i < 30; ++i) busy = torch::mm(busy, busy).div_(64);  // tens of ms of queued work
    grad.copy_(grad_src);
    for (size_t i = 0; i < scaled.size(); ++i) scaled_gpu[i].copy_(scaled_src[i]);
    fusion::fused_adamw_(gpu.param, grad, gpu.exp_avg, gpu.exp_avg_sq, hyper, 1);
    fusion::fused_unscale_(scaled_gpu, found_inf, inv_scale);
  }
  impl.synchronizeStream(side);
  fusion::fused_adamw_(cpu.param, grad_cpu, cpu.exp_avg, cpu.exp_avg_sq, hyper, 1);
  CHECK(rel_error({gpu.exp_avg.cpu()}, {cpu.exp_avg}) <= 1e-5);
  CHECK(rel_error({gpu.exp_avg_sq.cpu()}, {cpu.exp_avg_sq}) <= 1e-5);
  CHECK(rel_error({gpu.param.cpu()}, {cpu.param}) <= 1e-6);
  CHECK(found_inf.item<float>() == 0.0f);
  for (size_t i = 0; i < scaled.size(); ++i) {
    CAPTURE(i);
    CHECK(torch::equal(scaled_gpu[i].cpu(), (scaled[i].to(torch::kFloat) / 1024).to(scaled[i].scalar_type())));
  }
}

GPU_TEST_CASE("[step6] CUDA: the multi-tensor operator gives each tensor what the single one gives it") {
  require_cuda_kernels();
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  std::vector<State> singles;
  for (int64_t n : {40000, 0, 7, 100003}) {
    torch::manual_seed(n + 1);
    State s = on_device(make_state(torch::randn({n})), kCuda);
    singles.push_back(on_device(s, kCuda));
    params.push_back(s.param);
    grads.push_back(torch::randn({n}, kCuda));
    exp_avgs.push_back(s.exp_avg);
    exp_avg_sqs.push_back(s.exp_avg_sq);
  }
  fusion::fused_adamw_multi_(params, grads, exp_avgs, exp_avg_sqs, hyper, 1);
  for (size_t i = 0; i < singles.size(); ++i) {
    CAPTURE(i);
    fusion::fused_adamw_(singles[i].param, grads[i], singles[i].exp_avg, singles[i].exp_avg_sq, hyper, 1);
    CHECK(torch::equal(params[i], singles[i].param));
    CHECK(torch::equal(exp_avgs[i], singles[i].exp_avg));
    CHECK(torch::equal(exp_avg_sqs[i], singles[i].exp_avg_sq));
  }
}

GPU_TEST_CASE("[step6] CUDA: step 3's checks guard the CUDA kernel too") {
  require_cuda_kernels();
  State s = on_device(make_state(torch::randn({64})), kCuda);
  const torch::Tensor g = torch::randn({64}, kCuda);
  const fusion::AdamWHyper h;
  torch::Tensor strided = torch::randn({64, 2}, kCuda).select(1, 0);
  CHECK_THROWS_WITH_AS(fusion::fused_adamw_(strided, g, s.exp_avg, s.exp_avg_sq, h, 1),
                       Contains("param is not contiguous"), c10::Error);
  CHECK_THROWS_WITH_AS(fusion::fused_adamw_(s.param, g.cpu(), s.exp_avg, s.exp_avg_sq, h, 1),
                       Contains("all tensors must be on one device"), c10::Error);
  CHECK_THROWS_WITH_AS(fusion::fused_adamw_(s.param, g, s.exp_avg, s.exp_avg, h, 1),
                       Contains("exp_avg and exp_avg_sq overlap in memory"), c10::Error);
  CHECK(s.exp_avg.abs().sum().item<float>() == 0.0f);  // nothing written
}

GPU_TEST_CASE("[step6] CUDA: tuples on the CPU and on the GPU in one call are refused before anything is written") {
  require_cuda_kernels();
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  for (const torch::Device& device : {kCuda, torch::Device(torch::kCPU)}) {
    params.push_back(torch::randn({1000}, device));
    grads.push_back(torch::randn({1000}, device));
    exp_avgs.push_back(torch::zeros({1000}, device));
    exp_avg_sqs.push_back(torch::zeros({1000}, device));
  }
  const std::vector<torch::Tensor> before = {params[0].clone(), params[1].clone()};
  CHECK_THROWS_WITH_AS(fusion::fused_adamw_multi_(params, grads, exp_avgs, exp_avg_sqs, fusion::AdamWHyper{}, 1),
                       Contains("all tensors must be on one device"), c10::Error);
  CHECK(torch::equal(params[0].cpu(), before[0].cpu()));
  CHECK(torch::equal(params[1], before[1]));
}

GPU_TEST_CASE("[step6] CUDA unscale: the CPU operator's values and flag, and an inf anywhere is found") {
  require_cuda_kernels();
  const std::vector<torch::Tensor> before = scaled_grads(23);
  for (float inv : {1.0f / 1024, 1.0f}) {
    std::vector<torch::Tensor> cpu = clones(before), gpu;
    for (const torch::Tensor& g : before) gpu.push_back(g.to(kCuda));
    torch::Tensor found_cpu = torch::zeros({1}), found_gpu = torch::zeros({1}, kCuda);
    fusion::fused_unscale_(cpu, found_cpu, torch::full({1}, inv));
    fusion::fused_unscale_(gpu, found_gpu, torch::full({1}, inv, kCuda));
    CHECK(found_gpu.item<float>() == 0.0f);
    for (size_t i = 0; i < gpu.size(); ++i) CHECK(torch::equal(gpu[i].cpu(), cpu[i]));
  }
  for (const auto& [t, k] : std::vector<std::pair<size_t, int64_t>>{{0, 0}, {3, 100002}, {4, 32}, {6, 0}}) {
    for (float bad : {INFINITY, NAN}) {
      CAPTURE(t);
      CAPTURE(k);
      std::vector<torch::Tensor> gpu;
      for (const torch::Tensor& g : before) gpu.push_back(g.to(kCuda));
      gpu[t][k] = bad;
      torch::Tensor found = torch::zeros({1}, kCuda);
      fusion::fused_unscale_(gpu, found, torch::full({1}, 0.5f, kCuda));
      CHECK(found.item<float>() == 1.0f);
      CHECK(gpu[0][1].item<float>() == (before[0][1] * 0.5).item<float>());  // the others still unscaled
    }
  }
}

GPU_TEST_CASE("[step6] CUDA: state_step is read and advanced on the GPU; a skipped step does not count") {
  require_cuda_kernels();
  const fusion::AdamWHyper hyper = hyper_with(1e-2, 0.1);
  torch::manual_seed(67);
  State cpu = make_state(torch::randn({100003}));
  State gpu = on_device(cpu, kCuda);
  std::vector<torch::Tensor> cpu_list = {torch::randn({70001}), torch::randn({5}).to(torch::kBFloat16)};
  std::vector<torch::Tensor> gpu_list = {cpu_list[0].to(kCuda), cpu_list[1].to(kCuda)};
  std::vector<torch::Tensor> cpu_m = {torch::zeros({70001}), torch::zeros({5})}, cpu_v = clones(cpu_m);
  std::vector<torch::Tensor> gpu_m = {cpu_m[0].to(kCuda), cpu_m[1].to(kCuda)};
  std::vector<torch::Tensor> gpu_v = {cpu_v[0].to(kCuda), cpu_v[1].to(kCuda)};
  torch::Tensor cpu_step = torch::zeros({1}), cpu_multi_step = torch::zeros({1});
  torch::Tensor gpu_step = torch::zeros({1}, kCuda), gpu_multi_step = torch::zeros({1}, kCuda);
  for (float flag : {0.0f, 1.0f, 0.0f, 1.0f, 0.0f}) {
    CAPTURE(flag);
    const torch::Tensor grad = torch::randn({100003}) * 64;
    const std::vector<torch::Tensor> grads = {torch::randn({70001}) * 64,
                                              (torch::randn({5}) * 64).to(torch::kBFloat16)};
    fusion::fused_adamw_(cpu.param, grad, cpu.exp_avg, cpu.exp_avg_sq, hyper, 0, torch::full({1}, 64.0f),
                         torch::full({1}, flag), cpu_step);
    fusion::fused_adamw_(gpu.param, grad.to(kCuda), gpu.exp_avg, gpu.exp_avg_sq, hyper, 0,
                         torch::full({1}, 64.0f, kCuda), torch::full({1}, flag, kCuda), gpu_step);
    fusion::fused_adamw_multi_(cpu_list, grads, cpu_m, cpu_v, hyper, 0, torch::full({1}, 64.0f), torch::full({1}, flag),
                               cpu_multi_step);
    fusion::fused_adamw_multi_(gpu_list, {grads[0].to(kCuda), grads[1].to(kCuda)}, gpu_m, gpu_v, hyper, 0,
                               torch::full({1}, 64.0f, kCuda), torch::full({1}, flag, kCuda), gpu_multi_step);
    CHECK(gpu_step.item<float>() == cpu_step.item<float>());
    CHECK(gpu_multi_step.item<float>() == cpu_multi_step.item<float>());
    CHECK(rel_error({gpu.param.cpu()}, {cpu.param}) <= 1e-6);
    CHECK(rel_error({gpu_list[0].cpu()}, {cpu_list[0]}) <= 1e-6);
  }
  CHECK(cpu_step.item<float>() == 3.0f);
}

GPU_TEST_CASE("[step6] CUDA unscale: lesson 1's list in a few launches, as ATen's multi-tensor unscale") {
  // 300 small gradients: one launch per 110 on the GPU (the CPU grid checks count them; here the values).
  require_cuda_kernels();
  std::vector<torch::Tensor> cpu, gpu;
  torch::manual_seed(69);
  for (int t = 0; t < 300; ++t) {
    cpu.push_back(torch::randn({t % 13 + 1}) * 1024);
    gpu.push_back(cpu.back().to(kCuda));
  }
  torch::Tensor found_cpu = torch::zeros({1}), found_gpu = torch::zeros({1}, kCuda);
  fusion::fused_unscale_(cpu, found_cpu, torch::full({1}, 1.0f / 1024));
  fusion::fused_unscale_(gpu, found_gpu, torch::full({1}, 1.0f / 1024, kCuda));
  CHECK(found_gpu.item<float>() == 0.0f);
  for (size_t t = 0; t < cpu.size(); ++t) CHECK(torch::equal(gpu[t].cpu(), cpu[t]));
}

}  // namespace adamw_checks
