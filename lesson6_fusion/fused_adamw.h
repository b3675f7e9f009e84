// Lesson 6 — fused kernels. One AdamW step for one parameter tensor in a single pass over memory, registered as
// a real LibTorch operator, `workshop::fused_adamw_`, that the dispatcher finds by name.
//
// torch::optim::AdamW updates a parameter with eight or nine separate tensor operations, each reading its
// inputs from memory and writing its result back. The step is memory-bound, so the bytes moved are the cost; a
// fused kernel reads each of param, grad, exp_avg and exp_avg_sq once and writes three of them once.
// See lesson6_fusion/README.md.
#pragma once

#include <cstdint>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Optional.h>

#include "lesson6_fusion/kernel_api.h"  // AdamWHyper; step 6: the CUDA kernels' interface

namespace at {
class Tensor;
}  // namespace at
namespace torch {
namespace optim {
struct AdamWOptions;
}  // namespace optim
}  // namespace torch

namespace fusion {

/// The memory traffic of one AdamW step over one parameter tensor, by the napkin: every operation reads each of
/// its tensor operands once from memory and writes its result once (no cache reuse between operations).
struct Traffic {
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  int64_t temporary_bytes = 0;  ///< bytes of the intermediate tensors the step allocates (and frees)
  int64_t passes = 0;           ///< tensor operations, i.e. passes over memory
  int64_t total() const { return bytes_read + bytes_written; }
};

/// Step 1. The traffic of torch::optim::AdamW's step (LibTorch's adamw.cpp, one tensor op at a time) over a
/// parameter of `numel` elements of `dtype`, whose state (exp_avg, exp_avg_sq) has the same dtype, as
/// torch::optim::AdamW keeps it. With `weight_decay` the step starts with one more pass (p.mul_(1 - lr * wd)).
/// Throws c10::Error "adamw_traffic: numel must be >= 0" or "adamw_traffic: dtype must be floating point".
Traffic unfused_adamw_traffic(int64_t numel, c10::ScalarType dtype, bool weight_decay);

/// Step 1. The traffic of one fused pass: read param, grad, exp_avg and exp_avg_sq once, write param, exp_avg
/// and exp_avg_sq once; no temporaries, one pass. The parameter and gradient have `param_dtype`, the state is
/// float32 (7 x numel x 4 bytes for a float32 parameter).
/// The same errors as unfused_adamw_traffic().
Traffic fused_adamw_traffic(int64_t numel, c10::ScalarType param_dtype);

/// Step 2. The fused CPU kernel: one AdamW step, exactly as torch::optim::AdamW computes it, in one pass with
/// at::parallel_for and at::vec::Vectorized<float>. `step` is the step number after this update (1 for the
/// first), for the bias corrections. Decoupled weight decay: p *= 1 - lr * weight_decay, then the Adam update.
/// param and grad: float32, bfloat16 or float16 (the same dtype); exp_avg and exp_avg_sq: float32. 16-bit
/// parameters are computed in float32 and written back rounded to nearest.
/// Every gradient element is read as float32 and multiplied by `grad_multiplier` before the update (in float32,
/// in a register: the gradient in memory is not written). 1 leaves it as it is; step 5's scaler passes 1/scale,
/// so that one pass both unscales and steps.
/// Assumes inputs that check_adamw_args() accepts (it checks nothing itself).
void adamw_kernel_cpu(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                      const AdamWHyper& hyper, int64_t step, float grad_multiplier = 1.0f);

/// Given. The instruction sets a CPU kernel may be compiled for, chosen at run time as ATen's DispatchStub chooses
/// its CPU_CAPABILITY: kBaseline runs on every CPU of the architecture (SSE2 on x86-64: 4 float lanes per
/// instruction); kAvx2 needs AVX2 and FMA (8 lanes). The reference's step 2 and 4 kernels compile their loop for
/// both and take cpu_isa()'s; your kernel may ignore it (the checks pass either way, only the speed differs).
enum class CpuIsa { kBaseline, kAvx2 };

/// Given. The widest instruction set this CPU runs (kAvx2 on an x86-64 with AVX2 and FMA, else kBaseline).
CpuIsa best_cpu_isa();

/// Given. The instruction set the kernels use now: best_cpu_isa(), unless the environment variable
/// ATEN_CPU_CAPABILITY is "default" (ATen's own switch: then ATen's kernels and these both run the baseline) or
/// set_cpu_isa() chose another.
CpuIsa cpu_isa();

/// Given. Makes the kernels use `isa` from now on (the checks compare the two; the bench measures both). Throws
/// c10::Error "set_cpu_isa: this CPU cannot run avx2 (it needs AVX2 and FMA)" for an ISA the CPU lacks.
void set_cpu_isa(CpuIsa isa);

/// Given. "baseline" or "avx2".
const char* cpu_isa_name(CpuIsa isa);

/// Given. Counts the runs of each compiled copy of a kernel's loop: a kernel whose loop is compiled for both
/// instruction sets calls note_loop_copy() in each copy (the reference: once per range a copy is called for), so
/// that a check can see that set_cpu_isa() really switches copies; loop_copies_run() reads the count. A kernel with
/// one copy of its loop need not call it (that check then says it is skipped).
void note_loop_copy(CpuIsa isa);
int64_t loop_copies_run(CpuIsa isa);

/// Step 3. Rejects every input the kernel cannot handle, with a c10::Error whose message starts
/// "fused_adamw_: " and names the problem:
///   "param is undefined", "grad is undefined", "exp_avg is undefined", "exp_avg_sq is undefined"
///   "param, grad, exp_avg and exp_avg_sq must have the same shape"
///   "param must be float32, bfloat16 or float16"
///   "grad must have param's dtype"
///   "exp_avg and exp_avg_sq must be float32"
///   "all tensors must be on one device"
///   "param is not contiguous", "grad is not contiguous", "exp_avg is not contiguous",
///   "exp_avg_sq is not contiguous"
///   "param and grad overlap in memory", "param and exp_avg overlap in memory",
///   "param and exp_avg_sq overlap in memory", "grad and exp_avg overlap in memory",
///   "grad and exp_avg_sq overlap in memory", "exp_avg and exp_avg_sq overlap in memory"
///   (the first of the six pairs, in this order, that shares bytes)
///   "step must be >= 1"
///   "lr must be >= 0", "eps must be >= 0", "weight_decay must be >= 0"
///   "beta1 must be in [0, 1)", "beta2 must be in [0, 1)"
/// (each with the value it got). Empty tensors are accepted.
void check_adamw_args(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                      const at::Tensor& exp_avg_sq, const AdamWHyper& hyper, int64_t step);

/// Step 3. The CPU kernel of the operator workshop::fused_adamw_: check_adamw_args(), then adamw_kernel_cpu().
/// Registered with TORCH_LIBRARY / TORCH_LIBRARY_IMPL in the lesson's .cc. The keyword-only grad_scale, found_inf
/// and state_step (step 5) go to scaler_gate_cpu() when one is given (given code: nothing to write for them in
/// step 3); with state_step it is checked as the step's number, state_step + 1 (at least 1), and advanced by 1
/// after a step that was not skipped.
void fused_adamw_cpu(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, double lr,
                     double beta1, double beta2, double eps, double weight_decay, int64_t step,
                     const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf,
                     const c10::optional<at::Tensor>& state_step);

/// Step 4. The multi-tensor kernel: one AdamW step for every tuple (params[i], grads[i], exp_avgs[i],
/// exp_avg_sqs[i]) in ONE at::parallel_for over all their elements together, instead of one parallel region per
/// tensor. Each tuple may have its own dtype (float32, bfloat16, float16 parameters; float32 state). The result
/// for each tensor is bit for bit what adamw_kernel_cpu gives it. Assumes check_adamw_multi_args() accepted it.
/// `grad_multiplier` as in adamw_kernel_cpu(), for every tuple.
void adamw_multi_kernel_cpu(c10::ArrayRef<at::Tensor> params, c10::ArrayRef<at::Tensor> grads,
                            c10::ArrayRef<at::Tensor> exp_avgs, c10::ArrayRef<at::Tensor> exp_avg_sqs,
                            const AdamWHyper& hyper, int64_t step, float grad_multiplier = 1.0f);

/// Step 4. The checks of the multi-tensor operator, each a c10::Error whose message starts
/// "fused_adamw_multi_: ":
///   "fused_adamw_multi_: step must be >= 1, got 0"    (first, also for empty lists: check_adamw_args()'s rules
///                                                      on the step and the hyper-parameters, in its order, with
///                                                      this prefix: "lr must be >= 0", ... "beta2 must be in [0, 1)")
///   "the lists must have one length"                  (with the four lengths)
///   "tensor 2: fused_adamw_: grad is not contiguous"  (check_adamw_args() of each tuple, with its index)
///   "all tensors must be on one device"               (tuples on different devices, e.g. "tensor 2 is on meta,
///                                                      tensor 0 on cpu"; refused before anything is written)
///   "params[1] and params[0] overlap in memory"       (any two tensors of different tuples that share bytes)
/// Empty lists and empty tensors are accepted.
void check_adamw_multi_args(c10::ArrayRef<at::Tensor> params, c10::ArrayRef<at::Tensor> grads,
                            c10::ArrayRef<at::Tensor> exp_avgs, c10::ArrayRef<at::Tensor> exp_avg_sqs,
                            const AdamWHyper& hyper, int64_t step);

/// Step 4. The CPU kernel of workshop::fused_adamw_multi_: check_adamw_multi_args(), then adamw_multi_kernel_cpu()
/// (grad_scale, found_inf and state_step as in fused_adamw_cpu(), one state_step for the whole list, held to the
/// device of tuple 0, or to the CPU for empty lists).
void fused_adamw_multi_cpu(c10::ArrayRef<at::Tensor> params, c10::ArrayRef<at::Tensor> grads,
                           c10::ArrayRef<at::Tensor> exp_avgs, c10::ArrayRef<at::Tensor> exp_avg_sqs, double lr,
                           double beta1, double beta2, double eps, double weight_decay, int64_t step,
                           const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf,
                           const c10::optional<at::Tensor>& state_step);

/// Step 5. The fused unscale + non-finite check of lesson 1's GradScaler, as ATen's
/// `_amp_foreach_non_finite_check_and_unscale_` computes it: multiplies every element of every gradient in
/// `grads` in place by inv_scale (a one-element float32 tensor; 1 leaves the values as they are) and sets
/// found_inf (a one-element float32 tensor) to 1 if any element, read before the multiplication, is inf or
/// NaN; otherwise found_inf keeps its value (zeroing it is the caller's job). Every element is read once and
/// written once, in ONE at::parallel_for over all the gradients laid end to end (the pieces of step 4).
/// Gradients of float32, bfloat16 or float16 (computed in float32, rounded back to nearest), each with its
/// own dtype. Assumes check_unscale_args() accepted the inputs.
void unscale_kernel_cpu(c10::ArrayRef<at::Tensor> grads, at::Tensor& found_inf, const at::Tensor& inv_scale);

/// Step 5. The checks of workshop::fused_unscale_, each a c10::Error whose message starts "fused_unscale_: ":
///   "found_inf must be a defined one-element float32 tensor"
///   "inv_scale must be a defined one-element float32 tensor"
///   "found_inf and inv_scale must be on one device"
///   "grad 1 is undefined"
///   "grad 1 must be float32, bfloat16 or float16"
///   "grad 1 is not on found_inf's device"
///   "grad 1 is not contiguous"
///   "grads[1] and grads[0] overlap in memory"   (any two gradients that share bytes: each would be unscaled twice)
/// (each with what it got). An empty list and empty gradients are accepted.
void check_unscale_args(c10::ArrayRef<at::Tensor> grads, const at::Tensor& found_inf, const at::Tensor& inv_scale);

/// Step 5. The CPU kernel of workshop::fused_unscale_: check_unscale_args(), then unscale_kernel_cpu().
void fused_unscale_cpu(c10::ArrayRef<at::Tensor> grads, at::Tensor& found_inf, const at::Tensor& inv_scale);

/// Step 5. What the AdamW operators do with the scaler's tensors (their keyword-only grad_scale and found_inf,
/// as ATen's `_fused_adamw_` takes them, and state_step): skip the whole update, or unscale each gradient inside
/// the one pass, with the step's number counted where the tensors are.
struct ScalerGate {
  bool skip = false;             ///< found_inf was given and is not 0: write nothing
  float grad_multiplier = 1.0f;  ///< float(1 / double(grad_scale)), 1 without grad_scale
  int64_t step = 0;              ///< the step's number: state_step's value + 1, or `step` without state_step
};

/// Given. Whether an optional tensor argument was given: present and defined (an undefined tensor counts as not
/// given, as the dispatcher may pass one for None).
bool is_given(const c10::optional<at::Tensor>& t);

/// Step 5. The rules for the scaler's tensors of `op` ("fused_adamw_" or "fused_adamw_multi_"), each given one
/// (an undefined tensor counts as not given) in this order, grad_scale, found_inf, state_step, a c10::Error whose
/// message starts "<op>: " and ends with what it got:
///   "grad_scale must be a one-element float32 tensor"     ("found_inf must be a one-element float32 tensor",
///                                                          "state_step must be a one-element float32 tensor")
///   "grad_scale is not on param's device (cpu)"           (`device`: the parameters'; "found_inf is not ...",
///                                                          "state_step is not on param's device (cpu), got meta")
/// and then, with state_step given, the operator's `step` must be 0 (the step's number is state_step + 1):
///   "step must be 0 when state_step is given, got 3"
/// On every device: the CUDA kernel reads the three on the GPU (given_cuda.cc checks with this, then passes
/// pointers).
void check_scaler_args(const char* op, c10::Device device, int64_t step, const c10::optional<at::Tensor>& grad_scale,
                       const c10::optional<at::Tensor>& found_inf, const c10::optional<at::Tensor>& state_step);

/// Step 5. On the CPU: check_scaler_args(), then read the values on the host. skip when found_inf is not 0
/// (ATen skips only when it is exactly 1; here any flag counts, e.g. one summed over several ranks);
/// grad_multiplier = float(1.0 / double(grad_scale)), the inverse GradScaler::unscale_ multiplies by, so that the
/// one pass equals unscaling first and then stepping, bit for bit; step = state_step's value + 1 with state_step
/// (the steps taken so far, a float32 as ATen's fused optimizers keep their state_steps), else `step`. More rules,
/// read on the host:
///   "<op>: grad_scale must be finite and > 0, got 0"
///   "<op>: grad_scale's inverse must be finite"   (a positive subnormal scale, 1e-40: 1 / scale overflows float32)
///   "<op>: state_step must hold a whole number in [0, 2^24), got 2.5"   (float32 counts exactly up to 2^24)
/// (a skipped step looks at neither grad_scale nor state_step's value). The operator, not the gate, adds 1 to
/// state_step after the update.
ScalerGate scaler_gate_cpu(const char* op, c10::Device device, int64_t step,
                           const c10::optional<at::Tensor>& grad_scale, const c10::optional<at::Tensor>& found_inf,
                           const c10::optional<at::Tensor>& state_step);

/// The operators' names and schemas (what TORCH_LIBRARY and, in step 4, TORCH_LIBRARY_FRAGMENT must define).
constexpr const char* kOpName = "workshop::fused_adamw_";
constexpr const char* kOpSchema =
    "fused_adamw_(Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, float lr, "
    "float beta1, float beta2, float eps, float weight_decay, int step, *, Tensor? grad_scale=None, "
    "Tensor? found_inf=None, Tensor(d!)? state_step=None) -> ()";
constexpr const char* kMultiOpName = "workshop::fused_adamw_multi_";
constexpr const char* kMultiOpSchema =
    "fused_adamw_multi_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
    "float lr, float beta1, float beta2, float eps, float weight_decay, int step, *, Tensor? grad_scale=None, "
    "Tensor? found_inf=None, Tensor(d!)? state_step=None) -> ()";
/// The schema of ATen's `_amp_foreach_non_finite_check_and_unscale_`, under the workshop's name: lesson 1's
/// GradScaler finds it by this name (amp::unscale_grads_fused) wherever this lesson is linked in.
constexpr const char* kUnscaleOpName = "workshop::fused_unscale_";
constexpr const char* kUnscaleOpSchema =
    "fused_unscale_(Tensor(a!)[] grads, Tensor(b!) found_inf, Tensor inv_scale) -> ()";

// ---- given (lesson6_fusion/given.cc) ---------------------------------------------------------------------

/// Calls workshop::fused_adamw_ through the dispatcher, found by name (c10::Dispatcher::findSchemaOrThrow), as
/// any LibTorch user would. Throws c10::Error when the operator is not registered.
/// The operators bump the version counter of every tensor they write (the schema's (a!) arguments), as torch's
/// in-place ops do (given code: an ADInplaceOrView kernel), so an autograd graph that saved a parameter refuses to
/// run backward after the step ("one of the variables needed for gradient computation has been modified by an
/// inplace operation") instead of using the updated values.
void fused_adamw_(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                  const AdamWHyper& hyper, int64_t step);

/// The same with step 5's scaler tensors (keyword-only in the schema): grad_scale, found_inf (c10::nullopt or an
/// undefined tensor: not given).
void fused_adamw_(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                  const AdamWHyper& hyper, int64_t step, const c10::optional<at::Tensor>& grad_scale,
                  const c10::optional<at::Tensor>& found_inf);

/// The same with step 5's counter too, state_step: pass step 0, the operator counts the steps taken in it.
void fused_adamw_(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                  const AdamWHyper& hyper, int64_t step, const c10::optional<at::Tensor>& grad_scale,
                  const c10::optional<at::Tensor>& found_inf, const c10::optional<at::Tensor>& state_step);

/// Calls workshop::fused_adamw_multi_ through the dispatcher, found by name. With no tensor at all (empty lists,
/// no scaler tensor) the dispatcher has no device to choose a kernel by: the CPU kernel runs (its checks, and
/// nothing to update).
void fused_adamw_multi_(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                        const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                        const AdamWHyper& hyper, int64_t step);

/// The same with step 5's scaler tensors.
void fused_adamw_multi_(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                        const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                        const AdamWHyper& hyper, int64_t step, const c10::optional<at::Tensor>& grad_scale,
                        const c10::optional<at::Tensor>& found_inf);

/// The same with step 5's counter too: one state_step for the whole list.
void fused_adamw_multi_(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                        const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                        const AdamWHyper& hyper, int64_t step, const c10::optional<at::Tensor>& grad_scale,
                        const c10::optional<at::Tensor>& found_inf, const c10::optional<at::Tensor>& state_step);

/// Calls workshop::fused_unscale_ through the dispatcher, found by name.
void fused_unscale_(const std::vector<at::Tensor>& grads, at::Tensor& found_inf, const at::Tensor& inv_scale);

/// Whether workshop::fused_adamw_ has a CUDA kernel in this binary (step 6's kernels: built where LibTorch has
/// CUDA and Bazel found nvcc). The demo and the bench ask before they run on a GPU.
bool has_cuda_kernel();

/// torch::optim::AdamW's options for these hyper-parameters: the oracle of the checks, the demo and the bench.
torch::optim::AdamWOptions adamw_options(const AdamWHyper& hyper);

/// The unfused step, one ATen op at a time, in torch::optim::AdamW's order (the baseline the lesson fuses):
///   p.mul_(1 - lr * wd)                       (only when wd != 0)
///   m.mul_(beta1).add_(g, 1 - beta1)
///   v.mul_(beta2).addcmul_(g, g, 1 - beta2)
///   denom = (v.sqrt() / sqrt(1 - beta2^step)).add_(eps)
///   p.addcdiv_(m, denom, -lr / (1 - beta1^step))
void unfused_adamw_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                        const AdamWHyper& hyper, int64_t step);

}  // namespace fusion
