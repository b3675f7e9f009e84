// Given code for lesson 6: nothing to do here. The call of the operator through the dispatcher, and the unfused
// AdamW step that the lesson fuses (the demo's baseline and the napkin's model). Both the skeleton and the
// reference solution link this file.
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <ATen/TensorOperators.h>  // Tensor with its methods and operators
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <torch/library.h>
#include <torch/optim/adamw.h>

#include "lesson6_fusion/fused_adamw.h"

namespace fusion {

namespace {

// The operator `name`, which the lesson's step `step` registers; a clear error naming that step while it is not
// registered (the dispatcher's own message names only the operator).
c10::OperatorHandle find_operator(const char* name, int step) {
  // findSchema, not findOp: the version-counter kernel below registers the name before your schema exists.
  const c10::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findSchema(c10::OperatorName(name, ""));
  TORCH_CHECK(
      op.has_value(), "Could not find schema for ", name, ": the operator is not registered yet. Step ", step,
      " of lesson 6 registers it (its TORCH_LIBRARY / TORCH_LIBRARY_FRAGMENT in lesson6_fusion/fused_adamw.cc); ",
      "`bazel run //lesson6_fusion:demo` runs the reference solution");
  return *op;
}

}  // namespace

void fused_adamw_(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                  const AdamWHyper& hyper, int64_t step, const c10::optional<at::Tensor>& grad_scale,
                  const c10::optional<at::Tensor>& found_inf, const c10::optional<at::Tensor>& state_step) {
  // Found once, by name; typed<> checks the C++ signature against the registered schema.
  static const auto op = find_operator(kOpName, 3)
                             .typed<void(at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&, double, double,
                                         double, double, double, int64_t, const c10::optional<at::Tensor>&,
                                         const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&)>();
  at::NoGradGuard no_grad;  // an optimizer step is not part of the autograd graph (parameters are leaves)
  op.call(param, grad, exp_avg, exp_avg_sq, hyper.lr, hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay, step,
          grad_scale, found_inf, state_step);
}

void fused_adamw_(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                  const AdamWHyper& hyper, int64_t step, const c10::optional<at::Tensor>& grad_scale,
                  const c10::optional<at::Tensor>& found_inf) {
  fused_adamw_(param, grad, exp_avg, exp_avg_sq, hyper, step, grad_scale, found_inf, c10::nullopt);
}

void fused_adamw_(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                  const AdamWHyper& hyper, int64_t step) {
  fused_adamw_(param, grad, exp_avg, exp_avg_sq, hyper, step, c10::nullopt, c10::nullopt, c10::nullopt);
}

void fused_adamw_multi_(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                        const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                        const AdamWHyper& hyper, int64_t step, const c10::optional<at::Tensor>& grad_scale,
                        const c10::optional<at::Tensor>& found_inf, const c10::optional<at::Tensor>& state_step) {
  static const auto op = find_operator(kMultiOpName, 4)
                             .typed<void(at::TensorList, at::TensorList, at::TensorList, at::TensorList, double, double,
                                         double, double, double, int64_t, const c10::optional<at::Tensor>&,
                                         const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&)>();
  at::NoGradGuard no_grad;
  const bool no_tensor = params.empty() && grads.empty() && exp_avgs.empty() && exp_avg_sqs.empty() &&
                         !is_given(grad_scale) && !is_given(found_inf) && !is_given(state_step);
  if (no_tensor) {
    // The dispatcher chooses a kernel by the arguments' devices: with no tensor it has none. The CPU kernel checks
    // the step and the hyper-parameters as for any list, and has nothing to update.
    fused_adamw_multi_cpu(params, grads, exp_avgs, exp_avg_sqs, hyper.lr, hyper.beta1, hyper.beta2, hyper.eps,
                          hyper.weight_decay, step, grad_scale, found_inf, state_step);
    return;
  }
  op.call(params, grads, exp_avgs, exp_avg_sqs, hyper.lr, hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay, step,
          grad_scale, found_inf, state_step);
}

void fused_adamw_multi_(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                        const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                        const AdamWHyper& hyper, int64_t step, const c10::optional<at::Tensor>& grad_scale,
                        const c10::optional<at::Tensor>& found_inf) {
  fused_adamw_multi_(params, grads, exp_avgs, exp_avg_sqs, hyper, step, grad_scale, found_inf, c10::nullopt);
}

void fused_adamw_multi_(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                        const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                        const AdamWHyper& hyper, int64_t step) {
  fused_adamw_multi_(params, grads, exp_avgs, exp_avg_sqs, hyper, step, c10::nullopt, c10::nullopt, c10::nullopt);
}

void fused_unscale_(const std::vector<at::Tensor>& grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  static const auto op = find_operator(kUnscaleOpName, 5).typed<void(at::TensorList, at::Tensor&, const at::Tensor&)>();
  at::NoGradGuard no_grad;
  op.call(grads, found_inf, inv_scale);
}

// [version_counter]
namespace {

// The lesson's operators behind the ADInplaceOrView key, as torch's in-place ops have one: the call goes on to the
// device's kernel, then every tensor the schema marks as written ((a!), also in a list) gets its version counter
// bumped. An autograd graph that saved one of them (a parameter used in the forward pass) then refuses to run
// backward ("modified by an inplace operation") instead of using the updated values. A refused call (an error in
// the kernel's checks) bumps nothing. (ATen's fused optimizers get the same from their generated kernels.)
void bump_versions_after(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const std::vector<c10::Argument>& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  std::vector<at::Tensor> written;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::AliasInfo* alias = arguments[i].alias_info();
    if (alias == nullptr || !alias->isWrite()) continue;
    const c10::IValue& value = (*stack)[first + i];
    if (value.isTensor()) {
      written.push_back(value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorVector()) written.push_back(t);
    }
  }
  op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  for (const at::Tensor& t : written) {
    if (t.defined()) t.unsafeGetTensorImpl()->bump_version();
  }
}

}  // namespace

}  // namespace fusion

TORCH_LIBRARY_IMPL(workshop, ADInplaceOrView, m) {
  m.impl("fused_adamw_", torch::CppFunction::makeFromBoxedFunction<&fusion::bump_versions_after>());
  m.impl("fused_adamw_multi_", torch::CppFunction::makeFromBoxedFunction<&fusion::bump_versions_after>());
  m.impl("fused_unscale_", torch::CppFunction::makeFromBoxedFunction<&fusion::bump_versions_after>());
}
// [version_counter]

namespace fusion {

namespace {

// -1 until the first cpu_isa() reads the environment; then the CpuIsa in use.
std::atomic<int> isa_in_use{-1};

// The runs of each copy of a kernel's loop (note_loop_copy), by CpuIsa.
std::atomic<int64_t> copies_run[2] = {{0}, {0}};

}  // namespace

// [cpu_isa]
CpuIsa best_cpu_isa() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2 ? CpuIsa::kAvx2 : CpuIsa::kBaseline;
#else
  return CpuIsa::kBaseline;  // the reference compiles no other variant here
#endif
}

CpuIsa cpu_isa() {
  int isa = isa_in_use.load(std::memory_order_relaxed);
  if (isa < 0) {
    const char* capability = std::getenv("ATEN_CPU_CAPABILITY");
    const bool baseline = capability != nullptr && std::strcmp(capability, "default") == 0;
    int expected = -1;
    isa_in_use.compare_exchange_strong(expected, static_cast<int>(baseline ? CpuIsa::kBaseline : best_cpu_isa()));
    isa = isa_in_use.load(std::memory_order_relaxed);
  }
  return static_cast<CpuIsa>(isa);
}

void set_cpu_isa(CpuIsa isa) {
  TORCH_CHECK(isa == CpuIsa::kBaseline || best_cpu_isa() == CpuIsa::kAvx2, "set_cpu_isa: this CPU cannot run ",
              cpu_isa_name(isa), " (it needs AVX2 and FMA)");
  isa_in_use.store(static_cast<int>(isa), std::memory_order_relaxed);
}

const char* cpu_isa_name(CpuIsa isa) { return isa == CpuIsa::kAvx2 ? "avx2" : "baseline"; }

void note_loop_copy(CpuIsa isa) { copies_run[isa == CpuIsa::kAvx2 ? 1 : 0].fetch_add(1, std::memory_order_relaxed); }

int64_t loop_copies_run(CpuIsa isa) { return copies_run[isa == CpuIsa::kAvx2 ? 1 : 0].load(std::memory_order_relaxed); }
// [cpu_isa]

bool is_given(const c10::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

bool has_cuda_kernel() {
  const auto op = c10::Dispatcher::singleton().findOp(c10::OperatorName(kOpName, ""));
  return op.has_value() && op->hasKernelForDispatchKey(c10::DispatchKey::CUDA);
}

torch::optim::AdamWOptions adamw_options(const AdamWHyper& hyper) {
  return torch::optim::AdamWOptions(hyper.lr)
      .betas({hyper.beta1, hyper.beta2})
      .eps(hyper.eps)
      .weight_decay(hyper.weight_decay);
}

void unfused_adamw_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                        const AdamWHyper& hyper, int64_t step) {
  // The same operations, in the same order and with the same scalars, as LibTorch's torch::optim::AdamW::step.
  if (hyper.weight_decay != 0) param.mul_(1 - hyper.lr * hyper.weight_decay);
  const double bias_correction1 = 1 - std::pow(hyper.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(hyper.beta2, static_cast<double>(step));
  exp_avg.mul_(hyper.beta1).add_(grad, 1 - hyper.beta1);
  exp_avg_sq.mul_(hyper.beta2).addcmul_(grad, grad, 1 - hyper.beta2);
  const at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(hyper.eps);  // two temporaries
  param.addcdiv_(exp_avg, denom, -hyper.lr / bias_correction1);
}

}  // namespace fusion
