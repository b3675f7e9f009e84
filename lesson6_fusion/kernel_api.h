// Lesson 6 — what the C++ files and the CUDA file (fused_adamw_cuda.cu) share. No LibTorch and no CUDA header
// in here: nvcc compiles the .cu file with this header and grid.h alone, so the CUDA file builds in seconds and
// does not depend on which LibTorch is installed. fused_adamw.h includes it.
#pragma once

#include <cstdint>

namespace fusion {

/// AdamW's hyper-parameters, with torch::optim::AdamWOptions' defaults (amsgrad is not supported).
struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

namespace cuda {

/// The grid of a grid-stride kernel: `blocks` blocks of `threads` threads; thread t of the grid handles
/// packs t, t + blocks * threads, t + 2 * blocks * threads, ... where a pack is `vector_width` neighbouring
/// elements that one load instruction reads.
struct LaunchShape {
  int64_t blocks = 0;
  int threads = 0;
};

constexpr int kThreadsPerBlock = 256;        ///< threads per block of every kernel of the lesson
constexpr int kBlocksPerMultiprocessor = 4;  ///< the grid stops growing at this many blocks per multiprocessor

/// Step 6. The launch shape for `numel` elements read `vector_width` at a time on a GPU with `multiprocessors`
/// streaming multiprocessors: kThreadsPerBlock threads per block, and enough blocks for one pack per thread
/// (the last pack may be partial), but at most kBlocksPerMultiprocessor blocks per multiprocessor (1024 threads:
/// half of what an H100 or H200 multiprocessor holds); past that each thread loops over more packs instead (the
/// grid-stride loop). numel 0: zero blocks.
/// Throws c10::Error (it is C++ code, fused_adamw.cc), each message ending with the value it got:
///   "launch_shape: numel must be >= 0, got -1"
///   "launch_shape: vector_width must be 1, 2, 4 or 8, got 3"
///   "launch_shape: multiprocessors must be >= 1, got 0"
LaunchShape launch_shape(int64_t numel, int vector_width, int multiprocessors);

/// Where a launch function runs its kernel: on the GPU, on the CUDA stream `stream` (a cudaStream_t); or, when
/// `simulated_multiprocessors` > 0, on the CPU: every thread of the same kernel body, one after the other, on a
/// simulated grid of that many multiprocessors, its blocks in an order shuffled by `seed` (grid.h). The checks of
/// step 6 use the simulated grid on every machine, with raw pointers to CPU memory.
struct Target {
  void* stream = nullptr;
  int simulated_multiprocessors = 0;
  uint64_t seed = 0;
};

/// The element types the CUDA kernels take (the parameter's and the gradient's; the state is float32).
enum class Dtype { Float32, BFloat16, Float16 };

/// Step 6. One AdamW step on `target`, as adamw_kernel_cpu computes it: param and grad of `dtype` (raw pointers
/// to the target's memory), exp_avg and exp_avg_sq float32, `numel` elements each; on a GPU asynchronously. Packs
/// of four elements (16 bytes of float32, 8 bytes of a 16-bit type) where every pointer is aligned to its pack,
/// one element at a time where one is not. Returns nullptr once the kernel is queued (GPU) or has run (simulated
/// grid), or the text of the error. The caller has checked the tensors (given_cuda.cc: step 3's checks).
/// Step 5's scaler on the device, without a host sync: `found_inf` (nullptr: none), when it points at a value
/// that is not 0, makes every thread return before it writes anything; `grad_scale` (nullptr: none) makes each
/// gradient element, read as float32, be multiplied by float(1.0 / double(*grad_scale)) before the update, in a
/// register (the gradient in memory is not written). `state_step` (nullptr: none; then `step` is the step's
/// number) holds the steps taken so far: each thread reads the step's number as *state_step + 1 and computes the
/// bias corrections from it, in double, as the host does from `step`; after the update kernel, advance_step()
/// (grid.h, a second launch on the same target) adds 1 to it unless found_inf skipped the step, so a skipped step
/// does not count and nothing is read on the host. All three point into the target's memory.
const char* launch_adamw(Dtype dtype, void* param, const void* grad, float* exp_avg, float* exp_avg_sq, int64_t numel,
                         const AdamWHyper& hyper, int64_t step, const Target& target, const float* grad_scale = nullptr,
                         const float* found_inf = nullptr, float* state_step = nullptr);

/// One tuple of the multi-tensor AdamW step, as raw pointers to the target's memory (param and grad of `dtype`, the
/// state float32), `numel` elements each.
struct TensorPointers {
  Dtype dtype = Dtype::Float32;
  void* param = nullptr;
  const void* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  int64_t numel = 0;
};

/// The multi-tensor launches' limits, as ATen's multi_tensor_apply (MultiTensorApply.cuh) sets them for four lists:
/// a launch carries the pointers of at most kMaxTensorsPerLaunch tensors and has at most kMaxBlocksPerLaunch blocks,
/// each block one chunk of kChunkElements elements of one tensor (the last chunk of a tensor may be shorter). The
/// chunk list travels to the GPU as the kernel's argument (a few KiB: kernel arguments are limited in size).
constexpr int kMaxTensorsPerLaunch = 36;
constexpr int kMaxBlocksPerLaunch = 320;
constexpr int64_t kChunkElements = 65536;

/// Step 6. One AdamW step for each of `count` tuples, in as few launches as the limits allow: one series of
/// launches per dtype (float32, bfloat16, float16: a launch has one element type), each taking its tuples in the
/// list's order, their chunks in order, a launch sent when it holds kMaxBlocksPerLaunch chunks or when its next
/// tensor would be one too many (a tensor's chunks may then go on in the next launch).
/// Empty tensors take no chunk. Packs of four where every pointer of every tensor of the launch is aligned to a
/// pack (and kChunkElements keeps chunks aligned), one element at a time otherwise. Each element as launch_adamw()
/// computes it (the same update, bit for bit), step 5's grad_scale, found_inf and state_step as there (one
/// state_step for the whole list: advance_step() once, after the last launch, also when there was none). Writes
/// the number of update launches to *launches when it is not nullptr (advance_step's is not counted). Returns
/// nullptr or the text of the error (the first launch's).
const char* launch_adamw_multi(const TensorPointers* tensors, int64_t count, const AdamWHyper& hyper, int64_t step,
                               const Target& target, const float* grad_scale, const float* found_inf, float* state_step,
                               int64_t* launches);

/// One gradient of the multi-tensor unscale: a raw pointer to the target's memory, its dtype and `numel` elements.
struct GradPointer {
  Dtype dtype = Dtype::Float32;
  void* grad = nullptr;
  int64_t numel = 0;
};

/// The multi-tensor unscale's limit on gradients per launch: ATen's multi_tensor_apply table for one list (its
/// `_amp_foreach_non_finite_check_and_unscale_` runs on it); blocks per launch and chunk as above.
constexpr int kMaxGradsPerLaunch = 110;

/// Step 6. The fused unscale of step 5 on `target` for `count` gradients, in as few launches as launch_adamw_multi()
/// makes (a series per dtype, the same walk over chunks, kMaxGradsPerLaunch gradients per launch): multiplies
/// every element by *inv_scale (a pointer to the target's memory; 1 leaves them as they are) and sets *found_inf
/// = 1 if any was inf or NaN before the multiply; otherwise *found_inf keeps its value. Packs of four where every
/// gradient of the launch is aligned to a pack. Writes the number of launches to *launches when it is not nullptr.
/// Returns nullptr or the error's text.
const char* launch_unscale(const GradPointer* grads, int64_t count, float* found_inf, const float* inv_scale,
                           const Target& target, int64_t* launches);

}  // namespace cuda
}  // namespace fusion
