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
  // TODO(lesson5, step 1): Reject an undefined/0-dim batch, world_size <= 0 and a rank outside
  // 0 .. world_size - 1; when batch.size(0) is not a multiple of world_size say that it "does not divide
  // evenly". Return the view batch.narrow(0, rank * per_rank, per_rank).
  TORCH_CHECK(false, "TODO(lesson5, step 1): shard() is not implemented yet");
}
// [shard]

// [average]
void average_(dist::Comm& comm, const at::Tensor& tensor) {
  // TODO(lesson5, step 1): Divide `tensor` by comm.world_size() FIRST (in place, under at::NoGradGuard: it may
  // be a gradient), then sum it over the ranks with comm.all_reduce (in place): as DDP, divide before the sum.
  TORCH_CHECK(false, "TODO(lesson5, step 1): average_() is not implemented yet");
}
// [average]

// [check_same_shapes]
void check_same_shapes(dist::Comm& comm, const std::vector<at::Tensor>& params) {
  // TODO(lesson5, step 1): all_gather describe(params) (moved to comm.device()) and compare every rank's
  // numbers with rank 0's. On any difference throw, on EVERY rank, an error that says "parameter shapes
  // differ across ranks" and names the two ranks' counts. Every rank sees the same gathered numbers.
  TORCH_CHECK(false, "TODO(lesson5, step 1): check_same_shapes() is not implemented yet");
}
// [check_same_shapes]

// [sync_module_states]
void sync_module_states(dist::Comm& comm, const std::vector<at::Tensor>& params,
                        const std::vector<at::Tensor>& buffers) {
  // TODO(lesson5, step 1): check_same_shapes over params and buffers together, then (under at::NoGradGuard)
  // comm.broadcast(t.detach(), 0) every one of them: rank 0's values, in place on every rank.
  TORCH_CHECK(false, "TODO(lesson5, step 1): sync_module_states() is not implemented yet");
}
// [sync_module_states]

// [check_gradients_ready]
void check_gradients_ready(dist::Comm& comm, const std::vector<at::Tensor>& params) {
  // TODO(lesson5, step 1): Find this rank's first parameter whose .grad is undefined (-1: none). all_gather
  // at::cat({describe(params), that index as a one-element int64 tensor}) (on comm.device()). Compare the first
  // three numbers of every rank with rank 0's as check_same_shapes does ("parameter shapes differ across
  // ranks"); then, for the lowest rank r whose index i is >= 0, throw on EVERY rank "parameter i has no
  // gradient on rank r". No rank may throw before the all-gather: its peers would wait for it.
  TORCH_CHECK(false, "TODO(lesson5, step 1): check_gradients_ready() is not implemented yet");
}
// [check_gradients_ready]

// [average_gradients]
void average_gradients(dist::Comm& comm, const std::vector<at::Tensor>& params) {
  // TODO(lesson5, step 1): check_gradients_ready(comm, params) first. Then for every parameter
  // average_(comm, its grad): one all-reduce per parameter. A non-contiguous gradient needs a contiguous copy,
  // averaged, then copied back into .grad.
  TORCH_CHECK(false, "TODO(lesson5, step 1): average_gradients() is not implemented yet");
}
// [average_gradients]

// [make_buckets]
std::vector<Bucket> make_buckets(const std::vector<at::Tensor>& params, int64_t bucket_bytes,
                                 int64_t first_bucket_bytes) {
  // TODO(lesson5, step 2): Reject bucket_bytes <= 0 ("bucket_bytes must be > 0") and no parameters;
  // first_bucket_bytes <= 0 means bucket_bytes. Walk the parameters from the LAST to the first, adding each
  // (index, numel, bytes = numel * element_size()) to the open bucket of its dtype (a std::map from dtype to
  // the open bucket). AFTER adding, close that bucket if its bytes reached its limit: first_bucket_bytes for
  // the dtype's first bucket, bucket_bytes after. At the end append the buckets still open, in the order of
  // their first parameter.
  TORCH_CHECK(false, "TODO(lesson5, step 2): make_buckets() is not implemented yet");
}
// [make_buckets]

// [average_gradients_bucketed]
void average_gradients_bucketed(dist::Comm& comm, const std::vector<at::Tensor>& params,
                                const std::vector<Bucket>& buckets) {
  // TODO(lesson5, step 2): First check_gradients_ready(comm, params). Then for every bucket: at::cat the
  // flattened (reshape({-1})) gradients of its parameters, average_ the flat buffer (ONE all-reduce per bucket),
  // and copy each parameter's slice back: grad.copy_(flat.narrow(0, offset, numel).view_as(grad)).
  TORCH_CHECK(false, "TODO(lesson5, step 2): average_gradients_bucketed() is not implemented yet");
}
// [average_gradients_bucketed]

// [reducer]
Reducer::Reducer(dist::Comm& comm, std::vector<at::Tensor> params, ReducerOptions options)
    : comm_(comm), options_(options) {
  // TODO(lesson5, step 3): sync_module_states(comm_, params) (all of them). Keep in params_ only those that
  // require grad, each tensor once (a std::unordered_set of p.unsafeGetTensorImpl()), and check_same_shapes
  // over params_ too (ranks that freeze or tie differently pass the first check); rethrow its error prefixed
  // with "the parameters that require grad, each once, differ across ranks". None left is then an error.
  // buckets_ = make_buckets(params_, both limits of options_). For every bucket b and parameter i in it: bucket_of_[i] = b, offset_of_[i] = running offset; one flat
  // buffer per bucket (at::empty({numel}, first parameter's options without requires_grad)); missing_[b] =
  // its parameter count; ready_ all false; work_.resize(buckets). Then per parameter:
  //   hooks_.push_back(params_[i].register_hook([this, i](const at::Tensor& g) { grad_ready(i, g); }));
  TORCH_CHECK(false, "TODO(lesson5, step 3): Reducer() is not implemented yet");
}
// [reducer]

// Given: removes the hooks the constructor registered.
Reducer::~Reducer() {
  for (size_t i = 0; i < hooks_.size(); ++i) params_[i].remove_hook(hooks_[i]);
}

// [grad_ready]
void Reducer::grad_ready(size_t index, const at::Tensor& grad) {
  // TODO(lesson5, step 3): (Step 4 comes back to this line: when this backward does not sync — forward_sync_
  // == 0, or forward_sync_ < 0 and sync_ false — return at once, so that the gradient accumulates in .grad.)
  // A parameter already ready means finish() was not called: fail_unfinished(...) (given: it also lets the
  // peers waiting in their finish() fail). Under at::NoGradGuard copy `grad` plus
  // its current .grad when defined (autograd adds `grad` into .grad only after this hook), flattened, into this
  // parameter's slot of its bucket's buffer, and divide the slot by the world size (before the sum, as DDP).
  // Mark it ready (and synced_backward_); when its bucket has no missing gradient left and options_.overlap,
  // launch, IN BUCKET ORDER, every consecutive ready bucket from next_to_launch_ with
  // comm_.all_reduce_async(buffer), counting launched_in_backward_.
  TORCH_CHECK(false, "TODO(lesson5, step 3): Reducer::grad_ready() is not implemented yet");
}
// [grad_ready]

// [finish]
void Reducer::finish() {
  // TODO(lesson5, step 3): Reset ready_, missing_, work_, next_to_launch_, forward_sync_ and synced_backward_
  // for the next backward when leaving, also when throwing. When this backward did not sync (forward_sync_ == 0,
  // or forward_sync_ < 0 and sync_ false): fail_not_synced() (given: a peer that synced is waiting). Mark every
  // parameter that is not ready in a float map (1 per such parameter) and zero its slot; launch the buckets not
  // launched yet (in order); then comm_.all_reduce the map: the same calls on every rank. Wait for every bucket.
  // An entry of at least kForgottenFinish: throw "another rank's finish() was not called" (fail_unfinished on
  // that rank); of at least kNotSynced: "another rank's backward did not sync (its forward ran inside NoSync)".
  // Any other non-zero entry: throw on every rank "got no gradient", with the parameter and on how many ranks.
  // Else copy each slice (view_as the parameter) into .grad.
  TORCH_CHECK(false, "TODO(lesson5, step 3): Reducer::finish() is not implemented yet");
}
// [finish]

// [forward]
at::Tensor Reducer::forward(const std::function<at::Tensor()>& forward_fn) {
  // TODO(lesson5, step 4): If a synced backward delivered gradients since the last finish():
  // fail_unfinished("Reducer::forward"). Record forward_sync_ = sync_ (1 or 0): DDP decides no_sync in forward. Return forward_fn().
  TORCH_CHECK(false, "TODO(lesson5, step 4): Reducer::forward() is not implemented yet");
}
// [forward]

// [all_ranks_found_inf]
bool all_ranks_found_inf(dist::Comm& comm, bool local_found_inf) {
  // TODO(lesson5, step 4): A one-element float tensor on comm.device(), 1 or 0, all-reduced with
  // dist::ReduceOp::kMax; true when the result is > 0.
  TORCH_CHECK(false, "TODO(lesson5, step 4): all_ranks_found_inf() is not implemented yet");
}
// [all_ranks_found_inf]

// [sharded_scaler]
ShardedGradScaler::ShardedGradScaler(dist::Comm& comm, amp::GradScalerOptions options)
    : amp::GradScaler(options), comm_(comm) {}

void ShardedGradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  // TODO(lesson5, step 4): Disabled: return. Run amp::GradScaler::unscale_(optimizer), catching its exception
  // (std::exception_ptr). All-reduce with kMax a [2] float tensor on comm_.device(): {this rank's
  // recorded_found_inf(optimizer), 1 if unscale threw}. Rethrow this rank's exception; throw if another rank
  // failed; else copy element 0 into recorded_found_inf(optimizer) (step() and update() read that one).
  TORCH_CHECK(false, "TODO(lesson5, step 4): ShardedGradScaler::unscale_() is not implemented yet");
}
// [sharded_scaler]

// [train_step]
bool train_step(Reducer& reducer, torch::optim::Optimizer& optimizer,
                const std::vector<accum::MicroBatch>& micro_batches, const accum::LossFn& loss_fn,
                amp::GradScaler* scaler) {
  // TODO(lesson5, step 4): Reject no micro-batches. Zero the gradients. For each micro-batch: the loss,
  // reducer.forward([&] { return loss_fn(mb) * count / (this rank's items); }), scaled by the scaler when
  // given, backward — all but the last inside a NoSync(reducer) scope (std::optional<NoSync> helps). Then
  // reducer.finish(); without a scaler optimizer.step() and return true; with one: scaler->step(optimizer),
  // scaler->update().
  TORCH_CHECK(false, "TODO(lesson5, step 4): train_step() is not implemented yet");
}
// [train_step]

// [partition_parameters]
std::vector<int> partition_parameters(const std::vector<at::Tensor>& params, int world_size) {
  // TODO(lesson5, step 5): Reject world_size <= 0 and no parameters. Order the indices by numel, largest
  // first (std::stable_sort keeps ties in index order); give each to the rank with the fewest elements so far
  // (std::min_element finds the first, i.e. lowest, such rank).
  TORCH_CHECK(false, "TODO(lesson5, step 5): partition_parameters() is not implemented yet");
}
// [partition_parameters]

// [zero]
ZeroOptimizer::ZeroOptimizer(dist::Comm& comm, std::vector<at::Tensor> params, const OptimizerFactory& factory)
    : comm_(comm), params_(std::move(params)) {
  // TODO(lesson5, step 5): Reject no parameters; keep each tensor of params_ once (tied weights: a
  // std::unordered_set of p.unsafeGetTensorImpl(), as the Reducer); check_same_shapes over that list; owners_ =
  // partition_parameters; local_ = factory(the parameters this rank owns; none: {empty_shard()}, given).
  TORCH_CHECK(false, "TODO(lesson5, step 5): ZeroOptimizer() is not implemented yet");
}

void ZeroOptimizer::step_local() {
  // TODO(lesson5, step 5): Step this rank's optimizer.
  TORCH_CHECK(false, "TODO(lesson5, step 5): ZeroOptimizer::step_local() is not implemented yet");
}

void ZeroOptimizer::sync_parameters() {
  // TODO(lesson5, step 5): Under at::NoGradGuard broadcast every parameter (its .detach(), same storage)
  // from its owner.
  TORCH_CHECK(false, "TODO(lesson5, step 5): ZeroOptimizer::sync_parameters() is not implemented yet");
}

void ZeroOptimizer::step() {
  // TODO(lesson5, step 5): step_local(), then sync_parameters().
  TORCH_CHECK(false, "TODO(lesson5, step 5): ZeroOptimizer::step() is not implemented yet");
}

bool ZeroOptimizer::step(ShardedGradScaler& scaler) {
  // TODO(lesson5, step 5): Throw, before any collective, when scaler.comm() is not comm_.
  // scaler.step(*local_) (it unscales and agrees unless already done; a rank with the empty shard joins with 0);
  // sync_parameters() only when it stepped (every rank agrees, so the broadcasts match up). Return whether it
  // stepped.
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
