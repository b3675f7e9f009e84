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
#include "common/report.h"
#include "lesson1_amp/grad_scaler.h"

namespace bench {

using workshop::fixed;

namespace {

// An optimizer whose step does nothing: what is timed is the scaler, not the parameter update.
class NoopOptimizer : public torch::optim::Optimizer {
 public:
  explicit NoopOptimizer(std::vector<torch::Tensor> params)
      : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                  std::make_unique<torch::optim::SGDOptions>(0.0)) {}
  torch::Tensor step(LossClosure /*closure*/) override { return {}; }
};

// 128 layers of (weight [width, width], bias [width]): 256 gradient tensors, as a deep model has.
struct Workload {
  int64_t layers = 128, width = 0;
  int64_t tensors() const { return 2 * layers; }
  int64_t elements() const { return layers * (width * width + width); }
};

Workload workload(const Context& c) { return {128, c.device.is_cuda() ? 1024 : (c.quick ? 64 : 256)}; }

const char* const kGroup = "GradScaler cost";  // its rows' group and its lines' benchmark in the CSV

}  // namespace

void scaler(Context& c) {
  const Workload w = workload(c);
  const int64_t layers = w.layers, width = w.width;
  const int warmup = 3, repeats = c.quick ? 5 : 20;
  torch::manual_seed(0);
  std::vector<torch::Tensor> params;
  for (int64_t i = 0; i < layers; ++i) {
    params.push_back(torch::randn({width, width}, c.device).requires_grad_());
    params.push_back(torch::randn({width}, c.device).requires_grad_());
  }
  for (auto& p : params) p.mutable_grad() = torch::randn_like(p);
  std::cout << "GradScaler cost: " << w.tensors() << " gradient tensors, " << w.elements() << " elements" << std::endl;
  // The ceiling: one copy of as many float32 elements as the gradients hold, measured now.
  const std::string copy_ceiling = c.ceilings.copy(c.device, w.elements(), repeats);
  NoopOptimizer optimizer(params);
  const auto loss = torch::ones({}, c.device);
  struct Path {
    std::string name;
    amp::KernelPath kernels;
    std::string note;
  };
  const std::vector<Path> paths{{"ours, plain ops (kPlain)", amp::KernelPath::kPlain,
                                 "5 ops per gradient (`isfinite`, `all`, `logical_not`, `masked_fill_`, `mul_`): " +
                                     std::to_string(5 * w.tensors()) + " ops"},
                                {"ours, fused kernel (kFused)", amp::KernelPath::kFused,
                                 "one `" + amp::fused_unscale_kernel(c.device.type()) +
                                     "` over all gradients (lesson 6's where linked, as here; else ATen's)"}};
  for (const auto& path : paths) {
    SideRow row{path.name, {}, "", path.note, kGroup, copy_ceiling};
    if (path.kernels == amp::KernelPath::kFused && amp::fused_unscale_kernel(c.device.type()).empty()) {
      row.unavailable = "not available in LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." +
                        std::to_string(TORCH_VERSION_MINOR) + " on " + c.device.str() +
                        " (ATen's CPU kernels arrived in 2.3)";
      c.side_rows.push_back(row);
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
    c.side_rows.push_back(row);
  }
  c.peer->run("scaler", "layers=" + std::to_string(layers) + ",width=" + std::to_string(width) +
                            ",warmup=" + std::to_string(warmup) + ",repeats=" + std::to_string(repeats));
  SideRow theirs{"PyTorch's GradScaler", {}, "", "", kGroup, copy_ceiling};
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
  c.side_rows.push_back(theirs);
}

namespace {

// The scaler's own table, with its napkin math: the least a pass over the gradients moves is one read and one
// write of each (8 bytes per float32 element); at the copy ceiling that takes min_ms.
Section scaler_section(const Context& c, const std::vector<const SideRow*>& rows) {
  const Workload w = workload(c);
  const double copy_ceiling = c.ceilings.best(rows.front()->ceiling_key);
  const std::string copy_name = c.ceilings.name(rows.front()->ceiling_key);
  const double min_bytes = 8.0 * static_cast<double>(w.elements());
  const double min_ms = copy_ceiling > 0 ? 1e3 * min_bytes / copy_ceiling : 0;
  Section s{"bench_scaler",
            "The GradScaler's own cost.",
            "",
            {"implementation", "median ms", "min..max ms", "vs ours plain", "GB/s (8 B/element)", "of copy ceiling",
             "note"}};
  s.text = "GradScaler cost per step (scale + unscale_ + step with a no-op optimizer + update), " +
           std::to_string(w.tensors()) + " float32 gradient tensors, " + fixed(w.elements() / 1e6, 2) +
           " M elements (" + workshop::mib(4.0 * w.elements()) +
           "). Napkin math: one pass reads and writes each "
           "gradient once, " +
           workshop::mib(min_bytes) + " per step; at the measured copy ceiling (" + fixed(copy_ceiling / 1e9, 1) +
           " GB/s) that is " + fixed(min_ms, 3) +
           " ms, the floor. The plain path "
           "makes three passes (`isfinite` reads 4 B and writes 1 B per element, `all` reads 1 B, `mul_` reads and "
           "writes 8 B: about 14 B per element) and launches 5 ops per gradient where the fused path launches one "
           "kernel for all of them.";
  double plain_ms = 0;
  for (const SideRow* r : rows) {
    const std::string impl = r->name.rfind("PyTorch", 0) == 0 ? "pytorch" : "ours";
    if (!r->unavailable.empty()) {
      s.rows.push_back({r->name, "-", "-", "-", "-", "-", r->unavailable});
      s.csv.push_back({kGroup, r->name, impl, "", "", "", "", fixed(min_bytes, 0), "", fixed(copy_ceiling, 0),
                       copy_name, "", "", r->unavailable});
      continue;
    }
    if (plain_ms == 0) plain_ms = r->timing.median_ms;
    const double rate = min_bytes / (r->timing.median_ms * 1e-3);
    std::string fraction = copy_ceiling > 0 ? fixed(100.0 * rate / copy_ceiling, 1) + "%" : "-";
    if (copy_ceiling > 0 && rate > copy_ceiling) fraction = "suspect";
    s.rows.push_back({r->name, fixed(r->timing.median_ms, 3),
                      fixed(r->timing.min_ms, 3) + ".." + fixed(r->timing.max_ms, 3),
                      fixed(plain_ms / r->timing.median_ms, 2) + "x", fixed(rate / 1e9, 1), fraction, r->note});
    s.csv.push_back({kGroup, r->name, impl, fixed(r->timing.median_ms, 4), fixed(r->timing.min_ms, 4),
                     fixed(r->timing.max_ms, 4), "0", fixed(min_bytes, 0), "", fixed(copy_ceiling, 0), copy_name,
                     fixed(plain_ms / r->timing.median_ms, 4), "", r->note});
  }
  return s;
}

}  // namespace

void scaler_finish(Context& c) {
  const PeerRow* r = c.peer->find("scaler.pytorch");  // the summary of all rounds
  std::vector<const SideRow*> rows;
  for (auto& row : c.side_rows) {
    if (row.group != kGroup) continue;
    if (row.name == "PyTorch's GradScaler" && row.unavailable.empty() && r != nullptr) {
      row.timing = workshop::Timing{r->median_ms, r->min_ms, r->max_ms, {}};
    }
    rows.push_back(&row);
  }
  if (!rows.empty()) c.sections.push_back(scaler_section(c, rows));
}

namespace {
// Between lesson 4 and lesson 5: the scaler's fused path uses lesson 6's operator, its rows read with lesson 1's.
const Registered registered(4.5, Case{"scaler", scaler, /*once=*/false, scaler_finish});
}  // namespace

}  // namespace bench
