// Lesson 1's bench case: one training step of an MLP in float32, TF32 (CUDA), autocast bfloat16 and autocast
// float16 + GradScaler (where this LibTorch runs float16 autocast), beside torch.autocast (bench/peer.py "l1").
#include <iostream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "bench/harness.h"
#include "bench/registry.h"
#include "common/memory_meter.h"
#include "common/report.h"
#include "lesson1_amp/autocast.h"
#include "lesson1_amp/grad_scaler.h"

namespace bench {

using workshop::fixed;

void lesson1(Context& c) {
  const bool cuda = c.device.is_cuda();
  const int64_t width = cuda ? 8192 : (c.quick ? 256 : 1024), depth = 4, batch = cuda ? 16384 : (c.quick ? 128 : 512);
  const int warmup = 3, repeats = c.quick ? 5 : 15;
  std::cout << "lesson 1: MLP " << depth << " x " << width << ", batch " << batch << std::endl;
  struct Variant {
    std::string key;  // peer.py's name for it
    std::string name;
    bool autocast;
    torch::ScalarType dtype;
    bool tf32;
  };
  std::vector<Variant> variants{{"fp32", "float32", false, torch::kFloat, false}};
  if (cuda) variants.push_back({"tf32", "TF32 matmuls", false, torch::kFloat, true});
  variants.push_back({"bf16", "autocast bfloat16", true, torch::kBFloat16, false});
  if (fp16_autocast(c.device)) variants.push_back({"fp16", "autocast float16 + GradScaler", true, torch::kHalf, false});
  const double flops = 6.0 * batch * depth * width * width;  // forward 2, backward 4 FLOPs per weight per item
  double baseline_ms = 0;
  std::vector<std::string> keys;
  for (const auto& v : variants) {
    torch::manual_seed(0);
    torch::nn::Sequential model;
    for (int64_t i = 0; i < depth; ++i) {
      model->push_back(torch::nn::Linear(width, width));
      model->push_back(torch::nn::ReLU());
    }
    model->to(c.device);
    const auto x = torch::randn({batch, width}, c.device);
    const auto y = torch::randn({batch, width}, c.device);
    torch::optim::SGD sgd(model->parameters(), 1e-4);
    amp::GradScalerOptions so;
    so.enabled = v.autocast && v.dtype == torch::kHalf;
    amp::GradScaler scaler(so);
    amp::StepOptions options;
    options.device = c.device.type();
    options.dtype = v.dtype;
    options.autocast = v.autocast;
    const auto step = [&] {
      amp::train_step(
          sgd, scaler, [&] { return torch::mse_loss(model->forward(x).to(torch::kFloat), y); }, options);
    };
    // The ceiling: this variant's layer matmul ([batch, width] x [width, width], its dtype), measured now.
    const std::string ceiling = c.ceilings.matmul(c.device, v.dtype, v.tf32, batch, width, width, repeats);
    set_tf32(v.tf32);
    const auto t = workshop::time_repeated(c.device, step, warmup, repeats);
    workshop::MemoryMeter meter(c.device);
    step();
    const double peak = static_cast<double>(meter.peak_bytes());
    const int64_t same_way = bench::same_way_peak_bytes(c.device, step);
    set_tf32(false);
    if (baseline_ms == 0) baseline_ms = t.median_ms;
    Row row{"lesson 1: training step",     v.name,        t,       flops, peak, ceiling, baseline_ms / t.median_ms,
            "peak " + workshop::mib(peak), "l1." + v.key, same_way};
    c.rows.push_back(row);
    keys.push_back(v.key);
  }
  c.peer->run("l1", "width=" + std::to_string(width) + ",depth=" + std::to_string(depth) +
                        ",batch=" + std::to_string(batch) + ",warmup=" + std::to_string(warmup) +
                        ",repeats=" + std::to_string(repeats) + ",variants=" + join(keys, "+"));
}

namespace {
const Registered registered(1, Case{"l1", lesson1});
}  // namespace

}  // namespace bench
