// Lesson 7, step 7 — your code: what fits. Replace each TODO with the arithmetic; the checks in
// fsdp_step7_test.cc tell you when it is right:  bazel test //lesson7_fsdp:fsdp_step7_test
#include "lesson7_fsdp/what_fits.h"

#include <algorithm>
#include <string>

#include <c10/util/Exception.h>

namespace fsdp {

// [layer_parameters]
int64_t layer_parameters(const TransformerShape& s) {
  // TODO(lesson7, step 7): refuse a size that is not > 0 ("layers must be > 0", the same for hidden, heads,
  // kv_heads, ffn, vocab, sequence, micro_batch), "heads must divide hidden" and "kv_heads must divide heads".
  // Then count one block: attention 2 h h + 2 h kv (kv = kv_heads x h / heads), the MLP (2 or 3 x h x ffn), the
  // norms, and kGpt's biases, as what_fits.h says.
  TORCH_CHECK(false, "TODO(lesson7, step 7): layer_parameters() is not implemented yet");
}
// [layer_parameters]

// [count_parameters]
ParamCount count_parameters(const TransformerShape& s) {
  // TODO(lesson7, step 7): layers blocks of layer_parameters(s), and outside them the embedding V x h plus, for
  // kGpt, the positions s x h and a final LayerNorm (2h); for kLlama a final RMSNorm (h) and the head V x h.
  TORCH_CHECK(false, "TODO(lesson7, step 7): count_parameters() is not implemented yet");
}
// [count_parameters]

// [sharded_elements]
int64_t sharded_elements(const ParamCount& count, int gpus) {
  // TODO(lesson7, step 7): refuse gpus <= 0 ("gpus must be > 0") and negative counts ("parameter counts must be
  // >= 0"); each unit is padded to a multiple of N: layers x ceil(per_layer / N) + ceil(other / N).
  TORCH_CHECK(false, "TODO(lesson7, step 7): sharded_elements() is not implemented yet");
}
// [sharded_elements]

// [model_state_bytes]
StateBytes model_state_bytes(const ParamCount& count, Strategy strategy, int gpus) {
  // TODO(lesson7, step 7): refuse a strategy that is none of the four ("unknown strategy"). Parameters,
  // gradients and optimizer state: kParamBytes, kGradBytes and kOptimizerBytes per element, of all the
  // parameters where replicated and of sharded_elements where sharded. Then the working bytes of kZero2 and
  // kFullShard, counted on the largest unit
  // (none on one GPU).
  TORCH_CHECK(false, "TODO(lesson7, step 7): model_state_bytes() is not implemented yet");
}
// [model_state_bytes]

// [activation_bytes]
int64_t activation_bytes(const TransformerShape& s, bool checkpointing) {
  // TODO(lesson7, step 7): layer_parameters' checks; one block saves 34 s b h + 5 a s^2 b bytes. Without
  // checkpointing, layers of them; with it, every block's input (2 s b h) plus one block recomputed.
  TORCH_CHECK(false, "TODO(lesson7, step 7): activation_bytes() is not implemented yet");
}
// [activation_bytes]

// [comm_bytes_per_step]
int64_t comm_bytes_per_step(const ParamCount& count, Strategy strategy, int gpus) {
  // TODO(lesson7, step 7): "unknown strategy"; one ring sends (N - 1) x sharded_elements x 2 bytes; DDP, ZeRO-1
  // and ZeRO-2 run two rings per step, full sharding three.
  TORCH_CHECK(false, "TODO(lesson7, step 7): comm_bytes_per_step() is not implemented yet");
}

double comm_seconds(int64_t bytes, int gpus, const Cluster& cluster) {
  // TODO(lesson7, step 7): refuse gpus <= 0 ("gpus must be > 0"), bytes < 0 ("bytes must be >= 0") and a link
  // that is not > 0 ("bandwidth must be > 0"). Divide by NVLink's bytes per second inside a node, and by the
  // network's beyond it (gigabits: 1e9 / 8 bytes per second each).
  TORCH_CHECK(false, "TODO(lesson7, step 7): comm_seconds() is not implemented yet");
}
// [comm_bytes_per_step]

// [what_fits]
Fit what_fits(const TransformerShape& shape, Strategy strategy, int gpus, bool checkpointing, const Cluster& cluster) {
  // TODO(lesson7, step 7): refuse gpu_bytes <= 0 ("gpu_bytes must be > 0"); then fill every field of Fit from
  // the functions above. It fits when the total is at most cluster.gpu_bytes.
  TORCH_CHECK(false, "TODO(lesson7, step 7): what_fits() is not implemented yet");
}
// [what_fits]

// [recipe_peak_bytes]
int64_t recipe_peak_bytes(const TransformerShape& shape, Strategy strategy, int gpus, int64_t batch,
                          const mem::Recipe& recipe) {
  // TODO(lesson7, step 7): refuse batch <= 0 ("batch must be > 0"), a micro-batch outside [0, batch]
  // ("micro_batch must be in [0, batch]") and segments outside [1, layers] ("segments must be in [1, layers]").
  // With b = the micro-batch (0: the whole batch): (S - 1) inputs of 2 s b h bytes and ceil(layers / S) blocks
  // of activation_bytes' block, doubled for float32; plus the model state of model_state_bytes.
  TORCH_CHECK(false, "TODO(lesson7, step 7): recipe_peak_bytes() is not implemented yet");
}
// [recipe_peak_bytes]

// [plan_cell]
mem::Plan plan_cell(const TransformerShape& shape, Strategy strategy, int gpus, int64_t batch, const Cluster& cluster) {
  // TODO(lesson7, step 7): lesson 4's mem::plan_for_budget with the GPU's bytes as the budget, `batch`, the
  // shape's layers, and a probe (a lambda) that returns recipe_peak_bytes for the recipe it is given.
  TORCH_CHECK(false, "TODO(lesson7, step 7): plan_cell() is not implemented yet");
}
// [plan_cell]

}  // namespace fsdp
