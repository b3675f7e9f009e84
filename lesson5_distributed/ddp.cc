// Lesson 5 — your code. Replace each TODO with an implementation; the checks in ddp_test.cc tell you when a
// step is done (bazel test //lesson5_distributed:all). The ranks talk only through dist::Comm (comm.h):
// comm.all_reduce(t), comm.all_reduce_async(t), comm.broadcast(t, root), comm.all_gather(t), comm.barrier().
#include "lesson5_distributed/ddp.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>

#include <ATen/ATen.h>
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
  // TODO(lesson5, step 1): Sum `tensor` over the ranks with comm.all_reduce (in place), then divide it by
  // comm.world_size() (under at::NoGradGuard: it may be a gradient).
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

// [average_gradients]
void average_gradients(dist::Comm& comm, const std::vector<at::Tensor>& params) {
  // TODO(lesson5, step 1): For every parameter: TORCH_CHECK that its .grad is defined (else say it "has no
  // gradient"), then average_(comm, its grad): one all-reduce per parameter. A non-contiguous gradient
  // needs a contiguous copy, averaged, then copied back.
  TORCH_CHECK(false, "TODO(lesson5, step 1): average_gradients() is not implemented yet");
}
// [average_gradients]

// [make_buckets]
std::vector<Bucket> make_buckets(const std::vector<at::Tensor>& params, int64_t bucket_bytes) {
  // TODO(lesson5, step 2): Reject bucket_bytes <= 0 ("bucket_bytes must be > 0") and no parameters. Walk
  // the parameters from the LAST to the first; before adding one, close the current bucket if it is not
  // empty and the parameter would take it past bucket_bytes, or its dtype differs. Record index, numel and
  // bytes (numel * element_size()). Push the last bucket at the end.
  TORCH_CHECK(false, "TODO(lesson5, step 2): make_buckets() is not implemented yet");
}
// [make_buckets]

// [average_gradients_bucketed]
void average_gradients_bucketed(dist::Comm& comm, const std::vector<at::Tensor>& params,
                                const std::vector<Bucket>& buckets) {
  // TODO(lesson5, step 2): For every bucket: at::cat the flattened (reshape({-1})) gradients of its
  // parameters (each must exist: "has no gradient"), average_ the flat buffer (ONE all-reduce per bucket),
  // and copy each parameter's slice back: grad.copy_(flat.narrow(0, offset, numel).view_as(grad)).
  TORCH_CHECK(false, "TODO(lesson5, step 2): average_gradients_bucketed() is not implemented yet");
}
// [average_gradients_bucketed]

// [reducer]
Reducer::Reducer(dist::Comm& comm, std::vector<at::Tensor> params, ReducerOptions options)
    : comm_(comm), params_(std::move(params)), options_(options) {
  // TODO(lesson5, step 3): Check every parameter requires grad; check_same_shapes; buckets_ = make_buckets.
  // For every bucket b and parameter i in it: bucket_of_[i] = b, offset_of_[i] = running offset; one flat
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
  // TODO(lesson5, step 3): (Step 4 comes back to this line: while sync_ is false, return at once, so that the
  // gradient accumulates in .grad.) Under at::NoGradGuard copy `grad` (flattened) into this parameter's slot of its
  // bucket's buffer and add its current .grad when defined (autograd adds `grad` into .grad only after this
  // hook). Mark it ready; when its bucket has no missing gradient left and options_.overlap, launch, IN
  // BUCKET ORDER, every consecutive ready bucket from next_to_launch_ with comm_.all_reduce_async(buffer),
  // counting launched_in_backward_.
  TORCH_CHECK(false, "TODO(lesson5, step 3): Reducer::grad_ready() is not implemented yet");
}
// [grad_ready]

// [finish]
void Reducer::finish() {
  // TODO(lesson5, step 3): Every parameter must be ready, else "got no gradient" (unused parameters are
  // not supported). Launch the buckets not launched yet (in order), then per bucket: wait, divide the buffer
  // by the world size and copy each slice (view_as the parameter) into .grad. Reset ready_, missing_, work_
  // and next_to_launch_ for the next backward, also when throwing.
  TORCH_CHECK(false, "TODO(lesson5, step 3): Reducer::finish() is not implemented yet");
}
// [finish]

// [all_ranks_found_inf]
bool all_ranks_found_inf(dist::Comm& comm, bool local_found_inf) {
  // TODO(lesson5, step 4): A one-element float tensor on comm.device(), 1 or 0, all-reduced with
  // dist::ReduceOp::kMax; true when the result is > 0.
  TORCH_CHECK(false, "TODO(lesson5, step 4): all_ranks_found_inf() is not implemented yet");
}
// [all_ranks_found_inf]

// [scaler_step]
bool scaler_step(dist::Comm& comm, amp::GradScaler& scaler, torch::optim::Optimizer& optimizer) {
  // TODO(lesson5, step 4): Look for a non-finite value in the gradients of optimizer's parameters
  // (at::isfinite(g).all()); agree with all_ranks_found_inf. If another rank found one and this rank did
  // not, write an inf into one of this rank's gradients (they are discarded on a skipped step) so that
  // lesson 1's scaler skips here too. Return scaler.step(optimizer).
  TORCH_CHECK(false, "TODO(lesson5, step 4): scaler_step() is not implemented yet");
}
// [scaler_step]

// [train_step]
bool train_step(Reducer& reducer, torch::optim::Optimizer& optimizer,
                const std::vector<accum::MicroBatch>& micro_batches, const accum::LossFn& loss_fn,
                amp::GradScaler* scaler) {
  // TODO(lesson5, step 4): Reject no micro-batches. Zero the gradients. For each micro-batch: loss_fn(mb)
  // times count / (this rank's items), scaled by the scaler when given, backward — all but the last inside
  // a NoSync(reducer) scope (std::optional<NoSync> helps). Then reducer.finish(); without a scaler
  // optimizer.step() and return true; with one: scaler_step(reducer.comm(), ...), scaler->update().
  TORCH_CHECK(false, "TODO(lesson5, step 4): train_step() is not implemented yet");
}
// [train_step]

// [partition_parameters]
std::vector<int> partition_parameters(const std::vector<at::Tensor>& params, int world_size) {
  // TODO(lesson5, step 5): Reject world_size <= 0 and no parameters. Order the indices by bytes, largest
  // first (std::stable_sort keeps ties in index order); give each to the rank with the fewest bytes so far
  // (std::min_element finds the first, i.e. lowest, such rank).
  TORCH_CHECK(false, "TODO(lesson5, step 5): partition_parameters() is not implemented yet");
}
// [partition_parameters]

// [zero]
ZeroOptimizer::ZeroOptimizer(dist::Comm& comm, std::vector<at::Tensor> params, const OptimizerFactory& factory)
    : comm_(comm), params_(std::move(params)) {
  // TODO(lesson5, step 5): Reject no parameters; owners_ = partition_parameters; local_ = factory(the
  // parameters this rank owns).
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

bool ZeroOptimizer::step(amp::GradScaler& scaler) {
  // TODO(lesson5, step 5): scaler_step (step 4) on this rank's optimizer; sync_parameters() only when it
  // stepped (every rank agrees, so the broadcasts match up). Return whether it stepped.
  TORCH_CHECK(false, "TODO(lesson5, step 5): ZeroOptimizer::step(scaler) is not implemented yet");
}
// [zero]

// Given.
ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::zero_grad() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
}

int64_t ZeroOptimizer::state_bytes() const {
  TORCH_CHECK(local_ != nullptr, "ZeroOptimizer: no local optimizer");
  return optimizer_state_bytes(*local_);
}

}  // namespace ddp
