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
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "lesson1_amp/grad_scaler.h"
#include "lesson2_accumulation/accumulation.h"
#include "lesson5_distributed/comm.h"

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

/// Step 1. Replaces `tensor` on every rank by the mean of all ranks' tensors: divides by N FIRST, then a sum
/// all-reduce, as DDP scales each gradient by 1/N when it copies it into its bucket (a 16-bit sum of N
/// gradients can overflow where the sum of the N already-divided ones does not).
void average_(dist::Comm& comm, const at::Tensor& tensor);

/// Step 1. Checks that every rank has the same parameters (count, shapes, dtypes) before any gradient is
/// exchanged. Every rank learns the result, so every rank throws the same error "parameter shapes differ
/// across ranks", naming rank 0's and the first differing rank's counts ("rank 0 has 6 parameters with 484
/// elements, rank 1 has 4 parameters with 340 elements"), instead of hanging in a collective whose sizes do not
/// match. Uses fixed-size collectives only.
void check_same_shapes(dist::Comm& comm, const std::vector<at::Tensor>& params);

/// Step 1. DDP's construction-time sync (_sync_module_states): check_same_shapes over the parameters and the
/// buffers, then every parameter and every buffer is broadcast from rank 0 (one broadcast per tensor), so that
/// every replica starts from rank 0's values whatever seed each rank used. Frozen parameters are sent too.
void sync_module_states(dist::Comm& comm, const std::vector<at::Tensor>& params,
                        const std::vector<at::Tensor>& buffers = {});

/// Step 1. Before any gradient is sent (both after-backward paths call it first): one all-gather of 4 int64 per
/// rank, whatever the model — describe(params) and the index of this rank's first parameter without a gradient
/// (-1: none) — so that every rank learns the same facts and throws the same error instead of one rank throwing
/// while its peers wait in an all-reduce. Errors, on EVERY rank: "parameter shapes differ across ranks" (as
/// check_same_shapes); "parameter i has no gradient on rank r" (the lowest such rank).
void check_gradients_ready(dist::Comm& comm, const std::vector<at::Tensor>& params);

/// Step 1. The baseline: after backward, check_gradients_ready, then averages every parameter's gradient across
/// the ranks with ONE all-reduce PER PARAMETER (calls = number of parameters). A non-contiguous gradient gets
/// the average back in place (through a contiguous copy). Errors: those of check_gradients_ready.
void average_gradients(dist::Comm& comm, const std::vector<at::Tensor>& params);

// ---- Step 2: bucketing --------------------------------------------------------------------------------------

/// A group of parameters whose gradients travel in one flat all-reduce.
struct Bucket {
  std::vector<size_t> params;  ///< indices into the parameter list, in the order they were added
  int64_t numel = 0;           ///< elements of all its gradients together
  int64_t bytes = 0;           ///< numel * element size
};

/// Step 2. Groups parameters into buckets by DDP's rule (reducer.cpp, compute_bucket_assignment_by_size, as
/// rebuild_buckets calls it with the gradient-ready order): walks the parameters in REVERSE order (the order
/// backward produces a sequential model's gradients) and adds each to the open bucket of ITS dtype (one
/// accumulator per dtype); a bucket closes once its bytes reach its limit (so it may pass the limit by its last
/// parameter). Each dtype's first bucket has the limit `first_bucket_bytes` (DDP: 1 MiB), every later one
/// `bucket_bytes` (DDP: 25 MiB); first_bucket_bytes <= 0 means bucket_bytes for all. Closed buckets come in the
/// order they closed, then the ones still open, in the order of their first parameter. Every parameter is in
/// exactly one bucket. Errors: "bucket_bytes must be > 0", no parameters.
std::vector<Bucket> make_buckets(const std::vector<at::Tensor>& params, int64_t bucket_bytes,
                                 int64_t first_bucket_bytes = 0);

/// Step 2. After backward, averages the gradients bucket by bucket: check_gradients_ready first (one all-gather
/// of 32 bytes: a model that differs across ranks, or a gradient missing on one rank, gives the same error on
/// every rank, not mismatched buckets or a timeout), then flatten each bucket's gradients into one contiguous buffer, average_ it (one all-reduce per bucket) and
/// copy the averages back into every .grad: into the same tensors, whatever their layout (transposed,
/// channels_last), so that whoever holds a .grad sees the average. A bucket that mixes dtypes (make_buckets never
/// makes one) travels in their promoted dtype. All-reduce calls = buckets.size(); bytes = all gradients' bytes, the
/// same as average_gradients. Errors: those of check_gradients_ready, a bucket that names a parameter index out
/// of range.
void average_gradients_bucketed(dist::Comm& comm, const std::vector<at::Tensor>& params,
                                const std::vector<Bucket>& buckets);

// ---- Steps 3 and 4: overlap with backward, no_sync ---------------------------------------------------------

struct ReducerOptions {
  int64_t bucket_bytes = 25 << 20;       ///< make_buckets' limit of every bucket but the first (DDP's bucket_cap_mb)
  int64_t first_bucket_bytes = 1 << 20;  ///< make_buckets' limit of the first bucket (DDP's first_bucket_bytes)
  bool overlap = true;                   ///< launch each bucket as soon as it is ready (false: all in finish())
};

/// Averages gradients across the ranks during backward, like PyTorch's DistributedDataParallel. Made once
/// per model (it syncs the replicas from rank 0, makes the buckets and hooks every parameter); then per
/// iteration: forward (through forward(), which decides no_sync, or directly), backward(), finish(), optimizer
/// step. Not copyable: the hooks point at it.
class Reducer {
 public:
  /// Step 3. sync_module_states(comm, params) (shapes checked, every parameter broadcast from rank 0, as DDP's
  /// constructor does); then, like DDP, keeps only the parameters that require grad, each once (a tensor listed
  /// twice, e.g. tied weights, is reduced once); checks the kept list across the ranks too (check_same_shapes,
  /// as DDP verifies the parameters it reduces: ranks that freeze different layers or tie weights differently
  /// pass the check of the whole model), makes the buckets (make_buckets with both limits) and one flat buffer
  /// per bucket, and registers a gradient hook on every kept parameter that calls grad_ready(i, grad).
  /// The bucket limits are agreed in the same all-gather (5 int64 per rank: describe() of the kept list, then
  /// bucket_bytes and first_bucket_bytes as make_buckets reads it), since other limits make other buckets;
  /// `overlap` may differ. Errors, on every rank: "the parameters that require grad, each once, differ across
  /// ranks" followed by check_same_shapes' "parameter shapes differ across ranks: rank 0 has 6 parameters ...,
  /// rank 1 has 4 ..."; "the bucket limits differ across ranks: rank 0 has bucket_bytes B and first_bucket_bytes
  /// F, rank r has B' and F'"; no parameter requires grad. A failed all-gather (a timeout, a peer that exited)
  /// is reported as such, not as parameters that differ.
  Reducer(dist::Comm& comm, std::vector<at::Tensor> params, ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// Step 3. Called by the hook of parameter `index` (of params()) with the gradient autograd just computed for
  /// it (before it is added into .grad). Copies (.grad + grad) / N (or grad / N, when .grad is undefined) into
  /// the parameter's slot of its bucket's buffer: divided BEFORE the sum, as DDP does; when that was the
  /// bucket's last missing gradient and `overlap` is on, launches the all-reduce of every ready bucket in bucket
  /// order (all ranks must launch the same buckets in the same order). Each bucket's buffer has its parameters'
  /// dtype (make_buckets keeps dtypes apart), so a float64 gradient is averaged in float64 and a 16-bit one
  /// travels at its own size. Errors: a second gradient for a parameter
  /// before finish() ("finish() was not called"). Step 4: does nothing when this backward does not sync (the
  /// gradient simply accumulates in .grad).
  void grad_ready(size_t index, const at::Tensor& grad);

  /// Step 3. After backward: launches the buckets not launched yet (a parameter that got no gradient
  /// contributes zeros, so that every rank makes the same calls), then one all-reduce of the "no gradient" map
  /// (one float per parameter, DDP's local_used_map), waits for all and copies each average into its
  /// parameters' .grad (the same tensor, in its layout: a .grad someone holds sees the average); resets for the
  /// next backward (every bucket waits for all its gradients again, so the next backward overlaps too, and the
  /// last forward()'s sync is forgotten). Errors, on EVERY rank when any rank lacks a gradient:
  /// "parameter i got no gradient in this backward on M of N ranks" (unused parameters are not supported); when
  /// an entry of the map is above the world size (kForgottenFinish: a rank that never called its finish() for
  /// this backward, see fail_unfinished): "another rank's finish() was not called"; when this backward did not
  /// sync (its forward ran inside NoSync): fail_not_synced(), which tells the peers, whose entries are then at
  /// least kNotSynced: "another rank's backward did not sync (its forward ran inside NoSync)".
  void finish();

  /// Given (given.cc). For grad_ready() and forward() when they find that finish() was not called after the
  /// previous synced backward: the peers may be waiting in their finish() of that backward, so this rank makes
  /// the calls its finish() would have made (the buckets not launched yet, in order, then the map, every entry
  /// kForgottenFinish) and waits for them, so that every peer's finish() fails at once instead of timing out;
  /// then throws "<where>: finish() was not called after the previous backward". When every rank forgot, their
  /// calls meet each other's and every rank fails the same way.
  [[noreturn]] void fail_unfinished(const char* where);
  static constexpr float kForgottenFinish = 1e6f;

  /// Given (given.cc). For finish() called after a backward that did not sync (its forward ran inside NoSync,
  /// or, without forward(), its backward did): a peer whose backward synced waits in its finish(), so this rank
  /// makes the calls a synced finish() makes (every bucket, then the map with every entry kNotSynced) and throws
  /// "this backward did not sync (its forward ran inside NoSync)"; the peers' finish() read the mark. When no rank
  /// synced, their calls meet each other's and every rank fails the same way.
  [[noreturn]] void fail_not_synced();
  static constexpr float kNotSynced = 1e3f;

  /// Step 4. Runs `forward_fn` (the model's forward) and records whether the backward of its output
  /// communicates: sync() as it is NOW, as DDP's forward reads require_backward_grad_sync (leaving NoSync
  /// between this forward and its backward changes nothing). Without forward(), each gradient's hook reads
  /// sync() as it is then (also after iterations that used forward(): finish() forgets it); within a window, once
  /// you use forward(), use it for every micro-batch. Errors: "finish() was not
  /// called" after the previous synced backward.
  at::Tensor forward(const std::function<at::Tensor()>& forward_fn);

  /// Step 4. sync() false: the backward of a forward run now only accumulates locally (no communication, as
  /// DDP's no_sync); set it back to true for the last micro-batch of the window, whose backward then carries
  /// the whole window's sum. Default true.
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  /// The parameters it reduces: those that require grad, each once, in the order given.
  const std::vector<at::Tensor>& params() const { return params_; }
  dist::Comm& comm() { return comm_; }
  /// Buckets whose all-reduce started inside a backward pass (before finish()) since construction.
  int64_t launched_in_backward() const { return launched_in_backward_; }

 private:
  void tell_peers(float mark);  ///< given: the calls of finish() with the map full of `mark` (see fail_unfinished)

  dist::Comm& comm_;
  std::vector<at::Tensor> params_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<at::Tensor> buffers_;    ///< one flat buffer per bucket
  std::vector<size_t> bucket_of_;      ///< parameter -> its bucket
  std::vector<int64_t> offset_of_;     ///< parameter -> its first element in the bucket's buffer
  std::vector<bool> ready_;            ///< parameter -> gradient copied in this backward
  std::vector<int64_t> missing_;       ///< bucket -> gradients still missing in this backward
  std::vector<dist::AsyncWork> work_;  ///< bucket -> its all-reduce, once launched
  size_t next_to_launch_ = 0;          ///< buckets launch in order: 0, 1, 2, ...
  std::vector<unsigned> hooks_;        ///< hook handles, removed by the destructor
  bool sync_ = true;
  int forward_sync_ = -1;         ///< sync() as the last forward() saw it (-1: no forward() since finish)
  bool synced_backward_ = false;  ///< a synced backward has delivered gradients since the last finish()
  int64_t launched_in_backward_ = 0;
};

/// Step 4. Turns the reducer's sync off for its lifetime (the micro-batches of a window but the last). As in
/// DDP, what counts is whether the FORWARD ran inside it (Reducer::forward).
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

/// Step 4. True on every rank when any rank passes true, one rank or several (an all-reduce MAX of one number).
bool all_ranks_found_inf(dist::Comm& comm, bool local_found_inf);

/// Step 4. Lesson 1's scaler whose unscale_ agrees on found_inf across the ranks, as PyTorch's
/// ShardedGradScaler (torch/distributed/fsdp/sharded_grad_scaler.py): after the local unscale, the recorded
/// found_inf is all-reduced (MAX here; PyTorch sums, which is non-zero under the same condition), so step(),
/// also after an explicit unscale_ (to clip), skips on every rank when any rank found an inf/NaN, and update()
/// backs the scale off on every rank. One all-reduce of 8 bytes per unscale_: {found_inf, failed}, so that
/// when the local unscale throws on one rank (e.g. its optimizer has no gradient), every rank throws instead
/// of waiting for it: that rank its own error, the others "another rank's unscale_ failed". Needed wherever a rank unscales only part of the gradients (ZeroOptimizer); with a
/// Reducer's full all-reduce an inf reaches every rank anyway and lesson 1's scaler is enough.
class ShardedGradScaler : public amp::GradScaler {
 public:
  ShardedGradScaler(dist::Comm& comm, amp::GradScalerOptions options = {});
  /// Step 4. amp::GradScaler::unscale_, then the agreement. Disabled, it does nothing (no collective: a
  /// pass-through, as PyTorch's; every rank must enable it alike).
  void unscale_(torch::optim::Optimizer& optimizer) override;
  dist::Comm& comm() { return comm_; }

 private:
  dist::Comm& comm_;
};

/// Step 4. One optimizer step of data-parallel training over THIS rank's micro-batches (its shard of the
/// batch, split as in lesson 2): zero the gradients; forward (through reducer.forward) and backward on every
/// micro-batch with loss weight items / (this rank's items), all but the last under NoSync; finish(); then,
/// with a scaler, every loss is scaled and scaler->step(optimizer) decides, else optimizer.step(). Calls
/// scaler->update() when given. Returns whether the optimizer stepped. Errors: no micro-batches. Every rank must
/// have the same number of items.
bool train_step(Reducer& reducer, torch::optim::Optimizer& optimizer,
                const std::vector<accum::MicroBatch>& micro_batches, const accum::LossFn& loss_fn,
                amp::GradScaler* scaler = nullptr);

// ---- Step 5: sharded optimizer state (ZeRO stage 1) --------------------------------------------------------

/// Step 5. Which rank owns each parameter's optimizer state, as ZeroRedundancyOptimizer's greedy partition:
/// parameters by numel, largest first (ties: lower index first), each to the rank that owns the fewest ELEMENTS
/// so far (ties: lower rank; PyTorch counts elements, not bytes). Returns owner[i]. A rank may own nothing when
/// there are fewer parameters than ranks. Errors: world_size <= 0, no parameters.
std::vector<int> partition_parameters(const std::vector<at::Tensor>& params, int world_size);

/// Makes the real optimizer for a subset of the parameters (e.g. torch::optim::Adam over them).
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

/// ZeRO stage 1: every rank holds all parameters and (averaged) gradients, but the optimizer state only of
/// the parameters it owns (partition_parameters). A step updates the owned parameters locally, then every
/// parameter is broadcast from its owner, so all ranks end with the same, fully updated, parameters.
class ZeroOptimizer {
 public:
  /// Step 5. Keeps each tensor once (a tensor listed twice, e.g. tied weights, would be stepped twice by one
  /// optimizer, or have its state on two ranks), then check_same_shapes over that list (a model that differs
  /// across ranks gives the shape error on every rank, not mismatched broadcasts), partitions it and makes this
  /// rank's optimizer over its own ones with `factory`; a rank that owns nothing, or only parameters that do not
  /// require grad, gets empty_shard() too, so that its optimizer and scaler have a (zero-sized) shard. owners() is indexed by that list. Errors: no
  /// parameters.
  ZeroOptimizer(dist::Comm& comm, std::vector<at::Tensor> params, const OptimizerFactory& factory);
  ~ZeroOptimizer();

  /// Step 5. step_local(), then sync_parameters().
  void step();
  /// Step 5. Steps this rank's optimizer (its own parameters only; no communication).
  void step_local();
  /// Step 5. Broadcasts every parameter from its owner (one broadcast per parameter).
  void sync_parameters();
  /// Step 5. With the ShardedGradScaler (step 4): scaler.step(this rank's optimizer), which unscales (and
  /// agrees) unless the caller already called scaler.unscale_(local_optimizer()); sync_parameters() when it
  /// stepped (every rank agrees, so the broadcasts match). Returns whether the step ran. The caller calls
  /// scaler.update(). A rank that owns no parameter, or only frozen ones (requires_grad false), takes part with
  /// its empty shard: its unscale_ finds no inf and joins the agreement with 0, as PyTorch's ShardedGradScaler
  /// lets a rank without gradients do. Errors: a scaler on
  /// another communicator (before any collective).
  bool step(ShardedGradScaler& scaler);
  /// Step 5. Sets every gradient to none (all parameters, not only the owned ones); keeps the empty shard's.
  void zero_grad();

  /// Given (given.cc). The shard of a rank that owns no parameter: a parameter of 0 elements (requires grad,
  /// float32, a dtype lesson 1's unscale_ takes whatever the model's: a frozen float16 layer may come first; on the
  /// first parameter's device) with a gradient of 0 elements, which zero_grad() keeps defined. Its
  /// optimizer state holds 0 bytes; lesson 1's unscale_ finds one gradient (empty) to unscale, no inf in it.
  /// FSDP's ranks without a real shard hold such zero-sized shards too (sharded_grad_scaler.py).
  at::Tensor empty_shard();

  /// Bytes of optimizer state this rank holds (the state tensors of its optimizer, counted).
  int64_t state_bytes() const;
  const std::vector<int>& owners() const { return owners_; }
  torch::optim::Optimizer& local_optimizer() { return *local_; }

 private:
  dist::Comm& comm_;
  std::vector<at::Tensor> params_;
  std::vector<int> owners_;
  std::unique_ptr<torch::optim::Optimizer> local_;
  at::Tensor empty_shard_;  ///< empty_shard()'s parameter, on a rank that owns nothing
};

/// One rank's parameters as three int64 numbers: how many, how many elements, and a hash of every shape and
/// dtype. The same size on every rank whatever the model, so that ranks can all-gather it to compare models.
/// Given (not an exercise).
at::Tensor describe(const std::vector<at::Tensor>& params);

/// Bytes of state `optimizer` holds now: the sum of nbytes() of every tensor in its per-parameter state
/// (for Adam: exp_avg and exp_avg_sq, each the size of its parameter). Given (not an exercise).
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace ddp
