// Lesson 1 demo: what mixed precision buys and what the gradient scaler saves.
//
//   bazel run //lesson1_amp:demo -- [--device=best|cpu|cuda] [--quick] [--steps=N] [--csv_dir=DIR]
//
// Part A trains the lesson's MLP in float32 and with AMP (autocast; on CUDA float16 + GradScaler, on CPU
// bfloat16, which needs no scaler) side by side on one device: median step time (synchronised), peak bytes of
// tensor storage during a step, final loss. Part B trains a model whose float16 gradients underflow, without
// and with the scaler, and records the loss and the scale at every step, plus a histogram of its gradient
// magnitudes against float16's underflow line. Tables are printed and, with --csv_dir, written as CSV.
#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/demo.h"
#include "common/device.h"
#include "common/memory_meter.h"
#include "common/report.h"
#include "lesson1_amp/autocast.h"
#include "lesson1_amp/grad_scaler.h"
#include "lesson1_amp/underflow_model.h"

namespace {

using amp::examples::UnderflowModel;

using workshop::fixed;

// [mlp]
// The lesson's model: `depth` Linear+ReLU blocks of `width` features and a linear head. Big widths and
// batches make it matmul-bound, which is where 16-bit tensor cores pay off.
torch::nn::Sequential make_mlp(int64_t width, int64_t depth) {
  torch::nn::Sequential model;
  for (int64_t i = 0; i < depth; ++i) {
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::ReLU());
  }
  model->push_back(torch::nn::Linear(width, 1));
  return model;
}
// [mlp]

struct SpeedResult {
  workshop::Timing timing;
  int64_t peak_bytes;
  double final_loss;
};

SpeedResult run_speed(torch::Device device, bool use_amp, int64_t width, int64_t depth, int64_t batch, int steps) {
  torch::manual_seed(0);
  auto model = make_mlp(width, depth);
  model->to(device);
  const auto x = torch::randn({batch, width}, device);
  const auto y = x.narrow(1, 0, 8).sum(1, true).sin();  // [batch, 1], a smooth target
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(1e-3).momentum(0.9));

  const bool on_cuda = device.is_cuda();
  amp::GradScalerOptions scaler_options;
  scaler_options.enabled = use_amp && on_cuda;  // bfloat16 (CPU) keeps float32's range: no scaling needed
  amp::GradScaler scaler(scaler_options);
  amp::StepOptions options;
  options.device = device.type();
  options.dtype = amp::AutocastGuard::default_dtype(device.type());
  options.autocast = use_amp;

  // [amp_step]
  auto step = [&] {
    return amp::train_step(
        sgd, scaler, [&] { return torch::mse_loss(model->forward(x).to(torch::kFloat), y); }, options);
  };
  // [amp_step]

  SpeedResult result{};
  step();  // first step allocates the optimizer state: not part of the per-step peak
  workshop::MemoryMeter meter(device);
  step();
  result.peak_bytes = meter.peak_bytes();
  result.timing = workshop::time_repeated(
      device, [&] { step(); }, 2, steps);
  result.final_loss = step().loss.item<double>();
  return result;
}

// The float32 gradient that reaches the float16 multiply, before it is cast (d loss / d pred), by binade,
// unscaled and scaled by 65536; and the fraction of it that float16 flushes to zero.
void gradient_histogram(const torch::Device& device, const std::string& csv_dir) {
  UnderflowModel probe(device);
  auto pred = (probe.x * probe.w).detach().requires_grad_(true);
  (UnderflowModel::kLossWeight * torch::mse_loss(pred, probe.y)).backward();
  const auto magnitude = pred.grad().abs();
  const double scale = 65536.0;
  workshop::Table histogram("lesson1_grad_histogram",
                            {"log2 magnitude", "gradients (unscaled)", "gradients (x 65536)"});
  const auto bucket = magnitude.log2().floor().to(torch::kLong);
  const auto bucket_scaled = (magnitude * scale).log2().floor().to(torch::kLong);
  for (int64_t b = -40; b <= 0; ++b) {
    const int64_t plain = bucket.eq(b).sum().item<int64_t>();
    const int64_t scaled = bucket_scaled.eq(b).sum().item<int64_t>();
    if (plain || scaled) histogram.add({std::to_string(b), std::to_string(plain), std::to_string(scaled)});
  }
  histogram.emit(csv_dir);
  std::cout << "float16 flushes magnitudes below 2^-25 to zero (smallest subnormal 2^-24); underflow fraction: "
            << fixed(amp::underflow_fraction(pred.grad()), 4) << " unscaled, "
            << fixed(amp::underflow_fraction(pred.grad() * scale), 4) << " scaled by 65536\n";
}

int run(const workshop::Demo& demo) {
  const workshop::Flags& flags = demo.flags;
  const torch::Device device = demo.device;
  const bool quick = demo.quick;
  const bool cuda = device.is_cuda();
  const int64_t width = flags.get_int("width", cuda ? 4096 : (quick ? 256 : 1024));
  const int64_t depth = flags.get_int("depth", cuda ? 8 : 4);
  const int64_t batch = flags.get_int("batch", cuda ? 8192 : (quick ? 128 : 512));
  const int steps = static_cast<int>(flags.get_int("steps", quick ? 8 : 20));
  const int underflow_steps = static_cast<int>(flags.get_int("underflow_steps", 300));
  const std::string& csv_dir = demo.csv_dir;
  TORCH_CHECK(width > 0 && depth > 0 && batch > 0 && steps > 0 && underflow_steps > 0,
              "--width, --depth, --batch, --steps and --underflow_steps must be > 0");
  const std::string name = workshop::device_name(device);
  const std::string amp_label = cuda ? "AMP float16 + GradScaler" : "AMP bfloat16 (no scaler needed)";

  std::cout << "Lesson 1 — mixed precision on " << device << " (" << name << "), LibTorch " << TORCH_VERSION
            << "\nPart A: MLP " << depth << " x " << width << ", batch " << batch << ", median of " << steps
            << " synchronised steps\n";

  // ---- Part A: speed and memory, side by side -------------------------------------------------------
  const SpeedResult fp32 = run_speed(device, false, width, depth, batch, steps);
  const SpeedResult mixed = run_speed(device, true, width, depth, batch, steps);
  const double flops = 6.0 * batch * (depth * width * width + width);  // forward 2x, backward 4x per MAC
  workshop::Table speed("lesson1_speed",
                        {"mode", "median ms", "min ms", "max ms", "TFLOP/s", "peak MiB/step", "final loss", "device"});
  for (const auto& entry : {std::make_pair(std::string("float32"), fp32), std::make_pair(amp_label, mixed)}) {
    const SpeedResult& r = entry.second;
    speed.add({entry.first, fixed(r.timing.median_ms, 3), fixed(r.timing.min_ms, 3), fixed(r.timing.max_ms, 3),
               fixed(flops / (r.timing.median_ms * 1e-3) / 1e12, 3), fixed(r.peak_bytes / 1048576.0, 2),
               fixed(r.final_loss, 5), name});
  }
  speed.emit(csv_dir);
  std::cout << "speed-up " << fixed(fp32.timing.median_ms / mixed.timing.median_ms, 2) << "x, peak memory "
            << fixed(static_cast<double>(fp32.peak_bytes) / std::max<int64_t>(mixed.peak_bytes, 1), 2)
            << "x lower with AMP\n";

  // ---- Part B: underflow, without and with the scaler -----------------------------------------------
  std::cout << "\nPart B: a model whose float16 gradients underflow (Adam, " << underflow_steps << " steps)\n";
  gradient_histogram(device, csv_dir);

  const std::vector<std::string> trace_columns{"step", "loss without scaler", "loss with scaler", "scale used",
                                               "stepped"};
  workshop::Table trace("lesson1_underflow", trace_columns);
  UnderflowModel plain(device), scaled(device);
  torch::optim::Adam adam_plain({plain.w}, torch::optim::AdamOptions(0.1));
  torch::optim::Adam adam_scaled({scaled.w}, torch::optim::AdamOptions(0.1));
  amp::GradScalerOptions off;
  off.enabled = false;
  amp::GradScaler no_scaler(off);
  amp::GradScalerOptions growing;  // grows fast so that the run shows growth and overflow back-offs
  growing.growth_interval = 5;
  amp::GradScaler scaler(growing);
  amp::StepOptions manual_casts;
  manual_casts.autocast = false;
  int skipped = 0;
  double zero_without = 0, zero_with = 0;
  for (int i = 0; i < underflow_steps; ++i) {
    amp::train_step(
        adam_plain, no_scaler, [&] { return plain.loss(); }, manual_casts);
    const double scale_used = scaler.get_scale();
    const bool stepped = amp::train_step(
                             adam_scaled, scaler, [&] { return scaled.loss(); }, manual_casts)
                             .stepped;
    if (i == 0) {
      zero_without = plain.w.grad().eq(0).to(torch::kFloat).mean().item<double>();
      zero_with = scaled.w.grad().eq(0).to(torch::kFloat).mean().item<double>();
    }
    skipped += stepped ? 0 : 1;
    trace.add({std::to_string(i), fixed(plain.true_loss(), 6), fixed(scaled.true_loss(), 6), fixed(scale_used, 0),
               stepped ? "1" : "0"});
  }
  trace.emit(csv_dir, /*print=*/false);
  workshop::Table excerpt("lesson1_underflow (every 25th step; all steps in the CSV)", trace_columns);
  for (size_t i = 0; i < trace.rows().size(); i += 25) excerpt.add(trace.rows()[i]);
  excerpt.emit("");
  workshop::Table underflow("lesson1_underflow_summary", {"run", "zero grads (step 1)", "initial loss", "final loss",
                                                          "skipped steps", "final scale"});
  const double initial = UnderflowModel(device).true_loss();
  underflow.add(
      {"float16, no scaler", fixed(zero_without, 4), fixed(initial, 5), fixed(plain.true_loss(), 5), "0", "1"});
  underflow.add({"float16 + GradScaler", fixed(zero_with, 4), fixed(initial, 5), fixed(scaled.true_loss(), 5),
                 std::to_string(skipped), fixed(scaler.get_scale(), 0)});
  underflow.emit(csv_dir);

  workshop::append_summary(csv_dir, {
                                        {"1 mixed precision", "step time (ms), float32 vs " + amp_label,
                                         fp32.timing.median_ms, mixed.timing.median_ms, name},
                                        {"1 mixed precision", "peak MiB per step", fp32.peak_bytes / 1048576.0,
                                         mixed.peak_bytes / 1048576.0, name},
                                        {"1 mixed precision", "tiny-gradient model loss, no scaler vs scaler",
                                         plain.true_loss(), scaled.true_loss(), name},
                                    });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return workshop::demo_main(argc, argv,
                             workshop::DemoOptions(
                                 "Lesson 1 demo: mixed precision's speed and memory (part A) and the gradient scaler "
                                 "against float16 underflow (part B).")
                                 .flags({{"steps", "timed steps per mode (default 20, quick 8)"},
                                         {"underflow_steps", "training steps of part B (default 300)"},
                                         {"width", "MLP width (default: 4096 on CUDA, 1024 on CPU, 256 quick)"},
                                         {"depth", "MLP depth (default 8 on CUDA, 4 on CPU)"},
                                         {"batch", "batch size (default: 8192 on CUDA, 512 on CPU, 128 quick)"}}),
                             run);
}
