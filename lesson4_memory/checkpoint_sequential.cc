// Lesson 4, step 3 — your code: checkpointing a Sequential model segment by segment, with checkpoint()
// from checkpoint.cc. Its own file because torch::nn::Sequential's header is slow to compile: edits to
// step 2 (checkpoint.cc) do not pay for it. Checks: bazel test //lesson4_memory:all --test_arg=--test-case='*step3*'
#include "lesson4_memory/checkpoint.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

namespace mem {

// [checkpoint_sequential]
at::Tensor checkpoint_sequential(torch::nn::Sequential& model, int64_t segments, const at::Tensor& input) {
  // TODO(lesson4, step 3): Reject an empty model ("no layers"), segments < 1 ("segments must be >= 1") and
  // segments > model->size() ("more segments"). Split the layers: n / segments each, the first n % segments
  // one more. For each segment a Segment lambda runs its layers ((model.ptr()->begin() + j)->forward(h)).
  // Every segment but the last goes through checkpoint() with the parameters of its layers
  // (model->ptr(j)->parameters()); the last runs plainly. Return the final output.
  TORCH_CHECK(false, "TODO(lesson4, step 3): checkpoint_sequential() is not implemented yet");
}
// [checkpoint_sequential]

}  // namespace mem
