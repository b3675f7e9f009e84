// Reference solution of lesson 4, steps 2 and 3 (lesson4_memory/checkpoint.h).
#include "lesson4_memory/checkpoint.h"

#include <mutex>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard, at::AutoGradMode (ATen.h does not bring it in 2.x)
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
  RngState state;
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    state.cpu = cpu.get_state();  // a byte tensor: a copy, later draws do not change it
  }
  if (cuda_device >= 0) {
#if WORKSHOP_HAS_CUDA
    at::Generator cuda = at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(cuda_device));
    std::lock_guard<std::mutex> lock(cuda.mutex());
    state.cuda = cuda.get_state();
    state.cuda_device = cuda_device;
#else
    TORCH_CHECK(false, "get_rng_state: this LibTorch has no CUDA, cannot capture cuda:", cuda_device);
#endif
  }
  return state;
}
// [get_rng_state]

// [set_rng_state]
void set_rng_state(const RngState& state) {
  TORCH_CHECK(state.cpu.defined(), "set_rng_state: the state has no CPU generator state");
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_state(state.cpu);
  }
  if (state.cuda.defined()) {
#if WORKSHOP_HAS_CUDA
    at::Generator cuda = at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(state.cuda_device));
    std::lock_guard<std::mutex> lock(cuda.mutex());
    cuda.set_state(state.cuda);
#else
    TORCH_CHECK(false, "set_rng_state: this LibTorch has no CUDA, cannot restore a CUDA state");
#endif
  }
}
// [set_rng_state]

namespace {

// Puts the random stream back as it was when this object was made, on every way out of the scope (an
// exception from the recomputed segment included).
class RngRestore {
 public:
  explicit RngRestore(int cuda_device) : saved_(get_rng_state(cuda_device)) {}
  ~RngRestore() {
    try {
      set_rng_state(saved_);
    } catch (...) {
      // a destructor must not throw
    }
  }
  RngRestore(const RngRestore&) = delete;
  RngRestore& operator=(const RngRestore&) = delete;

 private:
  RngState saved_;
};

// What backward needs besides the saved tensors: the segment itself and the state of the first run.
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
    // apply() runs this under no-grad mode: the segment's intermediate tensors are freed as it goes.
    std::vector<at::Tensor> saved(inputs.begin(), inputs.end());
    saved.insert(saved.end(), parameters.begin(), parameters.end());
    state->num_inputs = inputs.size();
    state->rng = get_rng_state(cuda_device_of(saved));
    state->autocast = current_autocast_state();
    std::vector<at::Tensor> outputs = state->segment(std::vector<at::Tensor>(inputs.begin(), inputs.end()));
    TORCH_CHECK(!outputs.empty(), "checkpoint: the segment returned no tensors");
    ctx->save_for_backward(saved);  // only the segment's inputs are kept (parameters live in the model anyway)
    ctx->saved_data["state"] = at::IValue::make_capsule(state);
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<SegmentState>(ctx->saved_data["state"].toCapsule());
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    const size_t n = state->num_inputs;
    // Fresh leaves for the inputs, so the recomputed graph stops here and we can ask for their gradients.
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < n; ++i) inputs.push_back(saved[i].detach().requires_grad_(saved[i].requires_grad()));

    std::vector<at::Tensor> outputs;
    {
      const RngRestore restore(state->rng.cuda_device);  // backward must not disturb the training loop's stream
      set_rng_state(state->rng);                         // the same dropout masks as in forward
      AutocastReplay autocast(state->autocast);
      at::AutoGradMode grad_mode(true);
      outputs = state->segment(inputs);
    }

    // Differentiate the recomputed outputs with respect to what can receive a gradient.
    std::vector<at::Tensor> roots, root_grads, wrt;
    std::vector<size_t> wrt_slot;
    bool any_output_requires_grad = false;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      any_output_requires_grad = any_output_requires_grad || outputs[i].requires_grad();
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    // As PyTorch: silently returning no gradient would hide a segment that detaches its result.
    TORCH_CHECK(any_output_requires_grad,
                "checkpoint: no recomputed output requires grad (does the segment detach "
                "its result or compute it under no-grad?); nothing can flow back through this checkpoint");
    for (size_t i = 0; i < saved.size(); ++i) {
      const at::Tensor& target = i < n ? inputs[i] : saved[i];
      if (target.requires_grad()) {
        wrt.push_back(target);
        wrt_slot.push_back(i);
      }
    }
    // One slot per forward argument: the state (no gradient), then inputs, then parameters.
    torch::autograd::variable_list grads(1 + saved.size());
    if (roots.empty() || wrt.empty()) return grads;
    const auto computed = torch::autograd::grad(roots, wrt, root_grads, /*retain_graph=*/false,
                                                /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < wrt.size(); ++k) grads[1 + wrt_slot[k]] = computed[k];
    return grads;
  }
};
// [checkpoint_function]

}  // namespace

// [checkpoint]
std::vector<at::Tensor> checkpoint(const Segment& segment, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& parameters) {
  TORCH_CHECK(static_cast<bool>(segment), "checkpoint: the segment is empty");
  TORCH_CHECK(!inputs.empty(), "checkpoint: the segment has no inputs");
  for (const at::Tensor& t : inputs) TORCH_CHECK(t.defined(), "checkpoint: an input is undefined");
  if (!at::GradMode::is_enabled()) return segment(inputs);  // evaluation: nothing to save anyway
  bool any_requires_grad = false;
  for (const at::Tensor& t : inputs) any_requires_grad = any_requires_grad || t.requires_grad();
  for (const at::Tensor& p : parameters) any_requires_grad = any_requires_grad || p.requires_grad();
  TORCH_CHECK(any_requires_grad,
              "checkpoint: none of the segment's inputs or parameters requires grad, so no gradient could flow "
              "through it (pass the parameters it uses, or an input that requires grad)");
  auto state = c10::make_intrusive<SegmentState>();
  state->segment = segment;
  return CheckpointFunction::apply(state, at::TensorList(inputs), at::TensorList(parameters));
}
// [checkpoint]

}  // namespace mem
