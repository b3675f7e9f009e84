// Lesson 4 — reduce memory use. Part B (steps 2 and 3): activation checkpointing.
//
// A checkpointed segment runs its forward pass without keeping its activations; backward runs it again, this
// time recording the graph, and backpropagates through the recomputed copy. Memory for one extra forward.
// LibTorch's C++ API has no checkpoint function: you write one as a custom autograd function.
// See lesson4_memory/README.md.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "lesson1_amp/autocast.h"

namespace torch {
namespace nn {
class Sequential;  // <torch/nn/modules/container/sequential.h>; declared only, its header is slow to compile
}  // namespace nn
}  // namespace torch

namespace mem {

/// A piece of the forward pass: tensors in, tensors out. It must be a pure function of its inputs, the
/// parameters it uses and the random-number state (it runs twice).
using Segment = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// The state of the default random-number generators at one moment: the CPU one, and one CUDA device's
/// (`cuda` undefined and cuda_device -1 when not captured).
struct RngState {
  at::Tensor cpu;
  at::Tensor cuda;
  int cuda_device = -1;
};

/// Step 2. Captures the CPU generator's state and, if `cuda_device` >= 0, that CUDA device's generator state.
RngState get_rng_state(int cuda_device = -1);

/// Step 2. Puts the generators back into `state` (the CUDA one only if it was captured). Throws if
/// state.cpu is undefined (a message naming the "CPU" state).
void set_rng_state(const RngState& state);

/// Step 2. Runs `segment` on `inputs` without keeping its activations, and returns its outputs. In backward,
/// the segment runs again under grad mode, with the random-number and autocast state of the first run (so
/// dropout draws the same mask), and gradients flow to the `inputs` that require grad and to `parameters`
/// (list every parameter the segment uses: the others get no gradient).
/// With grad mode off (e.g. under torch::NoGradGuard) it simply returns segment(inputs). The forward pass runs
/// without grad mode: while it runs, at most a couple of the segment's activations exist at any moment.
/// Backward leaves the random stream as it found it, also when the recomputation throws.
/// Throws if `segment` is empty ("segment is empty"), `inputs` is empty ("no inputs"), or — with grad mode on
/// — none of `inputs` and `parameters` "requires grad" (nothing could receive a gradient); also when the
/// segment "returned no tensors". Backward throws when the recomputed segment's outputs do not require grad
/// ("no recomputed output requires grad", as PyTorch's checkpoint does), instead of silently returning no
/// gradient.
std::vector<at::Tensor> checkpoint(const Segment& segment, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& parameters = {});

/// Step 3. model->forward(input) with the model's layers split into `segments` consecutive segments of
/// near-equal size (the first n % segments get one layer more). Every segment but the last runs under
/// checkpoint() with its own layers' parameters; the last runs plainly (backward needs it at once), so each
/// layer of the last segment runs once and every other layer twice (forward, then recomputation).
/// This grouping departs from PyTorch's torch.utils.checkpoint.checkpoint_sequential, which gives the first
/// segments - 1 segments n / segments layers each and the remainder to the last (plain) one: 7 layers in 3
/// segments are 3+2+2 here, 2+2+3 there. Near-equal segments keep the largest one, which sets the
/// recomputation's peak, as small as possible.
/// segments == 1 is the plain forward pass. Throws if segments < 1 ("segments must be >= 1"), segments >
/// layer_count(model) (named "more segments than layers"), or the model is empty ("no layers").
at::Tensor checkpoint_sequential(torch::nn::Sequential& model, int64_t segments, const at::Tensor& input);

/// Given (its own file would need <torch/nn/modules/container/sequential.h>, slow to compile). The number of
/// layers (modules) of `model`.
int64_t layer_count(torch::nn::Sequential& model);

/// Given. A Segment that runs layers begin .. end - 1 of `model` one after the other on its one input tensor
/// and returns the last layer's output (one tensor). It holds the model, so it stays valid during backward.
/// Throws if the range is empty or outside the model.
Segment layers_segment(torch::nn::Sequential& model, int64_t begin, int64_t end);

/// Given. The parameters of layers begin .. end - 1 of `model` (what checkpoint() must be told about).
std::vector<at::Tensor> layer_parameters(torch::nn::Sequential& model, int64_t begin, int64_t end);

/// Given. The index of the CUDA device of the first defined CUDA tensor in `tensors`, or -1 if there is none:
/// the device whose random state a checkpoint must record and replay.
int cuda_device_of(const std::vector<at::Tensor>& tensors);

/// Given. The autocast switches of CPU and CUDA at one moment.
struct AutocastState {
  bool cpu_enabled = false;
  c10::ScalarType cpu_dtype = c10::ScalarType::BFloat16;
  bool cuda_enabled = false;
  c10::ScalarType cuda_dtype = c10::ScalarType::Half;
};

/// Given. The autocast state now.
AutocastState current_autocast_state();

/// Given. While alive, autocast is as in `state` (lesson 1's guards, one per device); restored on exit.
class AutocastReplay {
 public:
  explicit AutocastReplay(const AutocastState& state);

 private:
  amp::AutocastGuard cpu_;
  amp::AutocastGuard cuda_;
};

}  // namespace mem
