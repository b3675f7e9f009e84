// Lesson 2 demo: one effective batch, split into K = 1, 2, 4, 8, 16 micro-batches. For each K: the peak
// bytes of one accumulated step, its time (median, synchronised), and how far its gradients are from the
// full batch's. Memory follows the micro-batch; the gradients do not move.
//
//   bazel run //lesson2_accumulation:demo -- --quick                      (reference solution)
//   bazel run //lesson2_accumulation:my_demo -- --quick                   (your accumulation.cc)
//   bazel run //lesson2_accumulation:demo -- --csv_dir=/tmp/out --device=cuda
#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include "common/demo.h"
#include "common/device.h"
#include "common/memory_meter.h"
#include "common/report.h"
#include "lesson2_accumulation/accumulation.h"

namespace {

std::vector<at::Tensor> gradients(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.grad().detach().clone());
  return out;
}

std::string scientific(double value) {
  std::ostringstream out;
  out << std::scientific << std::setprecision(2) << value;
  return out.str();
}

int run(const workshop::Demo& demo) {
  const workshop::Flags& flags = demo.flags;
  const bool quick = demo.quick;
  const c10::Device device = demo.device;
  const int64_t batch = flags.get_int("batch", quick ? 256 : 1024);
  const int repeats = static_cast<int>(flags.get_int("repeats", quick ? 3 : 10));
  const int64_t width = quick ? 512 : 2048;
  const std::string& csv_dir = demo.csv_dir;
  TORCH_CHECK(batch >= 16 && batch % 16 == 0, "--batch must be a positive multiple of 16, got ", batch);

  // [demo_model]
  // An MLP whose activations grow with the batch: [batch, 256] -> width -> width -> 16. No BatchNorm, no
  // dropout: accumulated and full-batch gradients can then agree to float32 rounding.
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(256, width), torch::nn::ReLU(), torch::nn::Linear(width, width),
                              torch::nn::ReLU(), torch::nn::Linear(width, 16));
  model->to(device);
  const at::Tensor x = at::randn({batch, 256}).to(device);  // [batch, 256]
  const at::Tensor y = at::randn({batch, 16}).to(device);   // [batch, 16]
  const accum::LossFn loss_fn = [&](const accum::MicroBatch& mb) {
    return torch::nn::functional::mse_loss(model->forward(mb.input), mb.target);
  };
  // lr = 0: the step's arithmetic runs, but every row sees the same parameters, so gradients compare.
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.0));
  // [demo_model]

  std::cout << "Lesson 2 — gradient accumulation on " << workshop::device_name(device) << "\n"
            << "effective batch " << batch << " items, MLP 256-" << width << "-" << width << "-16, float32, " << repeats
            << " timed repeats per row\n\n";

  auto run = [&](int64_t k) {
    accum::AccumulationOptions options;
    options.accumulation_steps = k;
    accum::train_accumulated(sgd, accum::split_batch(x, y, batch / k), loss_fn, options);
  };

  run(1);  // warm-up; gradients exist from here on
  workshop::synchronize(device);
  const std::vector<at::Tensor> full = gradients(model->parameters());

  workshop::Table table("lesson2_accumulation",
                        {"K", "micro-batch", "peak bytes", "peak MiB", "peak vs K=1", "step ms (median)",
                         "max |grad diff|", "max |grad diff| / max |grad|"});
  double peak_k1 = 0, peak_k16 = 0, ms_k1 = 0, ms_k16 = 0;
  for (int64_t k : {1, 2, 4, 8, 16}) {
    // [demo_measure]
    workshop::MemoryMeter meter(device);
    run(k);  // one accumulated step: K forward+backward passes of batch/K items, one optimizer step
    workshop::synchronize(device);
    const double peak = static_cast<double>(meter.peak_bytes());
    double max_diff = 0, max_ref = 0;
    const std::vector<at::Tensor> accumulated = gradients(model->parameters());
    for (size_t i = 0; i < full.size(); ++i) {
      max_diff = std::max(max_diff, (accumulated[i] - full[i]).abs().max().item<double>());
      max_ref = std::max(max_ref, full[i].abs().max().item<double>());
    }
    const workshop::Timing timing = workshop::time_repeated(
        device, [&] { run(k); }, 1, repeats);
    // [demo_measure]
    if (k == 1) peak_k1 = peak, ms_k1 = timing.median_ms;
    if (k == 16) peak_k16 = peak, ms_k16 = timing.median_ms;
    table.add({std::to_string(k), std::to_string(batch / k), std::to_string(static_cast<int64_t>(peak)),
               workshop::fixed(peak / (1024.0 * 1024.0), 2), workshop::fixed(peak / std::max(peak_k1, 1.0), 2),
               workshop::fixed(timing.median_ms, 2), scientific(max_diff), scientific(max_diff / max_ref)});
  }
  const std::string path = table.emit(csv_dir);
  if (!path.empty()) std::cout << "wrote " << path << "\n";
  std::cout << "\nPeak bytes at K=16 are " << workshop::fixed(peak_k16 / peak_k1 * 100, 1)
            << "% of K=1; the step takes " << workshop::fixed(ms_k16 / ms_k1, 2)
            << "x as long (K passes, each paying the per-op overhead on smaller matrix products).\n";
  workshop::append_summary(csv_dir, {{"2 gradient accumulation", "peak bytes, K=1 vs K=16", peak_k1, peak_k16,
                                      workshop::device_name(device)},
                                     {"2 gradient accumulation", "step time (ms), K=1 vs K=16", ms_k1, ms_k16,
                                      workshop::device_name(device)}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return workshop::demo_main(argc, argv,
                             workshop::DemoOptions(
                                 "Lesson 2 demo: one effective batch in K = 1, 2, 4, 8, 16 micro-batches: peak bytes, "
                                 "step time and the gradients' distance from the full batch's.")
                                 .flags({{"batch", "effective batch in items (default 1024; --quick: 256)"},
                                         {"repeats", "timed repeats per row (default 10; --quick: 3)"}}),
                             run);
}
