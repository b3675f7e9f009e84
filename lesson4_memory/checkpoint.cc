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
  // TODO(lesson4, step 2): state.cpu = the default CPU generator's get_state() (at::detail::
  // getDefaultCPUGenerator(); hold its mutex() while you read). If cuda_device >= 0: the same with
  // at::cuda::detail::getDefaultCUDAGenerator(cuda_device) inside #if WORKSHOP_HAS_CUDA (an error otherwise),
  // and remember cuda_device.
  TORCH_CHECK(false, "TODO(lesson4, step 2): get_rng_state() is not implemented yet");
}
// [get_rng_state]

// [set_rng_state]
void set_rng_state(const RngState& state) {
  // TODO(lesson4, step 2): Reject a state without a CPU part ("CPU"). set_state() the CPU generator (under its
  // mutex), and the CUDA one when state.cuda is defined.
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
    // TODO(lesson4, step 2): apply() already runs this with grad mode off. Record in `state` the number of
    // inputs, the RNG state (get_rng_state(cuda_device_of(...))) and current_autocast_state(). Run the
    // segment (reject an empty result: "returned no tensors"). save_for_backward(inputs then parameters),
    // put the state capsule in ctx->saved_data["state"], return the outputs.
    TORCH_CHECK(false, "TODO(lesson4, step 2): CheckpointFunction::forward() is not implemented yet");
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    // TODO(lesson4, step 2): Get the state and the saved tensors. Detach the inputs into fresh leaves
    // (requires_grad as the originals). Save the current RNG state, set the forward's, and with
    // AutocastReplay(state->autocast) and at::AutoGradMode(true) run the segment again; put the RNG state
    // back, also if the segment throws (a small RAII object whose destructor calls set_rng_state). If no
    // recomputed output requires grad, throw "no recomputed output requires grad". Then
    // torch::autograd::grad(outputs that require grad, [inputs and parameters that require grad],
    // their grad_outputs, false, false, /*allow_unused=*/true). Return one slot per forward argument:
    // undefined for the state, then the inputs' gradients, then the parameters'.
    TORCH_CHECK(false, "TODO(lesson4, step 2): CheckpointFunction::backward() is not implemented yet");
  }
};
// [checkpoint_function]

}  // namespace

// [checkpoint]
std::vector<at::Tensor> checkpoint(const Segment& segment, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& parameters) {
  // TODO(lesson4, step 2): Reject an empty segment ("segment is empty"), no inputs ("no inputs") and
  // undefined inputs. With grad mode off (at::GradMode::is_enabled()) just return segment(inputs). Reject
  // the case where no input and no parameter requires grad ("requires grad"). Then
  // CheckpointFunction::apply(c10::make_intrusive<SegmentState>() holding the segment, at::TensorList(inputs),
  // at::TensorList(parameters)).
  TORCH_CHECK(false, "TODO(lesson4, step 2): checkpoint() is not implemented yet");
}
// [checkpoint]

}  // namespace mem
