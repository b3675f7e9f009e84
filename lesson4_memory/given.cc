// Lesson 4 — code the lesson gives (compiled into both the skeleton and the reference library): replaying the
// autocast state, describing a recipe, the deep MLP, its data and the training-step measurement.
#include <sstream>

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include "common/device.h"
#include "common/memory_meter.h"
#include "lesson4_memory/breakdown.h"
#include "lesson4_memory/checkpoint.h"
#include "lesson4_memory/planner.h"
#include "lesson4_memory/workload.h"
#include "common/compat/compat.h"

namespace mem {

int64_t layer_count(torch::nn::Sequential& model) { return static_cast<int64_t>(model->size()); }

Segment layers_segment(torch::nn::Sequential& model, int64_t begin, int64_t end) {
  TORCH_CHECK(0 <= begin && begin < end && end <= layer_count(model), "layers_segment: layers ", begin, " .. ", end,
              " are not a non-empty range of the model's ", layer_count(model), " layers");
  return [impl = model.ptr(), begin, end](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    TORCH_CHECK(in.size() == 1, "layers_segment: a segment of layers takes one tensor, got ", in.size());
    at::Tensor h = in[0];
    for (int64_t j = begin; j < end; ++j) h = (impl->begin() + j)->forward(h);
    return {h};
  };
}

std::vector<at::Tensor> layer_parameters(torch::nn::Sequential& model, int64_t begin, int64_t end) {
  std::vector<at::Tensor> params;
  for (int64_t j = begin; j < end; ++j) {
    for (const at::Tensor& p : model->ptr(j)->parameters()) params.push_back(p);
  }
  return params;
}

int cuda_device_of(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors) {
    if (t.defined() && t.is_cuda()) return t.get_device();
  }
  return -1;
}

AutocastState current_autocast_state() {
  AutocastState state;
  state.cpu_enabled = workshop::compat::autocast_enabled(c10::DeviceType::CPU);
  state.cpu_dtype = workshop::compat::autocast_dtype(c10::DeviceType::CPU);
  state.cuda_enabled = workshop::compat::autocast_enabled(c10::DeviceType::CUDA);
  state.cuda_dtype = workshop::compat::autocast_dtype(c10::DeviceType::CUDA);
  return state;
}

AutocastReplay::AutocastReplay(const AutocastState& state)
    : cpu_(c10::DeviceType::CPU, state.cpu_dtype, state.cpu_enabled),
      cuda_(c10::DeviceType::CUDA, state.cuda_dtype, state.cuda_enabled) {}

std::string describe(const Recipe& recipe) {
  std::ostringstream text;
  text << "micro_batch=" << (recipe.micro_batch == 0 ? std::string("all") : std::to_string(recipe.micro_batch))
       << " segments=" << recipe.segments << (recipe.low_precision ? " 16-bit" : " float32");
  return text.str();
}

BlockImpl::BlockImpl(int64_t width, double dropout)
    : linear_(register_module("linear", torch::nn::Linear(width, width))), dropout_(dropout) {}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = at::gelu(linear_->forward(x));  // [rows, width]
  return dropout_ > 0 ? at::dropout(h, dropout_, is_training()) : h;
}

torch::nn::Sequential make_deep_mlp(const MlpSpec& spec, c10::Device device) {
  TORCH_CHECK(spec.layers >= 1 && spec.width >= 1, "make_deep_mlp: layers and width must be >= 1");
  at::manual_seed(spec.seed);
  torch::nn::Sequential model;
  for (int64_t i = 0; i < spec.layers; ++i) model->push_back(Block(spec.width, spec.dropout));
  model->to(device);
  return model;
}

std::pair<at::Tensor, at::Tensor> make_batch(const MlpSpec& spec, c10::Device device) {
  at::manual_seed(spec.seed + 1);
  at::Tensor inputs = at::randn({spec.batch, spec.width}).to(device);            // [batch, width]
  at::Tensor targets = at::randn({spec.batch, spec.width}).mul(0.5).to(device);  // [batch, width]
  return {inputs, targets};
}

StepMemory measure_training(const MlpSpec& spec, const Recipe& recipe, c10::Device device, int timed_steps) {
  TORCH_CHECK(timed_steps >= 1, "measure_training: timed_steps must be >= 1, got ", timed_steps);
  workshop::MemoryMeter meter(device);  // counts from here: model, batch, optimizer state, every step
  torch::nn::Sequential model = make_deep_mlp(spec, device);
  auto batch = make_batch(spec, device);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  train_step(model, optimizer, batch.first, batch.second, recipe);  // warm-up: creates Adam's state
  set_grads_to_none(model->parameters());
  workshop::synchronize(device);

  StepMemory result;
  const int64_t warm_peak = meter.peak_bytes();
  result.resident_bytes = meter.current_bytes();
  meter.reset();  // from here the peak is what a step adds on top of the resident bytes
  const workshop::Timing timing = workshop::time_repeated(
      device, [&] { train_step(model, optimizer, batch.first, batch.second, recipe); }, 0, timed_steps);
  result.step_peak_bytes = meter.peak_bytes();
  result.total_peak_bytes = std::max(warm_peak, result.resident_bytes + result.step_peak_bytes);
  result.median_step_ms = timing.median_ms;
  return result;
}

}  // namespace mem
