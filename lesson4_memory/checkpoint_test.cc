// Checks for lesson 4, steps 2 and 3: a checkpoint function and sequential checkpointing.
// Run: bazel test //lesson4_memory:all --test_arg=--test-case='*step2*'   (or *step3*)
#include "tests/torch_doctest.h"

#include <cmath>

#include <torch/torch.h>

#include "common/memory_meter.h"
#include "lesson1_amp/autocast.h"
#include "lesson4_memory/checkpoint.h"
#include "lesson4_memory/workload.h"
#include "tests/check_helpers.h"

using doctest::Contains;

namespace {

using workshop::test::grads_of;
using workshop::test::max_abs_diff;

// Forward + backward of `model` on `x`, either plainly or through `forward`; returns the parameter gradients
// followed by the input's gradient. The RNG is seeded the same way before each run.
template <typename Forward>
std::vector<torch::Tensor> gradients(torch::nn::Sequential& model, const torch::Tensor& x, Forward forward) {
  for (auto& p : model->parameters()) p.mutable_grad().reset();
  const auto input = x.detach().requires_grad_(true);
  torch::manual_seed(42);
  forward(input).pow(2).mean().backward();
  auto grads = grads_of(model->parameters());
  grads.push_back(input.grad().clone());
  return grads;
}

mem::MlpSpec spec_of(int64_t layers, int64_t width, int64_t batch, double dropout) {
  mem::MlpSpec spec;
  spec.layers = layers;
  spec.width = width;
  spec.batch = batch;
  spec.dropout = dropout;
  return spec;
}

// Peak bytes of one forward + backward over the batch (model, batch and nothing else in the baseline).
int64_t backward_peak(torch::nn::Sequential& model, const torch::Tensor& x, int64_t segments, c10::Device device) {
  for (auto& p : model->parameters()) p.mutable_grad().reset();
  workshop::MemoryMeter meter(device);
  {
    const auto out = segments == 0 ? model->forward(x) : mem::checkpoint_sequential(model, segments, x);
    out.pow(2).mean().backward();
  }
  return meter.peak_bytes();
}

}  // namespace

TEST_CASE("[step2] the RNG state round trip replays the same random numbers") {
  torch::manual_seed(7);
  const mem::RngState state = mem::get_rng_state();
  REQUIRE(state.cpu.defined());
  const auto first = torch::rand({1000});
  const auto moved_on = torch::rand({1000});
  mem::set_rng_state(state);
  const auto replayed = torch::rand({1000});
  CHECK(torch::equal(first, replayed));
  CHECK_FALSE(torch::equal(first, moved_on));
  CHECK_THROWS_WITH_AS(mem::set_rng_state(mem::RngState{}), Contains("CPU"), c10::Error);
}

TEST_CASE("[step2] checkpointed gradients equal plain ones (float32), without and with dropout") {
  for (double dropout : {0.0, 0.3}) {
    CAPTURE(dropout);
    auto model = mem::make_deep_mlp(spec_of(4, 32, 64, dropout), torch::kCPU);
    const auto x = mem::make_batch(spec_of(4, 32, 64, dropout), torch::kCPU).first;
    const auto plain = gradients(model, x, [&](const torch::Tensor& in) { return model->forward(in); });
    const auto checkpointed = gradients(model, x, [&](const torch::Tensor& in) {
      return mem::checkpoint(
          [&](const std::vector<torch::Tensor>& v) { return std::vector<torch::Tensor>{model->forward(v[0])}; }, {in},
          model->parameters())[0];
    });
    const double difference = max_abs_diff(plain, checkpointed);
    CAPTURE(difference);
    CHECK(difference <= 1e-6);
  }
}

TEST_CASE("[step2] backward leaves the random stream where a plain run would leave it") {
  auto model = mem::make_deep_mlp(spec_of(4, 32, 64, 0.5), torch::kCPU);
  const auto x = mem::make_batch(spec_of(4, 32, 64, 0.5), torch::kCPU).first;
  gradients(model, x, [&](const torch::Tensor& in) { return model->forward(in); });
  const auto after_plain = torch::rand({100});
  gradients(model, x, [&](const torch::Tensor& in) {
    return mem::checkpoint(
        [&](const std::vector<torch::Tensor>& v) { return std::vector<torch::Tensor>{model->forward(v[0])}; }, {in},
        model->parameters())[0];
  });
  const auto after_checkpointed = torch::rand({100});
  CHECK(torch::equal(after_plain, after_checkpointed));
}

TEST_CASE("[step2] a checkpointed segment keeps only its input and output until backward") {
  const auto spec = spec_of(8, 64, 256, 0.0);
  auto model = mem::make_deep_mlp(spec, torch::kCPU);
  const auto x = mem::make_batch(spec, torch::kCPU).first.requires_grad_(true);
  const int64_t activation = 256 * 64 * 4;
  workshop::MemoryMeter meter(torch::kCPU);
  auto out = mem::checkpoint(
      [&](const std::vector<torch::Tensor>& v) { return std::vector<torch::Tensor>{model->forward(v[0])}; }, {x},
      model->parameters())[0];
  const int64_t kept = meter.current_bytes();
  CAPTURE(kept);
  CHECK(out.requires_grad());
  CHECK(kept <= activation + 64 * 1024);  // the output, plus the saved RNG state (a few KiB)
  out.sum().backward();
  CHECK(x.grad().defined());
  for (const auto& p : model->parameters()) CHECK(p.grad().defined());
}

TEST_CASE("[step2] while a checkpointed segment runs forward, at most a few of its activations exist") {
  const auto spec = spec_of(8, 64, 256, 0.0);
  auto model = mem::make_deep_mlp(spec, torch::kCPU);
  const auto x = mem::make_batch(spec, torch::kCPU).first.requires_grad_(true);
  const int64_t activation = 256 * 64 * 4;
  auto segment = [&](const std::vector<torch::Tensor>& v) { return std::vector<torch::Tensor>{model->forward(v[0])}; };
  workshop::MemoryMeter meter(torch::kCPU);
  {
    const auto plain = model->forward(x);  // for comparison: the recorded graph keeps 2 activations per layer
    CAPTURE(meter.peak_bytes());
    REQUIRE(meter.peak_bytes() >= 16 * activation);
  }
  meter.reset();
  const auto out = mem::checkpoint(segment, {x}, model->parameters())[0];
  const int64_t peak = meter.peak_bytes();
  CAPTURE(peak);
  CHECK(peak <= 4 * activation + 64 * 1024);  // a layer's input, its two results, the output; the RNG state
}

TEST_CASE("[step2] under autocast, the recomputation runs in the forward's precision (gradients match plain)") {
  auto model = mem::make_deep_mlp(spec_of(4, 32, 64, 0.0), torch::kCPU);
  const auto x = mem::make_batch(spec_of(4, 32, 64, 0.0), torch::kCPU).first;
  const auto plain = gradients(model, x, [&](const torch::Tensor& in) {
    amp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    return model->forward(in);
  });
  const auto checkpointed = gradients(model, x, [&](const torch::Tensor& in) {
    amp::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    return mem::checkpoint(
        [&](const std::vector<torch::Tensor>& v) { return std::vector<torch::Tensor>{model->forward(v[0])}; }, {in},
        model->parameters())[0];
  });
  const double difference = max_abs_diff(plain, checkpointed);
  CAPTURE(difference);
  CHECK(difference <= 1e-6);  // a float32 recomputation would differ by bfloat16's rounding, ~1e-3
}

TEST_CASE("[step2] backward through a segment whose recomputed output does not require grad is an error") {
  const auto x = torch::ones({3}, torch::requires_grad());
  auto detached = [](const std::vector<torch::Tensor>& v) { return std::vector<torch::Tensor>{v[0].detach() * 2}; };
  const auto out = mem::checkpoint(detached, {x})[0];
  REQUIRE(out.requires_grad());  // the checkpoint's output is connected; the recomputed one will not be
  CHECK_THROWS_WITH(out.sum().backward(), Contains("no recomputed output requires grad"));
}

TEST_CASE("[step2] the random stream is put back also when the recomputation throws") {
  int calls = 0;
  auto noisy = [&](const std::vector<torch::Tensor>& v) {
    // Fails as soon as it is recomputed, before drawing: the stream is then at the forward's starting state,
    // which differs from where the forward left it.
    TORCH_CHECK(++calls < 2, "the recomputation failed");
    return std::vector<torch::Tensor>{v[0] * torch::rand_like(v[0])};
  };
  torch::manual_seed(3);
  const auto x = torch::ones({8}, torch::requires_grad());
  const auto out = mem::checkpoint(noisy, {x})[0];
  const mem::RngState before = mem::get_rng_state();
  const auto expected = torch::rand({100});  // what the stream gives next if backward leaves it alone
  mem::set_rng_state(before);
  CHECK_THROWS_WITH(out.sum().backward(), Contains("the recomputation failed"));
  CHECK(torch::equal(torch::rand({100}), expected));
}

TEST_CASE("[step2] bad input: empty segment, no inputs, nothing that requires grad") {
  auto identity = [](const std::vector<torch::Tensor>& v) { return std::vector<torch::Tensor>{v[0] * 2}; };
  const auto x = torch::ones({3});
  CHECK_THROWS_WITH_AS(mem::checkpoint(mem::Segment(), {x}), Contains("segment is empty"), c10::Error);
  CHECK_THROWS_WITH_AS(mem::checkpoint(identity, {}), Contains("no inputs"), c10::Error);
  CHECK_THROWS_WITH_AS(mem::checkpoint(identity, {x}), Contains("requires grad"), c10::Error);
  torch::NoGradGuard no_grad;  // evaluation: nothing needs a gradient, and that is fine
  CHECK(torch::equal(mem::checkpoint(identity, {x})[0], x * 2));
}

TEST_CASE("[step3] checkpoint_sequential gradients equal plain ones for 1, 2, 3 and 8 segments, with dropout") {
  const auto spec = spec_of(8, 32, 64, 0.2);
  auto model = mem::make_deep_mlp(spec, torch::kCPU);
  const auto x = mem::make_batch(spec, torch::kCPU).first;
  const auto plain = gradients(model, x, [&](const torch::Tensor& in) { return model->forward(in); });
  for (int64_t segments : {1, 2, 3, 8}) {
    CAPTURE(segments);
    const auto checkpointed =
        gradients(model, x, [&](const torch::Tensor& in) { return mem::checkpoint_sequential(model, segments, in); });
    const double difference = max_abs_diff(plain, checkpointed);
    CAPTURE(difference);
    CHECK(difference <= 1e-6);
  }
}

TEST_CASE(
    "[step3] after a backward over several checkpointed segments with dropout, the random stream is where a plain run leaves it") {
  auto model = mem::make_deep_mlp(spec_of(6, 32, 64, 0.5), torch::kCPU);
  const auto x = mem::make_batch(spec_of(6, 32, 64, 0.5), torch::kCPU).first;
  gradients(model, x, [&](const torch::Tensor& in) { return model->forward(in); });
  const auto after_plain = torch::rand({100});
  gradients(model, x, [&](const torch::Tensor& in) { return mem::checkpoint_sequential(model, 3, in); });
  const auto after_checkpointed = torch::rand({100});
  CHECK(torch::equal(after_plain, after_checkpointed));
}

TEST_CASE("[step3] 7 layers in 3 segments are grouped 3+2+2; every layer but the last segment's runs twice") {
  std::vector<int> calls(7, 0);
  torch::nn::Sequential model;
  for (int i = 0; i < 7; ++i) {
    model->push_back(torch::nn::Functional([&calls, i](const torch::Tensor& t) {
      ++calls[i];
      return t * 1.5;
    }));
  }
  const auto x = torch::ones({2, 3}, torch::requires_grad());
  mem::checkpoint_sequential(model, 3, x).sum().backward();
  CHECK(calls == std::vector<int>{2, 2, 2, 2, 2, 1, 1});  // forward + recomputation, except the plain last segment
  CHECK(torch::allclose(x.grad(), torch::full({2, 3}, std::pow(1.5, 7))));
  std::fill(calls.begin(), calls.end(), 0);
  x.mutable_grad().reset();
  mem::checkpoint_sequential(model, 1, x).sum().backward();  // one segment: the plain forward
  CHECK(calls == std::vector<int>(7, 1));
}

TEST_CASE("[step3] the first segment's parameters get gradients although the data does not require grad") {
  const auto spec = spec_of(4, 16, 8, 0.0);
  auto model = mem::make_deep_mlp(spec, torch::kCPU);
  const auto x = mem::make_batch(spec, torch::kCPU).first;
  REQUIRE_FALSE(x.requires_grad());
  mem::checkpoint_sequential(model, 4, x).sum().backward();
  for (const auto& p : model->parameters()) CHECK(p.grad().defined());
}

TEST_CASE("[step3] for a 32-layer MLP the peak bytes of plain / checkpointed backward is >= 3") {
  const auto spec = spec_of(32, 64, 1024, 0.0);
  auto model = mem::make_deep_mlp(spec, torch::kCPU);
  const auto x = mem::make_batch(spec, torch::kCPU).first;
  const int64_t plain = backward_peak(model, x, 0, torch::kCPU);
  const int64_t checkpointed = backward_peak(model, x, 6, torch::kCPU);  // about sqrt(32) segments
  const double ratio = static_cast<double>(plain) / static_cast<double>(checkpointed);
  CAPTURE(plain);
  CAPTURE(checkpointed);
  CAPTURE(ratio);
  MESSAGE("32-layer MLP, CPU counted bytes: plain ", plain, ", 6 segments ", checkpointed, ", ratio ", ratio);
  CHECK(plain >= 64 * 1024 * 64 * 4);  // two [1024, 64] float32 activations per layer
  CHECK(ratio >= 3.0);
}

TEST_CASE("[step3] bad input: zero segments, more segments than layers") {
  auto model = mem::make_deep_mlp(spec_of(4, 8, 2, 0.0), torch::kCPU);
  const auto x = torch::ones({2, 8});
  CHECK_THROWS_WITH_AS(mem::checkpoint_sequential(model, 0, x), Contains("segments must be >= 1"), c10::Error);
  CHECK_THROWS_WITH_AS(mem::checkpoint_sequential(model, 5, x), Contains("more segments"), c10::Error);
  torch::nn::Sequential empty;
  CHECK_THROWS_WITH_AS(mem::checkpoint_sequential(empty, 1, x), Contains("no layers"), c10::Error);
}

GPU_TEST_CASE("[step3] on CUDA checkpointed gradients match and the peak ratio holds (caching-allocator stats)") {
  const torch::Device cuda(torch::kCUDA, 0);
  const auto spec = spec_of(32, 64, 1024, 0.1);
  auto model = mem::make_deep_mlp(spec, cuda);
  const auto x = mem::make_batch(spec, cuda).first;
  const auto plain = gradients(model, x, [&](const torch::Tensor& in) { return model->forward(in); });
  const auto checkpointed =
      gradients(model, x, [&](const torch::Tensor& in) { return mem::checkpoint_sequential(model, 6, in); });
  const double difference = max_abs_diff(plain, checkpointed);
  CAPTURE(difference);
  CHECK(difference <= 1e-5);  // same kernels, but cuBLAS may pick another algorithm for the recomputation
  const int64_t plain_peak = backward_peak(model, x, 0, cuda);
  const int64_t checkpointed_peak = backward_peak(model, x, 6, cuda);
  const double ratio = static_cast<double>(plain_peak) / static_cast<double>(checkpointed_peak);
  CAPTURE(plain_peak);
  CAPTURE(checkpointed_peak);
  MESSAGE("32-layer MLP, CUDA allocator: plain ", plain_peak, ", 6 segments ", checkpointed_peak, ", ratio ", ratio);
  CHECK(ratio >= 2.5);  // the CUDA allocator rounds blocks up (512-byte granularity) and cuBLAS keeps workspace
}
