// Lesson 4, steps 2 and 3 — your code. Replace each TODO with an implementation; the checks in
// checkpoint_test.cc tell you when it is right:  bazel test //lesson4_memory:all --test_arg=--test-case='*step2*'
// Steps, hints and background: lesson4_memory/README.md.
#include "lesson4_memory/checkpoint.h"

#include <mutex>

#include <ATen/TensorOperators.h>  // Tensor with its methods and operators (+, *, ...)
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "common/compat/compat.h"

#if WORKSHOP_HAS_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace mem {

// [get_rng_state]
RngState get_rng_state(int cuda_device) {
  // TODO(lesson4, step 2): Read the default CPU generator's get_state() under its mutex(); if cuda_device >= 0, also
  // that CUDA device's generator's, inside #if WORKSHOP_HAS_CUDA (about 15 lines)
  TORCH_CHECK(false, "TODO(lesson4, step 2): get_rng_state() is not implemented yet");
}
// [get_rng_state]

// [set_rng_state]
void set_rng_state(const RngState& state) {
  // TODO(lesson4, step 2): Reject a state without a CPU part; set_state() the CPU generator under its mutex, and the
  // CUDA one when state.cuda is defined (about 15 lines)
  TORCH_CHECK(false, "TODO(lesson4, step 2): set_rng_state() is not implemented yet");
}
// [set_rng_state]

namespace {

// What backward needs besides the saved tensors: the segment itself and the state of the first run. It
// travels in ctx->saved_data as a capsule: at::IValue::make_capsule(state) and back with
// c10::static_intrusive_pointer_cast<SegmentState>(ctx->saved_data["state"].toCapsule()).
struct SegmentState : torch::CustomClassHolder {
  Segment segment;
  RngState rng;
  AutocastState autocast;
  size_t num_inputs = 0;
};

// [checkpoint_function]
class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<SegmentState> state, at::TensorList inputs,
                                                at::TensorList parameters) {
    // TODO(lesson4, step 2): Record the input count, RNG state and autocast state in `state`; run the segment; save
    // inputs and parameters and the state capsule in ctx; return the outputs (about 10 lines)
    TORCH_CHECK(false, "TODO(lesson4, step 2): CheckpointFunction::forward() is not implemented yet");
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    // TODO(lesson4, step 2): Rerun the segment on fresh leaves of the inputs with grad on and the forward's RNG and
    // autocast state, then torch::autograd::grad to inputs and parameters (about 50 lines)
    TORCH_CHECK(false, "TODO(lesson4, step 2): CheckpointFunction::backward() is not implemented yet");
  }
};
// [checkpoint_function]

}  // namespace

// [checkpoint]
std::vector<at::Tensor> checkpoint(const Segment& segment, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& parameters) {
  // TODO(lesson4, step 2): Reject bad input (checkpoint.h); with grad mode off return segment(inputs); refuse when
  // nothing requires grad; else CheckpointFunction::apply(...) (about 15 lines)
  TORCH_CHECK(false, "TODO(lesson4, step 2): checkpoint() is not implemented yet");
}
// [checkpoint]

}  // namespace mem
