// Lesson 2's bench case: the same effective batch in K = 1, 4, 16 micro-batches (peak bytes and time), beside
// the same accumulation loop in Python (bench/peer.py "l2").
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "bench/harness.h"
#include "bench/registry.h"
#include "common/memory_meter.h"
#include "common/report.h"
#include "lesson2_accumulation/accumulation.h"

namespace bench {

using workshop::fixed;

void lesson2(Context& c) {
  const int64_t batch = c.quick ? 256 : 1024, width = c.device.is_cuda() ? 4096 : (c.quick ? 256 : 1024);
  const int warmup = 2, repeats = c.quick ? 3 : 10;
  const std::vector<int64_t> ks{1, 4, 16};
  std::cout << "lesson 2: effective batch " << batch << ", MLP width " << width << std::endl;
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(256, width), torch::nn::ReLU(), torch::nn::Linear(width, width),
                              torch::nn::ReLU(), torch::nn::Linear(width, 16));
  model->to(c.device);
  const auto x = torch::randn({batch, 256}, c.device);
  const auto y = torch::randn({batch, 16}, c.device);
  torch::optim::SGD sgd(model->parameters(), 1e-4);
  const accum::LossFn loss = [&](const accum::MicroBatch& mb) {
    return torch::mse_loss(model->forward(mb.input), mb.target);
  };
  double baseline_ms = 0, baseline_bytes = 0;
  std::vector<std::string> k_names;
  for (int64_t k : ks) {
    const auto micro = accum::split_batch(x, y, batch / k);
    accum::AccumulationOptions options;
    options.accumulation_steps = k;
    const auto window = [&] { accum::train_accumulated(sgd, micro, loss, options); };
    window();  // warm-up, allocates .grad
    workshop::MemoryMeter meter(c.device);
    window();
    const double peak = static_cast<double>(meter.peak_bytes());
    const int64_t same_way = bench::same_way_peak_bytes(c.device, window);
    // The ceiling: the largest layer's matmul at this micro-batch ([batch / K, width] x [width, width]), now.
    const std::string ceiling = c.ceilings.matmul(c.device, torch::kFloat, false, batch / k, width, width, repeats);
    const auto t = workshop::time_repeated(c.device, window, warmup, repeats);
    if (k == 1) {
      baseline_ms = t.median_ms;
      baseline_bytes = peak;
    }
    Row row{"lesson 2: accumulation",
            "K=" + std::to_string(k) + " (micro-batch " + std::to_string(batch / k) + ")",
            t,
            6.0 * batch * (256.0 * width + width * width + width * 16.0),
            peak,
            ceiling,
            baseline_ms / t.median_ms,
            "peak " + workshop::mib(peak) + ", " + fixed(baseline_bytes / std::max(peak, 1.0), 2) + "x less than K=1",
            "l2.k" + std::to_string(k),
            same_way};
    c.rows.push_back(row);
    k_names.push_back(std::to_string(k));
  }
  c.peer->run("l2", "batch=" + std::to_string(batch) + ",width=" + std::to_string(width) + ",warmup=" +
                        std::to_string(warmup) + ",repeats=" + std::to_string(repeats) + ",ks=" + join(k_names, "+"));
}

namespace {
const Registered registered(2, Case{"l2", lesson2});
}  // namespace

}  // namespace bench
