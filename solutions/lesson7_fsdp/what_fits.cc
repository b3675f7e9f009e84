// Lesson 7, step 7 — reference solution: the napkin arithmetic of what fits (lesson7_fsdp/what_fits.h).
#include "lesson7_fsdp/what_fits.h"

#include <algorithm>
#include <string>

#include <c10/util/Exception.h>

namespace fsdp {

namespace {

void check_positive(int64_t value, const char* what) { TORCH_CHECK(value > 0, what, " must be > 0, got ", value); }

void check_shape(const TransformerShape& s) {
  TORCH_CHECK(s.family == Family::kGpt || s.family == Family::kLlama, "unknown family ", static_cast<int>(s.family));
  check_positive(s.layers, "layers");
  check_positive(s.hidden, "hidden");
  check_positive(s.heads, "heads");
  check_positive(s.kv_heads, "kv_heads");
  check_positive(s.ffn, "ffn");
  check_positive(s.vocab, "vocab");
  check_positive(s.sequence, "sequence");
  check_positive(s.micro_batch, "micro_batch");
  TORCH_CHECK(s.hidden % s.heads == 0, "heads must divide hidden: ", s.heads, " heads, hidden ", s.hidden);
  TORCH_CHECK(s.heads % s.kv_heads == 0, "kv_heads must divide heads: ", s.kv_heads, " kv_heads, ", s.heads, " heads");
}

void check_strategy(Strategy strategy) {
  TORCH_CHECK(strategy == Strategy::kDdp || strategy == Strategy::kZero1 || strategy == Strategy::kZero2 ||
                  strategy == Strategy::kFullShard,
              "unknown strategy ", static_cast<int>(strategy));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

// [layer_parameters]
int64_t layer_parameters(const TransformerShape& s) {
  check_shape(s);
  const int64_t h = s.hidden;
  const int64_t kv = s.kv_heads * (h / s.heads);  // the width of the keys (and of the values)
  const int64_t attention = 2 * h * h + 2 * h * kv;
  if (s.family == Family::kGpt) {
    const int64_t mlp = 2 * h * s.ffn;
    const int64_t biases = (h + 2 * kv + h) + (s.ffn + h);
    return attention + mlp + biases + 2 * (2 * h);  // two LayerNorms: weight and bias
  }
  return attention + 3 * h * s.ffn + 2 * h;  // gated MLP; two RMSNorms: weight only
}
// [layer_parameters]

// [count_parameters]
ParamCount count_parameters(const TransformerShape& s) {
  ParamCount count;
  count.layers = s.layers;
  count.per_layer = layer_parameters(s);
  const int64_t embedding = s.vocab * s.hidden;
  if (s.family == Family::kGpt) {
    count.other = embedding + s.sequence * s.hidden + 2 * s.hidden;  // positions, final LayerNorm; tied head
  } else {
    count.other = embedding + s.hidden + s.vocab * s.hidden;  // final RMSNorm, the output head
  }
  return count;
}
// [count_parameters]

// [sharded_elements]
int64_t sharded_elements(const ParamCount& count, int gpus) {
  TORCH_CHECK(gpus > 0, "gpus must be > 0, got ", gpus);
  TORCH_CHECK(count.layers >= 0 && count.per_layer >= 0 && count.other >= 0, "parameter counts must be >= 0, got ",
              count.layers, " layers of ", count.per_layer, " and ", count.other, " other");
  return count.layers * ceil_div(count.per_layer, gpus) + ceil_div(count.other, gpus);
}
// [sharded_elements]

// [model_state_bytes]
StateBytes model_state_bytes(const ParamCount& count, Strategy strategy, int gpus) {
  check_strategy(strategy);
  const int64_t shard = sharded_elements(count, gpus);
  const int64_t all = count.total();
  const int64_t unit = std::max(count.per_layer, count.other);  // the largest flat buffer
  StateBytes bytes;
  bytes.params = kParamBytes * (strategy == Strategy::kFullShard ? shard : all);
  bytes.grads = kGradBytes * (strategy == Strategy::kZero2 || strategy == Strategy::kFullShard ? shard : all);
  bytes.optimizer = kOptimizerBytes * (strategy == Strategy::kDdp ? all : shard);
  if (gpus == 1) {
    return bytes;  // the one shard is the whole model: nothing is gathered or reduce-scattered
  }
  if (strategy == Strategy::kZero2) {
    bytes.working = kGradBytes * unit;  // one unit's full gradient, until its reduce-scatter
  } else if (strategy == Strategy::kFullShard) {
    bytes.working = 2 * kParamBytes * unit + kGradBytes * unit;  // two gathered units, one full gradient
  }
  return bytes;
}
// [model_state_bytes]

// [activation_bytes]
int64_t activation_bytes(const TransformerShape& s, bool checkpointing) {
  check_shape(s);
  const int64_t sb = s.sequence * s.micro_batch;  // tokens
  const int64_t h = s.hidden;
  const int64_t kv = s.kv_heads * (h / s.heads);     // the width of K and of V
  const int64_t scores = s.heads * s.sequence * sb;  // a x s x s x b attention probabilities
  // Both families, 2 bytes each: the two norms' inputs, the q/k/v projections' input, Q, the output projection's
  // input and the MLP's (6 tensors h wide), K and V (kv wide), the softmax's output.
  int64_t block = 2 * (6 * h + 2 * kv) * sb + 2 * scores;
  if (s.family == Family::kGpt) {
    block += 2 * 2 * s.ffn * sb;             // GeLU's input and output, ffn wide
    block += 2 * h * sb + (1 + 2) * scores;  // dropout: 2 masks of 1 byte h wide; the scores' mask, dropped scores
  } else {
    block += 4 * 2 * s.ffn * sb;  // SwiGLU, ffn wide: gate, up, silu(gate), their product (no dropout)
  }
  if (!checkpointing) {
    return s.layers * block;
  }
  return s.layers * 2 * h * sb + block;  // every block's bfloat16 input, and one block recomputed
}
// [activation_bytes]

// [comm_bytes_per_step]
int64_t comm_bytes_per_step(const ParamCount& count, Strategy strategy, int gpus) {
  check_strategy(strategy);
  const int64_t shard = sharded_elements(count, gpus);
  const int64_t ring = (gpus - 1) * shard * kParamBytes;  // one reduce-scatter or all-gather of the model
  return (strategy == Strategy::kFullShard ? 3 : 2) * ring;
}

double comm_seconds(int64_t bytes, int gpus, const Cluster& cluster) {
  TORCH_CHECK(gpus > 0, "gpus must be > 0, got ", gpus);
  TORCH_CHECK(bytes >= 0, "bytes must be >= 0, got ", bytes);
  TORCH_CHECK(cluster.gpus_per_node > 0, "gpus_per_node must be > 0, got ", cluster.gpus_per_node);
  TORCH_CHECK(cluster.nvlink_gigabytes_per_s > 0 && cluster.network_gigabits_per_s > 0, "bandwidth must be > 0, got ",
              cluster.nvlink_gigabytes_per_s, " GB/s NVLink and ", cluster.network_gigabits_per_s, " Gb/s network");
  const double bytes_per_s =
      gpus <= cluster.gpus_per_node ? cluster.nvlink_gigabytes_per_s * 1e9 : cluster.network_gigabits_per_s * 1e9 / 8;
  return static_cast<double>(bytes) / bytes_per_s;
}
// [comm_bytes_per_step]

// [what_fits]
Fit what_fits(const TransformerShape& shape, Strategy strategy, int gpus, bool checkpointing, const Cluster& cluster) {
  TORCH_CHECK(cluster.gpu_bytes > 0, "gpu_bytes must be > 0, got ", cluster.gpu_bytes);
  const ParamCount count = count_parameters(shape);
  Fit fit;
  fit.state = model_state_bytes(count, strategy, gpus);
  fit.activations = activation_bytes(shape, checkpointing);
  fit.total = fit.state.total() + fit.activations;
  fit.fits = fit.total <= cluster.gpu_bytes;
  fit.comm_bytes = comm_bytes_per_step(count, strategy, gpus);
  fit.comm_s = comm_seconds(fit.comm_bytes, gpus, cluster);
  return fit;
}
// [what_fits]

// [recipe_peak_bytes]
int64_t recipe_peak_bytes(const TransformerShape& shape, Strategy strategy, int gpus, int64_t batch,
                          const mem::Recipe& recipe) {
  TORCH_CHECK(batch > 0, "batch must be > 0, got ", batch);
  TORCH_CHECK(recipe.micro_batch >= 0 && recipe.micro_batch <= batch, "micro_batch must be in [0, batch]: got ",
              recipe.micro_batch, " for a batch of ", batch);
  TransformerShape micro = shape;
  micro.micro_batch = recipe.micro_batch == 0 ? batch : recipe.micro_batch;
  const int64_t block = activation_bytes(micro, false) / micro.layers;  // one block's activations
  TORCH_CHECK(recipe.segments >= 1 && recipe.segments <= micro.layers, "segments must be in [1, layers]: got ",
              recipe.segments, " for ", micro.layers, " layers");
  const int64_t input = 2 * micro.sequence * micro.micro_batch * micro.hidden;
  int64_t activations = (recipe.segments - 1) * input + ceil_div(micro.layers, recipe.segments) * block;
  if (!recipe.low_precision) {
    activations *= 2;  // float32 activations
  }
  return model_state_bytes(count_parameters(micro), strategy, gpus).total() + activations;
}
// [recipe_peak_bytes]

// [plan_cell]
mem::Plan plan_cell(const TransformerShape& shape, Strategy strategy, int gpus, int64_t batch, const Cluster& cluster) {
  const mem::PeakProbe probe = [&](const mem::Recipe& recipe) {
    return recipe_peak_bytes(shape, strategy, gpus, batch, recipe);
  };
  return mem::plan_for_budget(cluster.gpu_bytes, batch, shape.layers, probe);
}
// [plan_cell]

}  // namespace fsdp
