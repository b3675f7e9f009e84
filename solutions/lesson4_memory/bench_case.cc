// Lesson 4's bench case: peak bytes and time per memory recipe (plain, checkpointed, + 16-bit autocast,
// + accumulation), beside torch.utils.checkpoint.checkpoint_sequential (bench/peer.py "l4").
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "bench/harness.h"
#include "bench/registry.h"
#include "common/report.h"
#include "lesson4_memory/breakdown.h"
#include "lesson4_memory/planner.h"
#include "lesson4_memory/workload.h"

namespace bench {

using workshop::fixed;

namespace {

// The layers per segment of a checkpoint_sequential over `layers` layers in `segments` segments, the last
// (run plainly) after the bar: ours splits evenly (the first layers % segments get one more); PyTorch's makes
// segments - 1 checkpointed segments of layers / segments and gives the rest to the last.
std::string split_of(int64_t layers, int64_t segments, bool pytorch) {
  std::vector<int64_t> sizes;
  for (int64_t s = 0; s < segments; ++s) {
    if (pytorch) {
      sizes.push_back(s + 1 < segments ? layers / segments : layers - (segments - 1) * (layers / segments));
    } else {
      sizes.push_back(layers / segments + (s < layers % segments ? 1 : 0));
    }
  }
  std::string out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out += (i == 0 ? "" : (i + 1 == sizes.size() ? " | " : "+")) + std::to_string(sizes[i]);
  }
  return out;
}

}  // namespace

void lesson4(Context& c) {
  mem::MlpSpec spec;
  spec.layers = 32;
  spec.width = c.device.is_cuda() ? 1024 : (c.quick ? 64 : 128);
  spec.batch = c.device.is_cuda() ? 8192 : (c.quick ? 1024 : 2048);
  const int timed = c.quick ? 3 : 10;
  std::cout << "lesson 4: MLP " << spec.layers << " x " << spec.width << ", batch " << spec.batch << std::endl;
  struct Variant {
    std::string name;
    mem::Recipe recipe;
  };
  mem::Recipe plain, checkpointed, low, accumulated;
  checkpointed.segments = 6;
  low = checkpointed;
  low.low_precision = true;
  accumulated = low;
  accumulated.micro_batch = spec.batch / 4;
  const std::vector<Variant> variants{{"plain", plain},
                                      {"checkpointed (6 segments)", checkpointed},
                                      {"+ 16-bit autocast", low},
                                      {"+ accumulation (4 micro-batches)", accumulated}};
  double base_ms = 0, base_bytes = 0;
  std::vector<std::string> recipes;
  for (const auto& v : variants) {
    const mem::StepMemory m = mem::measure_training(spec, v.recipe, c.device, timed);
    const double peak = static_cast<double>(m.step_peak_bytes);
    // The same step once more, its peak measured as the peer measures PyTorch's (after the same warm-up).
    int64_t same_way = -1;
    {
      torch::nn::Sequential model = mem::make_deep_mlp(spec, c.device);
      auto batch = mem::make_batch(spec, c.device);
      torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
      const auto step = [&] { mem::train_step(model, adam, batch.first, batch.second, v.recipe); };
      step();  // warm-up: creates Adam's state
      mem::set_grads_to_none(model->parameters());
      same_way = bench::same_way_peak_bytes(c.device, step, [&] { mem::set_grads_to_none(model->parameters()); });
    }
    if (base_ms == 0) {
      base_ms = m.median_step_ms;
      base_bytes = peak;
    }
    const std::string recipe = std::to_string(v.recipe.micro_batch) + ":" + std::to_string(v.recipe.segments) + ":" +
                               (v.recipe.low_precision ? "1" : "0");
    recipes.push_back(recipe);
    std::string key = recipe;
    std::replace(key.begin(), key.end(), ':', '_');
    workshop::Timing timing{m.median_step_ms, m.median_step_ms, m.median_step_ms, {}};
    c.rows.push_back(
        Row{"lesson 4: memory", v.name, timing, 6.0 * spec.batch * spec.layers * spec.width * spec.width, peak, "",
            base_ms / m.median_step_ms,
            "step peak " + workshop::mib(peak) + ", " + fixed(base_bytes / std::max(peak, 1.0), 2) + "x lower",
            "l4." + key, same_way});
  }
  c.peer->run("l4", "layers=" + std::to_string(spec.layers) + ",width=" + std::to_string(spec.width) +
                        ",batch=" + std::to_string(spec.batch) + ",timed=" + std::to_string(timed) +
                        ",recipes=" + join(recipes, "+"));
  c.notes.push_back("Lesson 4, segments: " + std::to_string(spec.layers) + " layers in 6 segments are " +
                    split_of(spec.layers, 6, false) + " (ours) and " + split_of(spec.layers, 6, true) +
                    " (PyTorch's checkpoint_sequential), the last segment, after the bar, runs without checkpointing: "
                    "its activations stay, so the larger last segment keeps more bytes.");
  if (c.peer->available()) {
    const bench::PeerRow* r = c.peer->find("l4.0_6_0");
    if (r != nullptr && r->what.find("non-reentrant") == std::string::npos) {
      c.notes.push_back(
          "Lesson 4, mode: this PyTorch's checkpoint_sequential is reentrant only, which gives the first "
          "segment's parameters no gradient unless the segment input requires grad; the peer sets "
          "requires_grad on the input, which adds the input gradient of layer 1 (one matmul) that ours "
          "skips (its checkpoint takes the parameters explicitly).");
    }
  }
}

namespace {
const Registered registered(4, Case{"l4", lesson4});
}  // namespace

}  // namespace bench
