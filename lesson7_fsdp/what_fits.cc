// Lesson 7, step 7 — your code: what fits. Replace each TODO with the arithmetic; the checks in
// fsdp_step7_test.cc tell you when it is right:  bazel test //lesson7_fsdp:fsdp_step7_test
#include "lesson7_fsdp/what_fits.h"

#include <algorithm>
#include <string>

#include <c10/util/Exception.h>

namespace fsdp {

// [layer_parameters]
int64_t layer_parameters(const TransformerShape& s) {
  // TODO(lesson7, step 7): refuse a bad shape in what_fits.h's words, then count one block's attention, MLP, norms
  // and (kGpt) biases, checks included (about 20 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 7): layer_parameters() is not implemented yet");
}
// [layer_parameters]

// [count_parameters]
ParamCount count_parameters(const TransformerShape& s) {
  // TODO(lesson7, step 7): layers blocks of layer_parameters(s), and what lies outside them as what_fits.h says
  // for kGpt and kLlama (about 10 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 7): count_parameters() is not implemented yet");
}
// [count_parameters]

// [sharded_elements]
int64_t sharded_elements(const ParamCount& count, int gpus) {
  // TODO(lesson7, step 7): refuse bad counts and gpus; pad each unit to a multiple of N: layers x ceil(per_layer / N)
  // + ceil(other / N) (about 4 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 7): sharded_elements() is not implemented yet");
}
// [sharded_elements]

// [model_state_bytes]
StateBytes model_state_bytes(const ParamCount& count, Strategy strategy, int gpus) {
  // TODO(lesson7, step 7): replicated or sharded parameters, gradients and optimizer state per strategy, and the
  // working bytes of kZero2 and kFullShard at the largest unit (about 20 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 7): model_state_bytes() is not implemented yet");
}
// [model_state_bytes]

// [activation_bytes]
int64_t activation_bytes(const TransformerShape& s, bool checkpointing) {
  // TODO(lesson7, step 7): layer_parameters' checks; one block's saved tensors as what_fits.h lists them per family,
  // layers x that, or, checkpointed, every block's input (2 s b h) plus one block (about 16 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 7): activation_bytes() is not implemented yet");
}
// [activation_bytes]

// [comm_bytes_per_step]
int64_t comm_bytes_per_step(const ParamCount& count, Strategy strategy, int gpus) {
  // TODO(lesson7, step 7): one ring sends (N - 1) x sharded_elements x 2 bytes; two rings per step for DDP, ZeRO-1
  // and ZeRO-2, three for full sharding (about 5 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 7): comm_bytes_per_step() is not implemented yet");
}

double comm_seconds(int64_t bytes, int gpus, const Cluster& cluster) {
  // TODO(lesson7, step 7): refuse bad arguments in what_fits.h's words; bytes / NVLink's rate inside a node, / the
  // network's beyond it (gigabits: divide by 8) (about 8 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 7): comm_seconds() is not implemented yet");
}
// [comm_bytes_per_step]

// [what_fits]
Fit what_fits(const TransformerShape& shape, Strategy strategy, int gpus, bool checkpointing, const Cluster& cluster) {
  // TODO(lesson7, step 7): refuse gpu_bytes <= 0 ("gpu_bytes must be > 0"); fill every field of Fit from the
  // functions above (about 10 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 7): what_fits() is not implemented yet");
}
// [what_fits]

// [recipe_peak_bytes]
int64_t recipe_peak_bytes(const TransformerShape& shape, Strategy strategy, int gpus, int64_t batch,
                          const mem::Recipe& recipe) {
  // TODO(lesson7, step 7): refuse bad arguments in what_fits.h's words; the model state plus one micro-batch's
  // activations as what_fits.h counts them (about 14 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 7): recipe_peak_bytes() is not implemented yet");
}
// [recipe_peak_bytes]

// [plan_cell]
mem::Plan plan_cell(const TransformerShape& shape, Strategy strategy, int gpus, int64_t batch, const Cluster& cluster) {
  // TODO(lesson7, step 7): lesson 4's mem::plan_for_budget with a probe that returns recipe_peak_bytes (about 4 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 7): plan_cell() is not implemented yet");
}
// [plan_cell]

}  // namespace fsdp
