// Reference solution of lesson 5 (lesson5_distributed/ddp.h).
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
namespace {

// This rank's gradient of params[i], contiguous, with a clear error when there is none.
at::Tensor grad_of(const std::vector<at::Tensor>& params, size_t i) {
  TORCH_CHECK(params[i].grad().defined(), "parameter ", i, " has no gradient (run backward before averaging)");
  return params[i].grad();
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
  comm.all_reduce(tensor);  // sum over the ranks, in place on every rank
  at::NoGradGuard no_grad;
  tensor.div_(comm.world_size());
}
// [average]

// [check_same_shapes]
void check_same_shapes(dist::Comm& comm, const std::vector<at::Tensor>& params) {
  // Three numbers per rank whatever the model: this collective itself can never mismatch.
  const at::Tensor mine = describe(params).to(comm.device());
  const std::vector<at::Tensor> all = comm.all_gather(mine);
  const at::Tensor first = all[0].cpu();
  for (size_t r = 1; r < all.size(); ++r) {
    const at::Tensor other = all[r].cpu();
    if (!at::equal(first, other)) {
      // Every rank sees the same gathered numbers, so every rank throws this same message.
      TORCH_CHECK(false, "rank ", comm.rank(), ": parameter shapes differ across ranks: rank 0 has ",
                  first[0].item<int64_t>(), " parameters with ", first[1].item<int64_t>(), " elements, rank ", r,
                  " has ", other[0].item<int64_t>(), " parameters with ", other[1].item<int64_t>(),
                  " elements (or different shapes or dtypes); every rank must build the same model");
    }
  }
}
// [check_same_shapes]

// [average_gradients]
void average_gradients(dist::Comm& comm, const std::vector<at::Tensor>& params) {
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
std::vector<Bucket> make_buckets(const std::vector<at::Tensor>& params, int64_t bucket_bytes) {
  TORCH_CHECK(bucket_bytes > 0, "make_buckets: bucket_bytes must be > 0, got ", bucket_bytes);
  TORCH_CHECK(!params.empty(), "make_buckets: no parameters");
  std::vector<Bucket> buckets;
  Bucket current;
  c10::ScalarType dtype = params.back().scalar_type();
  for (size_t k = params.size(); k-- > 0;) {  // reverse: the order backward produces the gradients in
    const at::Tensor& p = params[k];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    const bool full = current.bytes + bytes > bucket_bytes;
    if (!current.params.empty() && (full || p.scalar_type() != dtype)) {
      buckets.push_back(current);
      current = Bucket{};
    }
    dtype = p.scalar_type();
    current.params.push_back(k);
    current.numel += p.numel();
    current.bytes += bytes;
  }
  buckets.push_back(current);
  return buckets;
}
// [make_buckets]

// [average_gradients_bucketed]
void average_gradients_bucketed(dist::Comm& comm, const std::vector<at::Tensor>& params,
                                const std::vector<Bucket>& buckets) {
  at::NoGradGuard no_grad;
  for (const Bucket& bucket : buckets) {
    std::vector<at::Tensor> pieces;
    for (size_t i : bucket.params) {
      TORCH_CHECK(i < params.size(), "average_gradients_bucketed: a bucket names parameter ", i, " of ",
                  params.size());
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
    : comm_(comm), params_(std::move(params)), options_(options) {
  for (size_t i = 0; i < params_.size(); ++i) {
    TORCH_CHECK(params_[i].requires_grad(), "Reducer: parameter ", i, " does not require grad");
  }
  check_same_shapes(comm_, params_);
  buckets_ = make_buckets(params_, options_.bucket_bytes);
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
  if (!sync_) return;  // no_sync: let the gradient accumulate in .grad, talk at the window's last backward
  TORCH_CHECK(index < params_.size(), "Reducer::grad_ready: no parameter ", index);
  TORCH_CHECK(!ready_[index], "Reducer: parameter ", index, " got two gradients in one backward");
  at::NoGradGuard no_grad;
  const at::Tensor& param = params_[index];
  const size_t b = bucket_of_[index];
  at::Tensor slot = buffers_[b].narrow(0, offset_of_[index], param.numel());
  slot.copy_(grad.reshape({-1}));
  // .grad does not hold this gradient yet: add what earlier (no_sync) backward passes accumulated there.
  if (param.grad().defined()) slot.add_(param.grad().reshape({-1}));
  ready_[index] = true;
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
  TORCH_CHECK(sync_, "Reducer::finish: called while sync() is false (inside NoSync)");
  // Reset for the next backward whatever happens below (the AsyncWork destructors wait for launched work).
  struct Reset {
    Reducer& r;
    ~Reset() {
      std::fill(r.ready_.begin(), r.ready_.end(), false);
      for (size_t b = 0; b < r.buckets_.size(); ++b) r.missing_[b] = static_cast<int64_t>(r.buckets_[b].params.size());
      r.work_.clear();
      r.work_.resize(r.buckets_.size());
      r.next_to_launch_ = 0;
    }
  } reset{*this};
  for (size_t i = 0; i < params_.size(); ++i) {
    TORCH_CHECK(ready_[i], "rank ", comm_.rank(), ": parameter ", i,
                " got no gradient in this backward (unused parameters are not supported)");
  }
  while (next_to_launch_ < buckets_.size()) {  // overlap off: everything goes now, still in order
    work_[next_to_launch_] = comm_.all_reduce_async(buffers_[next_to_launch_]);
    ++next_to_launch_;
  }
  at::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    work_[b].wait();
    buffers_[b].div_(comm_.world_size());
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

// [all_ranks_found_inf]
bool all_ranks_found_inf(dist::Comm& comm, bool local_found_inf) {
  const at::Tensor flag = at::full({1}, local_found_inf ? 1.0f : 0.0f, at::TensorOptions().device(comm.device()));
  comm.all_reduce(flag, dist::ReduceOp::kMax);  // 1 on every rank if any rank had 1
  return flag.item<float>() > 0;
}
// [all_ranks_found_inf]

// [scaler_step]
bool scaler_step(dist::Comm& comm, amp::GradScaler& scaler, torch::optim::Optimizer& optimizer) {
  at::Tensor first_grad;
  bool local = false;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!first_grad.defined()) first_grad = p.grad();
      if (!at::isfinite(p.grad()).all().item<bool>()) local = true;
    }
  }
  const bool any = all_ranks_found_inf(comm, local);
  if (any && !local && first_grad.defined()) {
    // Another rank saw an inf in gradients this rank's optimizer does not hold (ZeRO: another shard).
    // lesson 1's scaler only trusts its own check, so show it one: these gradients are discarded anyway.
    at::NoGradGuard no_grad;
    first_grad.view({-1})[0].fill_(std::numeric_limits<float>::infinity());
  }
  return scaler.step(optimizer);
}
// [scaler_step]

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
    at::Tensor loss = loss_fn(micro_batches[i]) * (static_cast<double>(micro_batches[i].count()) / items);
    if (scaler != nullptr) loss = scaler->scale(loss);
    loss.backward();
  }
  reducer.finish();
  if (scaler == nullptr) {
    optimizer.step();
    return true;
  }
  const bool stepped = scaler_step(reducer.comm(), *scaler, optimizer);
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
  auto bytes = [&](size_t i) { return params[i].numel() * static_cast<int64_t>(params[i].element_size()); };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bytes(a) > bytes(b); });
  std::vector<int64_t> load(static_cast<size_t>(world_size), 0);
  std::vector<int> owner(params.size(), 0);
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());  // first minimum
    owner[i] = r;
    load[static_cast<size_t>(r)] += bytes(i);
  }
  return owner;
}
// [partition_parameters]

// [zero]
ZeroOptimizer::ZeroOptimizer(dist::Comm& comm, std::vector<at::Tensor> params, const OptimizerFactory& factory)
    : comm_(comm), params_(std::move(params)) {
  TORCH_CHECK(!params_.empty(), "ZeroOptimizer: no parameters");
  owners_ = partition_parameters(params_, comm_.world_size());
  std::vector<at::Tensor> mine;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owners_[i] == comm_.rank()) mine.push_back(params_[i]);
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

bool ZeroOptimizer::step(amp::GradScaler& scaler) {
  // Every rank agrees whether to step (an inf may sit in another rank's shard), so the broadcasts match.
  const bool stepped = scaler_step(comm_, scaler, *local_);
  if (stepped) sync_parameters();
  return stepped;
}
// [zero]

ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::zero_grad() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
}

int64_t ZeroOptimizer::state_bytes() const { return optimizer_state_bytes(*local_); }

}  // namespace ddp
