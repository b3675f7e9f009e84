// The GradScaler's own cost: scale + unscale_ + step (a no-op optimizer) + update over many gradient tensors,
// our plain and fused paths (the fused unscale: lesson 6's workshop::fused_unscale_, linked into the bench, else
// ATen's) beside PyTorch's GradScaler (bench/peer.py "scaler"), with the copy ceiling of the
// same bytes.
#include <iostream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "bench/harness.h"
#include "bench/registry.h"
#include "lesson1_amp/grad_scaler.h"

namespace bench {

namespace {

// An optimizer whose step does nothing: what is timed is the scaler, not the parameter update.
class NoopOptimizer : public torch::optim::Optimizer {
 public:
  explicit NoopOptimizer(std::vector<torch::Tensor> params)
      : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                  std::make_unique<torch::optim::SGDOptions>(0.0)) {}
  torch::Tensor step(LossClosure /*closure*/) override { return {}; }
};

}  // namespace

void scaler(Context& c) {
  // 128 layers of (weight [width, width], bias [width]): 256 gradient tensors, as a deep model has.
  const int64_t layers = 128, width = c.device.is_cuda() ? 1024 : (c.quick ? 64 : 256);
  const int warmup = 3, repeats = c.quick ? 5 : 20;
  torch::manual_seed(0);
  std::vector<torch::Tensor> params;
  for (int64_t i = 0; i < layers; ++i) {
    params.push_back(torch::randn({width, width}, c.device).requires_grad_());
    params.push_back(torch::randn({width}, c.device).requires_grad_());
  }
  c.scaler_elements = 0;
  for (auto& p : params) {
    p.mutable_grad() = torch::randn_like(p);
    c.scaler_elements += p.numel();
  }
  c.scaler_tensors = static_cast<int64_t>(params.size());
  std::cout << "GradScaler cost: " << c.scaler_tensors << " gradient tensors, " << c.scaler_elements << " elements"
            << std::endl;
  // The ceiling: one copy of as many float32 elements as the gradients hold, measured now.
  c.scaler_copy_ceiling = c.ceilings.copy(c.device, c.scaler_elements, repeats);
  NoopOptimizer optimizer(params);
  const auto loss = torch::ones({}, c.device);
  struct Path {
    std::string name;
    amp::KernelPath kernels;
    std::string note;
  };
  const std::vector<Path> paths{{"ours, plain ops (kPlain)", amp::KernelPath::kPlain,
                                 "5 ops per gradient (`isfinite`, `all`, `logical_not`, `masked_fill_`, `mul_`): " +
                                     std::to_string(5 * c.scaler_tensors) + " ops"},
                                {"ours, fused kernel (kFused)", amp::KernelPath::kFused,
                                 "one `" + amp::fused_unscale_kernel(c.device.type()) +
                                     "` over all gradients (lesson 6's where linked, as here; else ATen's)"}};
  for (const auto& path : paths) {
    ScalerRow row{path.name, {}, "", path.note};
    if (path.kernels == amp::KernelPath::kFused && amp::fused_unscale_kernel(c.device.type()).empty()) {
      row.unavailable = "not available in LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." +
                        std::to_string(TORCH_VERSION_MINOR) + " on " + c.device.str() +
                        " (ATen's CPU kernels arrived in 2.3)";
      c.scaler_rows.push_back(row);
      continue;
    }
    amp::GradScalerOptions options;
    // Scale 1: unscaling over and over keeps the gradients' values (no drift into subnormals, slow on CPUs);
    // the work per step is the same for any scale.
    options.init_scale = 1.0;
    options.kernels = path.kernels;
    amp::GradScaler scaler(options);
    row.timing = workshop::time_repeated(
        c.device,
        [&] {
          scaler.scale(loss);
          scaler.step(optimizer);  // unscale_, one .item() sync, the (no-op) step
          scaler.update();
        },
        warmup, repeats);
    c.scaler_rows.push_back(row);
  }
  c.peer->run("scaler", "layers=" + std::to_string(layers) + ",width=" + std::to_string(width) +
                            ",warmup=" + std::to_string(warmup) + ",repeats=" + std::to_string(repeats));
  ScalerRow theirs{"PyTorch's GradScaler", {}, "", ""};
  const bench::PeerRow* r = c.peer->find("scaler.pytorch");
  if (!c.peer->available()) {
    theirs.unavailable = "PyTorch peer not run: " + c.peer->missing();
  } else if (r == nullptr) {
    theirs.unavailable = "the peer returned no row";
  } else if (!r->unavailable.empty()) {
    theirs.unavailable = r->unavailable + " (PyTorch " + c.peer->torch_version() + ")";
  } else {
    theirs.timing = workshop::Timing{r->median_ms, r->min_ms, r->max_ms, {}};
    theirs.note = r->what;
  }
  c.scaler_rows.push_back(theirs);
}

void scaler_finish(Context& c) {
  const PeerRow* r = c.peer->find("scaler.pytorch");  // the summary of all rounds
  for (auto& row : c.scaler_rows) {
    if (row.name == "PyTorch's GradScaler" && row.unavailable.empty() && r != nullptr) {
      row.timing = workshop::Timing{r->median_ms, r->min_ms, r->max_ms, {}};
    }
  }
}

namespace {
// Between lesson 4 and lesson 5: the scaler's fused path uses lesson 6's operator, its rows read with lesson 1's.
const Registered registered(4.5, Case{"scaler", scaler, /*once=*/false, scaler_finish});
}  // namespace

}  // namespace bench
