// Reference solution of lesson 4, step 3 (lesson4_memory/checkpoint.h): sequential checkpointing.
#include "lesson4_memory/checkpoint.h"

#include <ATen/core/Tensor.h>

namespace mem {

// [checkpoint_sequential]
at::Tensor checkpoint_sequential(torch::nn::Sequential& model, int64_t segments, const at::Tensor& input) {
  const int64_t layers = layer_count(model);
  TORCH_CHECK(layers > 0, "checkpoint_sequential: the model has no layers");
  TORCH_CHECK(segments >= 1, "checkpoint_sequential: segments must be >= 1, got ", segments);
  TORCH_CHECK(segments <= layers, "checkpoint_sequential: more segments (", segments, ") than layers (", layers, ")");
  const int64_t base = layers / segments;
  const int64_t extra = layers % segments;
  at::Tensor x = input;
  int64_t begin = 0;
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t end = begin + base + (s < extra ? 1 : 0);
    const Segment run = layers_segment(model, begin, end);
    if (s + 1 == segments) {
      x = run({x})[0];  // the last segment's activations are needed right away by backward: keep them
    } else {
      x = checkpoint(run, {x}, layer_parameters(model, begin, end))[0];
    }
    begin = end;
  }
  return x;
}
// [checkpoint_sequential]

}  // namespace mem
