// Reference solution of lesson 5 (lesson5_distributed/ddp.h).
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
namespace {

// This rank's gradient of params[i], contiguous, with a clear error when there is none.
at::Tensor grad_of(const std::vector<at::Tensor>& params, size_t i) {
  TORCH_CHECK(params[i].grad().defined(), "parameter ", i, " has no gradient (run backward before averaging)");
  return params[i].grad();
}

// Compares every rank's description (describe(): 3 numbers, the first 3 of each gathered row) with rank 0's and
// throws, on every rank alike (all see the same rows), "parameter shapes differ across ranks".
void compare_descriptions(const dist::Comm& comm, const std::vector<at::Tensor>& all) {
  const at::Tensor first = all[0].cpu().narrow(0, 0, 3);
  for (size_t r = 1; r < all.size(); ++r) {
    const at::Tensor other = all[r].cpu().narrow(0, 0, 3);
    if (!at::equal(first, other)) {
      TORCH_CHECK(false, "rank ", comm.rank(), ": parameter shapes differ across ranks: rank 0 has ",
                  first[0].item<int64_t>(), " parameters with ", first[1].item<int64_t>(), " elements, rank ", r,
                  " has ", other[0].item<int64_t>(), " parameters with ", other[1].item<int64_t>(),
                  " elements (or different shapes or dtypes); every rank must build the same model");
    }
  }
}

// The Reducer's agreement: describe(params) and the two bucket limits (the first one as make_buckets reads it).
at::Tensor describe_reducer(const std::vector<at::Tensor>& params, const ReducerOptions& options) {
  const int64_t first = options.first_bucket_bytes > 0 ? options.first_bucket_bytes : options.bucket_bytes;
  const auto as_long = at::TensorOptions().dtype(at::kLong);
  return at::cat({describe(params), at::full({1}, options.bucket_bytes, as_long), at::full({1}, first, as_long)});
}

// Compares every rank's bucket limits (entries 3 and 4 of describe_reducer) with rank 0's, on every rank alike.
void compare_limits(const dist::Comm& comm, const std::vector<at::Tensor>& all) {
  const at::Tensor first = all[0].cpu().narrow(0, 3, 2);
  for (size_t r = 1; r < all.size(); ++r) {
    const at::Tensor other = all[r].cpu().narrow(0, 3, 2);
    TORCH_CHECK(at::equal(first, other), "rank ", comm.rank(),
                ": Reducer: the bucket limits differ across ranks: rank 0 has bucket_bytes ", first[0].item<int64_t>(),
                " and first_bucket_bytes ", first[1].item<int64_t>(), ", rank ", r, " has ", other[0].item<int64_t>(),
                " and ", other[1].item<int64_t>(), " (every rank must pass the same ReducerOptions)");
  }
}

}  // namespace

// [shard]
at::Tensor shard(const at::Tensor& batch, int rank, int world_size) {
  TORCH_CHECK(batch.defined() && batch.dim() > 0, "shard: the batch must be a defined tensor with an item dimension");
  TORCH_CHECK(world_size > 0, "shard: world_size must be > 0, got ", world_size);
  TORCH_CHECK(rank >= 0 && rank < world_size, "shard: rank ", rank, " is outside 0 .. ", world_size - 1);
  const int64_t items = batch.size(0);
  TORCH_CHECK(items % world_size == 0, "shard: a batch of ", items, " items does not divide evenly into ", world_size,
              " ranks (every rank needs the same number of items for the average to be the full-batch mean)");
  const int64_t per_rank = items / world_size;
  return batch.narrow(0, rank * per_rank, per_rank);
}
// [shard]

// [average]
void average_(dist::Comm& comm, const at::Tensor& tensor) {
  {
    at::NoGradGuard no_grad;
    tensor.div_(comm.world_size());  // first: the sum of N divided values cannot overflow where each did not
  }
  comm.all_reduce(tensor);  // sum over the ranks, in place on every rank
}
// [average]

// [check_same_shapes]
void check_same_shapes(dist::Comm& comm, const std::vector<at::Tensor>& params) {
  // Three numbers per rank whatever the model: this collective itself can never mismatch.
  const at::Tensor mine = describe(params).to(comm.device());
  compare_descriptions(comm, comm.all_gather(mine));  // every rank sees the same numbers: all throw alike
}
// [check_same_shapes]

// [sync_module_states]
void sync_module_states(dist::Comm& comm, const std::vector<at::Tensor>& params,
                        const std::vector<at::Tensor>& buffers) {
  std::vector<at::Tensor> states = params;
  states.insert(states.end(), buffers.begin(), buffers.end());
  check_same_shapes(comm, states);  // the broadcasts below must match in size on every rank
  at::NoGradGuard no_grad;
  for (const at::Tensor& t : states) comm.broadcast(t.detach(), 0);  // rank 0's values, in place everywhere
}
// [sync_module_states]

// [check_gradients_ready]
void check_gradients_ready(dist::Comm& comm, const std::vector<at::Tensor>& params) {
  int64_t missing = -1;  // the first parameter without a gradient on this rank
  for (size_t i = 0; i < params.size() && missing < 0; ++i) {
    if (!params[i].grad().defined()) missing = static_cast<int64_t>(i);
  }
  // Four numbers per rank whatever the model: the model's description and the missing gradient, agreed on
  // BEFORE any gradient is sent, so that a rank without a gradient does not throw alone while its peers wait.
  const at::Tensor mine = at::cat({describe(params), at::full({1}, missing, at::TensorOptions().dtype(at::kLong))});
  const std::vector<at::Tensor> all = comm.all_gather(mine.to(comm.device()));
  compare_descriptions(comm, all);
  for (size_t r = 0; r < all.size(); ++r) {
    const int64_t index = all[r].cpu()[3].item<int64_t>();
    TORCH_CHECK(index < 0, "rank ", comm.rank(), ": parameter ", index, " has no gradient on rank ", r,
                " (every rank must run backward on a loss that uses every parameter before averaging)");
  }
}
// [check_gradients_ready]

// [average_gradients]
void average_gradients(dist::Comm& comm, const std::vector<at::Tensor>& params) {
  check_gradients_ready(comm, params);  // one all-gather of 32 bytes, before any gradient is sent
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor grad = grad_of(params, i);
    if (grad.is_contiguous()) {
      average_(comm, grad);  // one all-reduce per parameter: many small messages
    } else {
      at::Tensor flat = grad.contiguous();
      average_(comm, flat);
      grad.copy_(flat);
    }
  }
}
// [average_gradients]

// [make_buckets]
std::vector<Bucket> make_buckets(const std::vector<at::Tensor>& params, int64_t bucket_bytes,
                                 int64_t first_bucket_bytes) {
  TORCH_CHECK(bucket_bytes > 0, "make_buckets: bucket_bytes must be > 0, got ", bucket_bytes);
  TORCH_CHECK(!params.empty(), "make_buckets: no parameters");
  if (first_bucket_bytes <= 0) first_bucket_bytes = bucket_bytes;
  struct Open {
    Bucket bucket;
    bool first = true;  // this dtype's next bucket is its first one
  };
  std::map<c10::ScalarType, Open> open;  // one accumulator per dtype, as DDP's (dtype, device) keys
  std::vector<Bucket> buckets;
  for (size_t k = params.size(); k-- > 0;) {  // reverse: the order backward produces the gradients in
    const at::Tensor& p = params[k];
    Open& acc = open[p.scalar_type()];
    acc.bucket.params.push_back(k);
    acc.bucket.numel += p.numel();
    acc.bucket.bytes += p.numel() * static_cast<int64_t>(p.element_size());
    const int64_t limit = acc.first ? first_bucket_bytes : bucket_bytes;
    if (acc.bucket.bytes >= limit) {  // closes once it REACHES the limit, with this parameter in it
      buckets.push_back(acc.bucket);
      acc.bucket = Bucket{};
      acc.first = false;
    }
  }
  std::vector<Bucket> rest;
  for (auto& entry : open) {
    if (!entry.second.bucket.params.empty()) rest.push_back(entry.second.bucket);
  }
  // Still open: in the order of their first parameter (the walk's order), the same on every rank.
  std::sort(rest.begin(), rest.end(), [](const Bucket& a, const Bucket& b) { return a.params[0] > b.params[0]; });
  buckets.insert(buckets.end(), rest.begin(), rest.end());
  return buckets;
}
// [make_buckets]

// [average_gradients_bucketed]
void average_gradients_bucketed(dist::Comm& comm, const std::vector<at::Tensor>& params,
                                const std::vector<Bucket>& buckets) {
  check_gradients_ready(comm, params);  // different models, or a missing gradient: the same error on every rank
  at::NoGradGuard no_grad;
  for (const Bucket& bucket : buckets) {
    std::vector<at::Tensor> pieces;
    for (size_t i : bucket.params) {
      TORCH_CHECK(i < params.size(), "average_gradients_bucketed: a bucket names parameter ", i, " of ", params.size());
      pieces.push_back(grad_of(params, i).reshape({-1}));
    }
    at::Tensor flat = at::cat(pieces);  // one contiguous buffer: one message instead of |bucket|
    average_(comm, flat);
    int64_t offset = 0;
    for (size_t i : bucket.params) {
      at::Tensor grad = params[i].grad();
      grad.copy_(flat.narrow(0, offset, grad.numel()).view_as(grad));
      offset += grad.numel();
    }
  }
}
// [average_gradients_bucketed]

// [reducer]
Reducer::Reducer(dist::Comm& comm, std::vector<at::Tensor> params, ReducerOptions options)
    : comm_(comm), options_(options) {
  sync_module_states(comm_, params);  // every replica starts from rank 0's parameters, frozen ones included
  std::unordered_set<const void*> seen;
  for (const at::Tensor& p : params) {
    // As DDP: only what requires grad is reduced, and a tensor listed twice (tied weights) once.
    if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) params_.push_back(p);
  }
  // As DDP's _verify_param_shape_across_processes, on the list it reduces (ranks that freeze different layers or
  // tie weights differently pass the check of the whole model above), and the bucket limits with it (other limits
  // make other buckets): one all-gather of 5 int64, outside the try, so that a timeout is reported as one.
  const std::vector<at::Tensor> all = comm_.all_gather(describe_reducer(params_, options_).to(comm_.device()));
  try {
    compare_descriptions(comm_, all);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false,
                "Reducer: the parameters that require grad, each once, differ across ranks (frozen or tied "
                "differently?): ",
                e.what_without_backtrace());
  }
  compare_limits(comm_, all);
  TORCH_CHECK(!params_.empty(), "Reducer: no parameter requires grad");  // then on every rank alike
  buckets_ = make_buckets(params_, options_.bucket_bytes, options_.first_bucket_bytes);
  bucket_of_.assign(params_.size(), 0);
  offset_of_.assign(params_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    int64_t offset = 0;
    for (size_t i : buckets_[b].params) {
      bucket_of_[i] = b;
      offset_of_[i] = offset;
      offset += params_[i].numel();
    }
    const at::Tensor& first = params_[buckets_[b].params.front()];
    buffers_.push_back(at::empty({buckets_[b].numel}, first.options().requires_grad(false)));
    missing_.push_back(static_cast<int64_t>(buckets_[b].params.size()));
  }
  ready_.assign(params_.size(), false);
  work_.resize(buckets_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    // The hook runs when autograd has computed this parameter's gradient, before it is added into .grad.
    hooks_.push_back(params_[i].register_hook([this, i](const at::Tensor& grad) { grad_ready(i, grad); }));
  }
}
// [reducer]

Reducer::~Reducer() {
  for (size_t i = 0; i < hooks_.size(); ++i) params_[i].remove_hook(hooks_[i]);
}

// [grad_ready]
void Reducer::grad_ready(size_t index, const at::Tensor& grad) {
  TORCH_CHECK(index < params_.size(), "Reducer::grad_ready: no parameter ", index);
  // As DDP: what the forward of this backward saw decides (without forward(), sync() as it is now).
  const bool sync = forward_sync_ >= 0 ? forward_sync_ == 1 : sync_;
  if (!sync) return;  // no_sync: let the gradient accumulate in .grad, talk at the window's last backward
  if (ready_[index]) fail_unfinished("Reducer: a parameter got a second gradient before finish()");
  at::NoGradGuard no_grad;
  const at::Tensor& param = params_[index];
  const size_t b = bucket_of_[index];
  at::Tensor slot = buffers_[b].narrow(0, offset_of_[index], param.numel());
  // .grad does not hold this gradient yet: add what earlier (no_sync) backward passes accumulated there.
  const at::Tensor local =
      param.grad().defined() ? grad.reshape({-1}).add(param.grad().reshape({-1})) : grad.reshape({-1});
  slot.copy_(local);
  slot.div_(comm_.world_size());  // as DDP: divided before the sum, not after
  ready_[index] = true;
  synced_backward_ = true;
  if (--missing_[b] == 0 && options_.overlap) {
    // Launch in bucket order only: every rank must issue the same collectives in the same order.
    while (next_to_launch_ < buckets_.size() && missing_[next_to_launch_] == 0) {
      work_[next_to_launch_] = comm_.all_reduce_async(buffers_[next_to_launch_]);
      ++next_to_launch_;
      ++launched_in_backward_;
    }
  }
}
// [grad_ready]

// [finish]
void Reducer::finish() {
  // Reset for the next backward whatever happens below (the AsyncWork destructors wait for launched work).
  struct Reset {
    Reducer& r;
    ~Reset() {
      std::fill(r.ready_.begin(), r.ready_.end(), false);
      for (size_t b = 0; b < r.buckets_.size(); ++b) r.missing_[b] = static_cast<int64_t>(r.buckets_[b].params.size());
      r.work_.clear();
      r.work_.resize(r.buckets_.size());
      r.next_to_launch_ = 0;
      r.forward_sync_ = -1;
      r.synced_backward_ = false;
    }
  } reset{*this};
  const bool sync = forward_sync_ >= 0 ? forward_sync_ == 1 : sync_;
  if (!sync) fail_not_synced();  // makes the calls a synced finish() makes, so a peer that synced fails too
  at::NoGradGuard no_grad;
  // DDP's local_used_map: 1 for each parameter that got no gradient here. A missing gradient contributes
  // zeros, so that every rank still launches every bucket and then this map: the same calls on every rank.
  at::Tensor unused = at::zeros({static_cast<int64_t>(params_.size())}, buffers_[0].options().dtype(at::kFloat));
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    unused[static_cast<int64_t>(i)] = 1.0f;
    buffers_[bucket_of_[i]].narrow(0, offset_of_[i], params_[i].numel()).zero_();
  }
  while (next_to_launch_ < buckets_.size()) {  // overlap off: everything goes now, still in order
    work_[next_to_launch_] = comm_.all_reduce_async(buffers_[next_to_launch_]);
    ++next_to_launch_;
  }
  comm_.all_reduce(unused);  // summed: on how many ranks each parameter got no gradient
  for (auto& work : work_) work.wait();
  const at::Tensor missing = unused.cpu();
  for (size_t i = 0; i < params_.size(); ++i) {
    const float ranks = missing[static_cast<int64_t>(i)].item<float>();
    TORCH_CHECK(ranks < Reducer::kForgottenFinish, "rank ", comm_.rank(),
                ": Reducer::finish: another rank's finish() was not called after its previous backward (it went on "
                "to its next backward or forward)");
    TORCH_CHECK(ranks < Reducer::kNotSynced, "rank ", comm_.rank(),
                ": Reducer::finish: another rank's backward did not sync (its forward ran inside NoSync) while this "
                "rank's did: run every forward through Reducer::forward, on every rank");
    TORCH_CHECK(ranks == 0, "rank ", comm_.rank(), ": parameter ", i, " got no gradient in this backward on ",
                static_cast<int>(ranks), " of ", comm_.world_size(),
                " ranks (unused parameters are not supported: every rank's loss must use every parameter)");
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t i : buckets_[b].params) {
      const at::Tensor average = buffers_[b].narrow(0, offset_of_[i], params_[i].numel()).view_as(params_[i]);
      if (params_[i].grad().defined()) {
        params_[i].mutable_grad().copy_(average);
      } else {
        params_[i].mutable_grad() = average.clone();
      }
    }
  }
}
// [finish]

// [forward]
at::Tensor Reducer::forward(const std::function<at::Tensor()>& forward_fn) {
  if (synced_backward_) fail_unfinished("Reducer::forward");
  forward_sync_ = sync_ ? 1 : 0;  // DDP reads require_backward_grad_sync in forward, not in backward
  return forward_fn();
}
// [forward]

// [all_ranks_found_inf]
bool all_ranks_found_inf(dist::Comm& comm, bool local_found_inf) {
  const at::Tensor flag = at::full({1}, local_found_inf ? 1.0f : 0.0f, at::TensorOptions().device(comm.device()));
  comm.all_reduce(flag, dist::ReduceOp::kMax);  // 1 on every rank if any rank had 1
  return flag.item<float>() > 0;
}
// [all_ranks_found_inf]

// [sharded_scaler]
ShardedGradScaler::ShardedGradScaler(dist::Comm& comm, amp::GradScalerOptions options)
    : amp::GradScaler(options), comm_(comm) {}

void ShardedGradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!is_enabled()) return;
  std::exception_ptr failed;
  try {
    amp::GradScaler::unscale_(optimizer);  // this rank's gradients only
  } catch (...) {
    failed = std::current_exception();
  }
  const at::Tensor found_inf = recorded_found_inf(optimizer);
  // {found_inf, failed}: one all-reduce MAX, also from a rank whose unscale threw, so nobody waits for it.
  at::Tensor flags = at::zeros({2}, at::TensorOptions().dtype(at::kFloat).device(comm_.device()));
  if (failed) {
    flags[1] = 1.0f;
  } else {
    flags.narrow(0, 0, 1).copy_(found_inf);
  }
  comm_.all_reduce(flags, dist::ReduceOp::kMax);
  if (failed) std::rethrow_exception(failed);
  TORCH_CHECK(flags[1].item<float>() == 0, "rank ", comm_.rank(),
              ": ShardedGradScaler::unscale_: another rank's unscale_ failed (see its error)");
  found_inf.copy_(flags.narrow(0, 0, 1));  // the flag step() and update() read: 1 on every rank if on any
}
// [sharded_scaler]

// [train_step]
bool train_step(Reducer& reducer, torch::optim::Optimizer& optimizer,
                const std::vector<accum::MicroBatch>& micro_batches, const accum::LossFn& loss_fn,
                amp::GradScaler* scaler) {
  TORCH_CHECK(!micro_batches.empty(), "train_step: no micro-batches");
  int64_t items = 0;
  for (const auto& mb : micro_batches) items += mb.count();
  TORCH_CHECK(items > 0, "train_step: the micro-batches hold no items");
  optimizer.zero_grad();
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    std::optional<NoSync> quiet;
    if (i + 1 < micro_batches.size()) quiet.emplace(reducer);  // only the window's last backward talks
    const double weight = static_cast<double>(micro_batches[i].count()) / items;
    at::Tensor loss = reducer.forward([&] { return loss_fn(micro_batches[i]).mul(weight); });
    if (scaler != nullptr) loss = scaler->scale(loss);
    loss.backward();
  }
  reducer.finish();
  if (scaler == nullptr) {
    optimizer.step();
    return true;
  }
  const bool stepped = scaler->step(optimizer);  // averaged gradients: an inf on one rank is inf on all
  scaler->update();
  return stepped;
}
// [train_step]

// [partition_parameters]
std::vector<int> partition_parameters(const std::vector<at::Tensor>& params, int world_size) {
  TORCH_CHECK(world_size > 0, "partition_parameters: world_size must be > 0, got ", world_size);
  TORCH_CHECK(!params.empty(), "partition_parameters: no parameters");
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), 0);
  auto size = [&](size_t i) { return params[i].numel(); };  // elements, as ZeroRedundancyOptimizer counts
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return size(a) > size(b); });
  std::vector<int64_t> load(static_cast<size_t>(world_size), 0);
  std::vector<int> owner(params.size(), 0);
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());  // first minimum
    owner[i] = r;
    load[static_cast<size_t>(r)] += size(i);
  }
  return owner;
}
// [partition_parameters]

// [zero]
ZeroOptimizer::ZeroOptimizer(dist::Comm& comm, std::vector<at::Tensor> params, const OptimizerFactory& factory)
    : comm_(comm), params_(std::move(params)) {
  TORCH_CHECK(!params_.empty(), "ZeroOptimizer: no parameters");
  std::unordered_set<const void*> seen;
  std::vector<at::Tensor> unique;
  for (const at::Tensor& p : params_) {
    // A tensor listed twice (tied weights) once: else it is stepped twice, or its state is held on two ranks.
    if (seen.insert(p.unsafeGetTensorImpl()).second) unique.push_back(p);
  }
  params_ = std::move(unique);
  check_same_shapes(comm_, params_);  // the broadcasts of sync_parameters must match in size on every rank
  owners_ = partition_parameters(params_, comm_.world_size());
  std::vector<at::Tensor> mine;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owners_[i] == comm_.rank()) mine.push_back(params_[i]);
  }
  // Owns nothing that gets a gradient (nothing, or frozen parameters only): a zero-sized shard, so that its scaler
  // finds a gradient, no inf in it, and joins the agreements with 0, as a rank without gradients in PyTorch's.
  if (std::none_of(mine.begin(), mine.end(), [](const at::Tensor& p) { return p.requires_grad(); })) {
    mine.push_back(empty_shard());
  }
  local_ = factory(mine);  // optimizer state only for this rank's share
}

void ZeroOptimizer::step_local() { local_->step(); }

void ZeroOptimizer::sync_parameters() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    comm_.broadcast(params_[i].detach(), owners_[i]);  // the owner's freshly stepped values, to every rank
  }
}

void ZeroOptimizer::step() {
  step_local();
  sync_parameters();
}

bool ZeroOptimizer::step(ShardedGradScaler& scaler) {
  TORCH_CHECK(&scaler.comm() == &comm_, "ZeroOptimizer::step: the ShardedGradScaler is on another communicator");
  // The sharded scaler agrees on found_inf inside unscale_ (an inf may sit in another rank's shard), so every
  // rank steps or skips alike and the broadcasts match.
  const bool stepped = scaler.step(*local_);
  if (stepped) sync_parameters();
  return stepped;
}
// [zero]

ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::zero_grad() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
  if (empty_shard_.defined()) empty_shard_.mutable_grad() = at::zeros({0}, empty_shard_.options());
}

int64_t ZeroOptimizer::state_bytes() const { return optimizer_state_bytes(*local_); }

}  // namespace ddp
