// Lesson 5 — your code. Replace each TODO with an implementation; the checks (ddp_stepK_test.cc) tell you when a
// step is done (bazel test //lesson5_distributed:all). The ranks talk only through dist::Comm (comm.h):
// comm.all_reduce(t), comm.all_reduce_async(t), comm.broadcast(t, root), comm.all_gather(t), comm.barrier().
#include "lesson5_distributed/ddp.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_set>

// The Tensor methods (t.add(u), t.div_(n), t.mul(w)) and the factories below; the operators (t + u, t / n)
// would need <ATen/TensorOperators.h>, which costs about 2 s more per compile of this file.
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

#include "lesson1_amp/grad_scaler.h"

namespace ddp {

// [shard]
at::Tensor shard(const at::Tensor& batch, int rank, int world_size) {
  // TODO(lesson5, step 1): Return this rank's equal share, batch.narrow(0, rank * per_rank, per_rank); refuse
  // bad arguments and a batch that "does not divide evenly" (about 8 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 1): shard() is not implemented yet");
}
// [shard]

// [average]
void average_(dist::Comm& comm, const at::Tensor& tensor) {
  // TODO(lesson5, step 1): Divide `tensor` by comm.world_size() in place (under at::NoGradGuard), THEN
  // comm.all_reduce it: divided before the sum, as DDP (about 5 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 1): average_() is not implemented yet");
}
// [average]

// [check_same_shapes]
void check_same_shapes(dist::Comm& comm, const std::vector<at::Tensor>& params) {
  // TODO(lesson5, step 1): all_gather describe(params) (on comm.device()); when a rank's numbers differ from rank
  // 0's, throw on EVERY rank "parameter shapes differ across ranks" (about 12 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 1): check_same_shapes() is not implemented yet");
}
// [check_same_shapes]

// [sync_module_states]
void sync_module_states(dist::Comm& comm, const std::vector<at::Tensor>& params,
                        const std::vector<at::Tensor>& buffers) {
  // TODO(lesson5, step 1): check_same_shapes over params and buffers together, then broadcast each one's
  // .detach() from rank 0, under at::NoGradGuard (about 5 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 1): sync_module_states() is not implemented yet");
}
// [sync_module_states]

// [check_gradients_ready]
void check_gradients_ready(dist::Comm& comm, const std::vector<at::Tensor>& params) {
  // TODO(lesson5, step 1): all_gather describe(params) + this rank's first parameter without a .grad (-1: none);
  // then on EVERY rank the shape error or "parameter i has no gradient on rank r" (about 12 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 1): check_gradients_ready() is not implemented yet");
}
// [check_gradients_ready]

// [average_gradients]
void average_gradients(dist::Comm& comm, const std::vector<at::Tensor>& params) {
  // TODO(lesson5, step 1): check_gradients_ready first, then average_ every .grad: one all-reduce per parameter;
  // a non-contiguous .grad through a contiguous copy, copied back (about 11 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 1): average_gradients() is not implemented yet");
}
// [average_gradients]

// [make_buckets]
std::vector<Bucket> make_buckets(const std::vector<at::Tensor>& params, int64_t bucket_bytes,
                                 int64_t first_bucket_bytes) {
  // TODO(lesson5, step 2): Walk the parameters from the last to the first, each into the open bucket of its dtype;
  // close a bucket once its bytes reach its limit; then append the ones still open (about 30 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 2): make_buckets() is not implemented yet");
}
// [make_buckets]

// [average_gradients_bucketed]
void average_gradients_bucketed(dist::Comm& comm, const std::vector<at::Tensor>& params,
                                const std::vector<Bucket>& buckets) {
  // TODO(lesson5, step 2): check_gradients_ready first; per bucket at::cat the flattened gradients, average_
  // the flat buffer once, copy each parameter's slice back into its .grad (about 17 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 2): average_gradients_bucketed() is not implemented yet");
}
// [average_gradients_bucketed]

// [reducer]
Reducer::Reducer(dist::Comm& comm, std::vector<at::Tensor> params, ReducerOptions options)
    : comm_(comm), options_(options) {
  // TODO(lesson5, step 3): sync_module_states; keep the parameters that require grad, each once; agree on them and
  // the bucket limits across ranks; buckets, their offsets and flat buffers; a hook per parameter (about 50 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 3): Reducer() is not implemented yet");
}
// [reducer]

// Given: removes the hooks the constructor registered.
Reducer::~Reducer() {
  for (size_t i = 0; i < hooks_.size(); ++i) params_[i].remove_hook(hooks_[i]);
}

// [grad_ready]
void Reducer::grad_ready(size_t index, const at::Tensor& grad) {
  // TODO(lesson5, step 3): Copy (.grad + grad) / N into the parameter's slot of its bucket's buffer, mark it
  // ready; with overlap launch, in bucket order, every consecutive ready bucket (about 21 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 3): Reducer::grad_ready() is not implemented yet");
}
// [grad_ready]

// [finish]
void Reducer::finish() {
  // TODO(lesson5, step 3): Zero and mark in a float map the slots that got no gradient, launch the buckets left,
  // all_reduce the map, wait; check the map on every rank, then copy the averages into .grad (about 50 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 3): Reducer::finish() is not implemented yet");
}
// [finish]

// [forward]
at::Tensor Reducer::forward(const std::function<at::Tensor()>& forward_fn) {
  // TODO(lesson5, step 4): fail_unfinished("Reducer::forward") after an unfinished synced backward; record
  // forward_sync_ = sync_ (1 or 0), as DDP decides no_sync in forward; return forward_fn() (about 3 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 4): Reducer::forward() is not implemented yet");
}
// [forward]

// [all_ranks_found_inf]
bool all_ranks_found_inf(dist::Comm& comm, bool local_found_inf) {
  // TODO(lesson5, step 4): All-reduce a one-element float tensor, 1 or 0, on comm.device() with
  // dist::ReduceOp::kMax; true when the result is > 0 (about 3 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 4): all_ranks_found_inf() is not implemented yet");
}
// [all_ranks_found_inf]

// [sharded_scaler]
ShardedGradScaler::ShardedGradScaler(dist::Comm& comm, amp::GradScalerOptions options)
    : amp::GradScaler(options), comm_(comm) {}

void ShardedGradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  // TODO(lesson5, step 4): Unless disabled: lesson 1's unscale_, catching its exception, then one kMax all-reduce
  // of {found_inf, this rank threw}; rethrow, or fail, or store the agreed found_inf (about 20 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 4): ShardedGradScaler::unscale_() is not implemented yet");
}
// [sharded_scaler]

// [train_step]
bool train_step(Reducer& reducer, torch::optim::Optimizer& optimizer,
                const std::vector<accum::MicroBatch>& micro_batches, const accum::LossFn& loss_fn,
                amp::GradScaler* scaler) {
  // TODO(lesson5, step 4): Zero the gradients; per micro-batch reducer.forward(its weighted loss), scaled if a
  // scaler is given, backward, all but the last inside NoSync; then finish() and step (about 20 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 4): train_step() is not implemented yet");
}
// [train_step]

// [partition_parameters]
std::vector<int> partition_parameters(const std::vector<at::Tensor>& params, int world_size) {
  // TODO(lesson5, step 5): Indices by numel, largest first (std::stable_sort); each to the rank that owns the
  // fewest elements so far, the lowest of equals (about 12 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 5): partition_parameters() is not implemented yet");
}
// [partition_parameters]

// [zero]
ZeroOptimizer::ZeroOptimizer(dist::Comm& comm, std::vector<at::Tensor> params, const OptimizerFactory& factory)
    : comm_(comm), params_(std::move(params)) {
  // TODO(lesson5, step 5): Keep each tensor once, check_same_shapes, owners_ = partition_parameters; local_ =
  // factory(the parameters this rank owns, or {empty_shard()} when none) (about 15 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 5): ZeroOptimizer() is not implemented yet");
}

void ZeroOptimizer::step_local() {
  // TODO(lesson5, step 5): Step this rank's optimizer (about 1 line).
  TORCH_CHECK(false, "TODO(lesson5, step 5): ZeroOptimizer::step_local() is not implemented yet");
}

void ZeroOptimizer::sync_parameters() {
  // TODO(lesson5, step 5): Under at::NoGradGuard broadcast every parameter's .detach() from its owner
  // (about 3 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 5): ZeroOptimizer::sync_parameters() is not implemented yet");
}

void ZeroOptimizer::step() {
  // TODO(lesson5, step 5): step_local(), then sync_parameters() (about 2 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 5): ZeroOptimizer::step() is not implemented yet");
}

bool ZeroOptimizer::step(ShardedGradScaler& scaler) {
  // TODO(lesson5, step 5): Refuse a scaler on another communicator before any collective; scaler.step(*local_);
  // sync_parameters() only when it stepped; return whether it did (about 4 lines).
  TORCH_CHECK(false, "TODO(lesson5, step 5): ZeroOptimizer::step(scaler) is not implemented yet");
}
// [zero]

// Given.
ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::zero_grad() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
  if (empty_shard_.defined()) empty_shard_.mutable_grad() = at::zeros({0}, empty_shard_.options());
}

int64_t ZeroOptimizer::state_bytes() const {
  TORCH_CHECK(local_ != nullptr, "ZeroOptimizer: no local optimizer");
  return optimizer_state_bytes(*local_);
}

}  // namespace ddp
