// Lesson 5 — data-parallel training on N ranks with LibTorch's distributed engine (c10d).
//
// Every rank holds a full copy of the model, trains on its own equal share of the batch, and averages the
// gradients with its peers before the optimizer step, so that every rank makes exactly the update one large
// batch would have made. Then: fewer, larger messages (buckets), communication that overlaps backward
// (autograd hooks), no communication inside an accumulation window (lesson 2), agreement on skipped steps
// (lesson 1's scaler), and optimizer state sharded across the ranks (ZeRO stage 1, measured with lesson 4's
// meter). The ranks talk through dist::Comm (comm.h, given). See lesson5_distributed/README.md for the steps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "lesson2_accumulation/accumulation.h"
#include "lesson5_distributed/comm.h"

namespace amp {
class GradScaler;
}  // namespace amp
namespace torch {
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace ddp {

// ---- Step 1: rendezvous and all-reduce --------------------------------------------------------------------

/// Step 1. Rank `rank`'s equal share of `batch` along dim 0: items [rank * n / N, (rank + 1) * n / N), a view.
/// Errors: an undefined or 0-dim batch, rank outside 0 .. world_size - 1, "does not divide evenly" when the
/// item count is not a multiple of world_size (unequal shards would weigh items differently).
at::Tensor shard(const at::Tensor& batch, int rank, int world_size);

/// Step 1. Replaces `tensor` on every rank by the mean of all ranks' tensors (sum all-reduce, then / N).
void average_(dist::Comm& comm, const at::Tensor& tensor);

/// Step 1. Checks that every rank has the same parameters (count, shapes, dtypes) before any gradient is
/// exchanged. Every rank learns the result, so every rank throws the same error "parameter shapes differ
/// across ranks" (naming this rank's and the first differing rank's description) instead of hanging in a
/// collective whose sizes do not match. Uses fixed-size collectives only.
void check_same_shapes(dist::Comm& comm, const std::vector<at::Tensor>& params);

/// Step 1. The baseline: after backward, averages every parameter's gradient across the ranks with ONE
/// all-reduce PER PARAMETER (calls = number of parameters). Errors: "has no gradient" for a parameter whose
/// .grad is undefined.
void average_gradients(dist::Comm& comm, const std::vector<at::Tensor>& params);

// ---- Step 2: bucketing --------------------------------------------------------------------------------------

/// A group of parameters whose gradients travel in one flat all-reduce.
struct Bucket {
  std::vector<size_t> params;  ///< indices into the parameter list, in the order they were added
  int64_t numel = 0;           ///< elements of all its gradients together
  int64_t bytes = 0;           ///< numel * element size
};

/// Step 2. Groups parameters into buckets of at most `bucket_bytes` bytes each. Walks the parameters in
/// REVERSE order (backward produces the last layer's gradients first) and adds each to the current bucket;
/// when a parameter would push the bucket past the budget, or its dtype differs, the bucket is closed first
/// and a new one started. A parameter larger than the budget gets a bucket of its own. Every parameter is in
/// exactly one bucket. Errors: "bucket_bytes must be > 0", no parameters.
std::vector<Bucket> make_buckets(const std::vector<at::Tensor>& params, int64_t bucket_bytes);

/// Step 2. After backward, averages the gradients bucket by bucket: flatten each bucket's gradients into one
/// contiguous buffer, one all-reduce per bucket, divide by N, copy the averages back into every .grad.
/// Calls = buckets.size(); bytes = all gradients' bytes, the same as average_gradients. Errors: "has no
/// gradient", a bucket that names a parameter index out of range.
void average_gradients_bucketed(dist::Comm& comm, const std::vector<at::Tensor>& params,
                                const std::vector<Bucket>& buckets);

// ---- Steps 3 and 4: overlap with backward, no_sync ---------------------------------------------------------

struct ReducerOptions {
  int64_t bucket_bytes = 1 << 20;  ///< the byte budget of make_buckets
  bool overlap = true;             ///< launch each bucket as soon as it is ready (false: all in finish())
};

/// Averages gradients across the ranks during backward, like PyTorch's DistributedDataParallel. Made once
/// per model (it checks the shapes across ranks, makes the buckets and hooks every parameter); then per
/// iteration: backward(), finish(), optimizer step. Not copyable: the hooks point at it.
class Reducer {
 public:
  /// Step 3. Checks shapes across ranks (check_same_shapes), makes the buckets (make_buckets) and one flat
  /// buffer per bucket, and registers a gradient hook on every parameter that calls grad_ready(i, grad).
  /// Errors: a parameter that does not require grad.
  Reducer(dist::Comm& comm, std::vector<at::Tensor> params, ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// Step 3. Called by the hook of parameter `index` with the gradient autograd just computed for it (before
  /// it is added into .grad). Copies .grad + grad (or grad, when .grad is undefined) into the parameter's
  /// slot of its bucket's buffer; when that was the bucket's last missing gradient and `overlap` is on,
  /// launches the all-reduce of every ready bucket in bucket order (all ranks must launch the same buckets
  /// in the same order). Step 4: does nothing while sync() is false (the gradient simply accumulates).
  void grad_ready(size_t index, const at::Tensor& grad);

  /// Step 3. After backward: launches the buckets not launched yet, waits for all, divides by N and copies
  /// each average into its parameters' .grad, then resets for the next backward. Errors: "got no gradient"
  /// for a parameter that had no gradient in this backward (unused parameters are not supported).
  void finish();

  /// Step 4. sync() false: backward passes only accumulate locally (no communication, as DDP's no_sync);
  /// set it back to true for the last micro-batch of the window, whose backward then carries the whole
  /// window's sum. Default true.
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  dist::Comm& comm() { return comm_; }
  /// Buckets whose all-reduce started inside a backward pass (before finish()) since construction.
  int64_t launched_in_backward() const { return launched_in_backward_; }

 private:
  dist::Comm& comm_;
  std::vector<at::Tensor> params_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<at::Tensor> buffers_;       ///< one flat buffer per bucket
  std::vector<size_t> bucket_of_;         ///< parameter -> its bucket
  std::vector<int64_t> offset_of_;        ///< parameter -> its first element in the bucket's buffer
  std::vector<bool> ready_;               ///< parameter -> gradient copied in this backward
  std::vector<int64_t> missing_;          ///< bucket -> gradients still missing in this backward
  std::vector<dist::AsyncWork> work_;     ///< bucket -> its all-reduce, once launched
  size_t next_to_launch_ = 0;             ///< buckets launch in order: 0, 1, 2, ...
  std::vector<unsigned> hooks_;           ///< hook handles, removed by the destructor
  bool sync_ = true;
  int64_t launched_in_backward_ = 0;
};

/// Step 4. Turns the reducer's sync off for its lifetime (the micro-batches of a window but the last).
class NoSync {
 public:
  explicit NoSync(Reducer& reducer) : reducer_(reducer), previous_(reducer.sync()) { reducer_.set_sync(false); }
  ~NoSync() { reducer_.set_sync(previous_); }
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;

 private:
  Reducer& reducer_;
  bool previous_;
};

/// Step 4. True on every rank when any rank passes true (an all-reduce MAX of one number).
bool all_ranks_found_inf(dist::Comm& comm, bool local_found_inf);

/// Step 4. lesson 1's scaler step, agreed across the ranks: looks for inf/NaN in the gradients of
/// `optimizer`'s parameters on this rank, agrees with all_ranks_found_inf, and, when any rank found one, makes
/// sure this rank's scaler skips too (so every rank skips the same steps and the scales stay equal). Then
/// scaler.step(optimizer). Returns whether the optimizer stepped. The caller calls scaler.update().
bool scaler_step(dist::Comm& comm, amp::GradScaler& scaler, torch::optim::Optimizer& optimizer);

/// Step 4. One optimizer step of data-parallel training over THIS rank's micro-batches (its shard of the
/// batch, split as in lesson 2): zero the gradients; backward on every micro-batch with loss weight
/// items / (this rank's items), all but the last under NoSync; finish(); then, with a scaler, every loss is
/// scaled and scaler_step() decides, else optimizer.step(). Calls scaler.update() when given. Returns whether
/// the optimizer stepped. Errors: no micro-batches. Every rank must have the same number of items.
bool train_step(Reducer& reducer, torch::optim::Optimizer& optimizer,
                const std::vector<accum::MicroBatch>& micro_batches, const accum::LossFn& loss_fn,
                amp::GradScaler* scaler = nullptr);

// ---- Step 5: sharded optimizer state (ZeRO stage 1) --------------------------------------------------------

/// Step 5. Which rank owns each parameter's optimizer state: parameters by size, largest first (ties: lower
/// index first), each to the rank that owns the fewest bytes so far (ties: lower rank). Returns owner[i].
/// Errors: world_size <= 0, no parameters.
std::vector<int> partition_parameters(const std::vector<at::Tensor>& params, int world_size);

/// Makes the real optimizer for a subset of the parameters (e.g. torch::optim::Adam over them).
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

/// ZeRO stage 1: every rank holds all parameters and (averaged) gradients, but the optimizer state only of
/// the parameters it owns (partition_parameters). A step updates the owned parameters locally, then every
/// parameter is broadcast from its owner, so all ranks end with the same, fully updated, parameters.
class ZeroOptimizer {
 public:
  /// Step 5. Partitions the parameters and makes this rank's optimizer over its own ones with `factory`.
  /// Errors: no parameters.
  ZeroOptimizer(dist::Comm& comm, std::vector<at::Tensor> params, const OptimizerFactory& factory);
  ~ZeroOptimizer();

  /// Step 5. step_local(), then sync_parameters().
  void step();
  /// Step 5. Steps this rank's optimizer (its own parameters only; no communication).
  void step_local();
  /// Step 5. Broadcasts every parameter from its owner (one broadcast per parameter).
  void sync_parameters();
  /// Step 5. With lesson 1's scaler: scaler_step (step 4) on this rank's optimizer, then sync_parameters().
  /// Returns whether the step ran. The caller calls scaler.update().
  bool step(amp::GradScaler& scaler);
  /// Step 5. Sets every gradient to none (all parameters, not only the owned ones).
  void zero_grad();

  /// Bytes of optimizer state this rank holds (the state tensors of its optimizer, counted).
  int64_t state_bytes() const;
  const std::vector<int>& owners() const { return owners_; }
  torch::optim::Optimizer& local_optimizer() { return *local_; }

 private:
  dist::Comm& comm_;
  std::vector<at::Tensor> params_;
  std::vector<int> owners_;
  std::unique_ptr<torch::optim::Optimizer> local_;
};

/// One rank's parameters as three int64 numbers: how many, how many elements, and a hash of every shape and
/// dtype. The same size on every rank whatever the model, so that ranks can all-gather it to compare models.
/// Given (not an exercise).
at::Tensor describe(const std::vector<at::Tensor>& params);

/// Bytes of state `optimizer` holds now: the sum of nbytes() of every tensor in its per-parameter state
/// (for Adam: exp_avg and exp_avg_sq, each the size of its parameter). Given (not an exercise).
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace ddp
