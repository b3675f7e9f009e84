// Lesson 5 — given code (not an exercise), compiled into both the skeleton and the reference solution.
#include <ATen/core/grad_mode.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include "lesson5_distributed/ddp.h"

namespace ddp {

at::Tensor describe(const std::vector<at::Tensor>& params) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over (dtype, dim, sizes...) of every parameter
  auto mix = [&hash](int64_t value) {
    hash ^= static_cast<uint64_t>(value);
    hash *= 1099511628211ull;
  };
  int64_t elements = 0;
  for (const auto& p : params) {
    mix(static_cast<int64_t>(p.scalar_type()));
    mix(p.dim());
    for (int64_t size : p.sizes()) mix(size);
    elements += p.numel();
  }
  // int64 keeps the hash exact (a float tensor would round it).
  return at::tensor({static_cast<int64_t>(params.size()), elements, static_cast<int64_t>(hash >> 1)},
                    at::TensorOptions().dtype(at::kLong));
}

void Reducer::tell_peers(float mark) {
  at::NoGradGuard no_grad;
  while (next_to_launch_ < buckets_.size()) {
    work_[next_to_launch_] = comm_.all_reduce_async(buffers_[next_to_launch_]);
    ++next_to_launch_;
  }
  at::Tensor marked = at::full({static_cast<int64_t>(params_.size())}, mark, buffers_[0].options().dtype(at::kFloat));
  comm_.all_reduce(marked);
  for (auto& work : work_) work.wait();
}

void Reducer::fail_unfinished(const char* where) {
  tell_peers(kForgottenFinish);
  TORCH_CHECK(false, "rank ", comm_.rank(), ": ", where, ": finish() was not called after the previous backward");
}

void Reducer::fail_not_synced() {
  tell_peers(kNotSynced);
  TORCH_CHECK(false, "rank ", comm_.rank(),
              ": Reducer::finish: this backward did not sync (its forward ran inside NoSync), so there is nothing to "
              "finish: call finish() after the window's last backward only, and run every forward through "
              "Reducer::forward on every rank");
}

at::Tensor ZeroOptimizer::empty_shard() {
  at::NoGradGuard no_grad;
  // float32 whatever the model (a frozen float16 layer may come first): lesson 1's unscale_ refuses float16.
  empty_shard_ = at::zeros({0}, params_.front().options().dtype(at::kFloat)).requires_grad_(true);
  empty_shard_.mutable_grad() = at::zeros({0}, empty_shard_.options());
  return empty_shard_;
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  auto add = [&bytes](const at::Tensor& t) {
    if (t.defined()) bytes += static_cast<int64_t>(t.nbytes());
  };
  for (const auto& entry : optimizer.state()) {
    const torch::optim::OptimizerParamState* state = entry.second.get();
    if (auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(state)) {
      add(adam->exp_avg());
      add(adam->exp_avg_sq());
      add(adam->max_exp_avg_sq());
    } else if (auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(state)) {
      add(adamw->exp_avg());
      add(adamw->exp_avg_sq());
      add(adamw->max_exp_avg_sq());
    } else if (auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
      add(sgd->momentum_buffer());
    } else {
      TORCH_CHECK(false, "optimizer_state_bytes: Adam, AdamW and SGD are supported");
    }
  }
  return bytes;
}

}  // namespace ddp
