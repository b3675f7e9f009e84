// Lesson 7 — your code. Replace each TODO with an implementation; step K's checks in fsdp_stepK_test.cc tell you
// when it is right:  bazel test //lesson7_fsdp:fsdp_stepK_test  (e.g. fsdp_step1_test)
#include "lesson7_fsdp/fsdp.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>  // Tensor with its methods and operators (+, *, ...)
#include <ATen/core/grad_mode.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/serialize.h>

namespace fsdp {

// [shard_numel]
int64_t shard_numel(int64_t numel, int world_size) {
  // TODO(lesson7, step 1): refuse world_size <= 0 and numel < 0 in fsdp.h's words; return numel / world_size
  // rounded up (about 3 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 1): shard_numel() is not implemented yet");
}
// [shard_numel]

// [reduce_scatter_into]
void reduce_scatter_into(dist::Comm& comm, const at::Tensor& full, const at::Tensor& shard) {
  // TODO(lesson7, step 1): check the arguments on every rank before any traffic (fsdp.h's words), then the ring:
  // N - 1 rounds of recv_async + send_async, wait on both, add your chunk (about 20 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 1): reduce_scatter_into() is not implemented yet");
}
// [reduce_scatter_into]

// [all_gather_into]
void all_gather_into(dist::Comm& comm, const at::Tensor& shard, const at::Tensor& full) {
  // TODO(lesson7, step 1): the same checks; copy shard into chunk comm.rank() of full, then N - 1 rounds that send
  // on the chunk you got last and receive the next one into its place (about 12 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 1): all_gather_into() is not implemented yet");
}
// [all_gather_into]

// [padded_wrappers]
at::Tensor reduce_scatter(dist::Comm& comm, const at::Tensor& tensor) {
  // TODO(lesson7, step 1): pad with zeros to N x shard_numel(numel, N), then reduce_scatter_into a new shard
  // (about 7 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 1): reduce_scatter() is not implemented yet");
}

at::Tensor all_gather(dist::Comm& comm, const at::Tensor& shard, int64_t numel) {
  // TODO(lesson7, step 1): refuse a shard that is not shard_numel(numel, N) long ("elements, but"); all_gather_into
  // a padded buffer and return its first numel elements (about 7 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 1): all_gather() is not implemented yet");
}
// [padded_wrappers]

// [padded_numel]
int64_t padded_numel(int64_t numel, int world_size) {
  // TODO(lesson7, step 2): refuse world_size <= 0 ("world_size must be > 0"); numel rounded up to a multiple of
  // world_size (about 2 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 2): padded_numel() is not implemented yet");
}
// [padded_numel]

// [flatten_and_shard]
FlatParam flatten_and_shard(const std::vector<at::Tensor>& params, int rank, int world_size) {
  // TODO(lesson7, step 2): refuse bad input in fsdp.h's words; note shapes and offsets, lay the parameters end to
  // end with zero padding, keep slice `rank` as a clone that requires grad (about 20 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 2): flatten_and_shard() is not implemented yet");
}
// [flatten_and_shard]

// [unflatten]
std::vector<at::Tensor> unflatten(const FlatParam& flat, const at::Tensor& full) {
  // TODO(lesson7, step 2): refuse a buffer that is not padded_numel long ("elements, but"); one view per
  // parameter: narrow at its offset, view in its shape, no copies (about 10 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 2): unflatten() is not implemented yet");
}
// [unflatten]

// [gather_full]
at::Tensor gather_full(dist::Comm& comm, const FlatParam& flat) {
  // TODO(lesson7, step 2): refuse another rank's or world size's FlatParam ("was made for rank"); all_gather_into a
  // fresh buffer of padded_numel floats from the detached shard (about 6 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 2): gather_full() is not implemented yet");
}
// [gather_full]

// [sharded_forward]
at::Tensor sharded_forward(dist::Comm& comm, FlatParam& flat, LayerFn fn, const at::Tensor& x) {
  // TODO(lesson7, step 3): an autograd function: forward calls agree_on_layer (given), gathers, runs fn; backward
  // agrees, gathers, recomputes, reduce-scatters grad / N into the shard's gradient (about 50 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 3): sharded_forward() is not implemented yet");
}
// [sharded_forward]

// What ShardedStack's forward and its layers' backward share (given: the fields your step 4 code uses).
struct ShardedStack::State {
  State(dist::Comm& comm_, std::vector<FlatParam>& flats_, std::vector<LayerFn> fns_, bool prefetch_,
        const MixedPrecision& mp_ = MixedPrecision(), bool mixed_ = false)
      : comm(comm_),
        flats(flats_),
        fns(std::move(fns_)),
        prefetch(prefetch_),
        mp(mp_),
        mixed(mixed_),
        pending(flats_.size()),
        awaiting_backward(flats_.size()) {}
  dist::Comm& comm;
  std::vector<FlatParam>& flats;
  std::vector<LayerFn> fns;
  bool prefetch;
  MixedPrecision mp;  ///< step 5: the dtypes of the gathers and the reduce-scatters (float32 unless `mixed`)
  bool mixed;         ///< step 5: made with a MixedPrecision (its gathers go through start_gather_as)
  std::vector<std::unique_ptr<PendingGather>> pending;              ///< per layer: its gather in flight, if any
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> gathered;  ///< buffers gathered, held weakly
  int max_alive = 0;
  /// Per layer: the autograd node of its last forward while that forward's backward has not run (held weakly:
  /// expired once the graph is gone, as after a backward or when the output is dropped).
  std::vector<std::weak_ptr<torch::autograd::Node>> awaiting_backward;
  /// Layers backpropagated on this rank since the last finish(): forward() refuses to start while it is not 0.
  int64_t backwards_since_finish = 0;
};

ShardedStack::ShardedStack(dist::Comm& comm, std::vector<FlatParam>& flats, std::vector<LayerFn> fns, bool prefetch)
    : state_(std::make_unique<State>(comm, flats, std::move(fns), prefetch)) {}
ShardedStack::ShardedStack(dist::Comm& comm, std::vector<FlatParam>& flats, std::vector<LayerFn> fns, bool prefetch,
                           const MixedPrecision& mp)
    : state_(std::make_unique<State>(comm, flats, std::move(fns), prefetch, mp, true)) {}
ShardedStack::~ShardedStack() = default;
int ShardedStack::max_alive() const { return state_->max_alive; }

// [start_gather]
at::Tensor PendingGather::wait() {
  // TODO(lesson7, step 4): wait on every work, then return the buffer (about 3 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 4): PendingGather::wait() is not implemented yet");
}

PendingGather start_gather(dist::Comm& comm, const FlatParam& flat, int tag) {
  // TODO(lesson7, step 4): refuse another rank's FlatParam; copy your shard into your slice of a fresh buffer and
  // post (not wait) a send to and a receive from each other rank, with `tag` (about 15 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 4): start_gather() is not implemented yet");
}
// [start_gather]

// [sharded_stack]
at::Tensor ShardedStack::forward(const at::Tensor& x) {
  // TODO(lesson7, step 4): agree on the forward's record, then one autograd function per layer that takes its
  // gather and prefetches the next; agree before each backward (about 200 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 4): ShardedStack::forward() is not implemented yet");
}

void ShardedStack::finish() {
  // TODO(lesson7, step 4): reset state_->backwards_since_finish, then agree on a record that says "finish()"
  // (about 3 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 4): ShardedStack::finish() is not implemented yet");
}
// [sharded_stack]

// [mixed_precision]
void check_mixed_precision(const MixedPrecision& mp) {
  // TODO(lesson7, step 5): refuse the dtypes fsdp.h names, in its words (about 5 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 5): check_mixed_precision() is not implemented yet");
}

at::Tensor gather_full_as(dist::Comm& comm, const FlatParam& flat, at::ScalarType dtype) {
  // TODO(lesson7, step 5): gather_full's check, then all_gather_into a fresh buffer of `dtype` from the shard cast
  // to dtype first, so that the ring carries dtype's bytes (about 6 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 5): gather_full_as() is not implemented yet");
}

at::Tensor sharded_forward_mixed(dist::Comm& comm, FlatParam& flat, LayerFn fn, const at::Tensor& x,
                                 const MixedPrecision& mp) {
  // TODO(lesson7, step 5): step 3's autograd function with mp's casts: agree and gather in param_dtype, compute
  // in it, reduce-scatter in reduce_dtype, hand back float32 (about 55 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 5): sharded_forward_mixed() is not implemented yet");
}
// [mixed_precision]

// [start_gather_as]
PendingGather start_gather_as(dist::Comm& comm, const FlatParam& flat, int tag, at::ScalarType dtype) {
  // TODO(lesson7, step 5): start_gather into a buffer of `dtype`, then put mixed precision into your step 4
  // stack as the page's hints say, most of it there (about 25 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 5): start_gather_as() is not implemented yet");
}
// [start_gather_as]

// [sharded_unscale]
bool sharded_unscale_and_check(dist::Comm& comm, const std::vector<FlatParam>& flats, double scale) {
  // TODO(lesson7, step 5): unscale each shard's gradient once, flag any inf or NaN; all-reduce {flag, scale, -scale}
  // with kMax on every rank, then throw alike for a bad or a differing scale (about 25 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 5): sharded_unscale_and_check() is not implemented yet");
}
// [sharded_unscale]

// [checkpoint_save]
void save_sharded(dist::Comm& comm, const std::string& dir, const ShardedCheckpoint& ckpt) {
  // TODO(lesson7, step 6): agree on every rank's layers, state, step and findings (fsdp.h), write dir/rank_R.pt, then
  // agree that every write worked; full_state reuses the first agreement (about 95 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 6): save_sharded() is not implemented yet");
}
// [checkpoint_save]

// [checkpoint_load]
ShardedCheckpoint load_sharded(dist::Comm& comm, const std::string& dir,
                               const std::vector<std::vector<std::vector<int64_t>>>& shapes) {
  // TODO(lesson7, step 6): check every file on every rank in fsdp.h's order, then copy each new shard's range
  // from the old shards that overlap it, state too (about 130 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 6): load_sharded() is not implemented yet");
}
// [checkpoint_load]

// [full_state]
std::vector<at::Tensor> full_state(dist::Comm& comm, const std::vector<FlatParam>& flats) {
  // TODO(lesson7, step 6): save_sharded's first agreement (no state, no step), then gather_full every layer on
  // every rank; rank 0 keeps copies of the views (about 10 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 6): full_state() is not implemented yet");
}
// [full_state]

// [full_optim_state]
std::vector<std::vector<at::Tensor>> full_optim_state(dist::Comm& comm, const std::vector<FlatParam>& flats,
                                                      const std::vector<std::vector<at::Tensor>>& optim_state) {
  // TODO(lesson7, step 6): full_state's agreement with the state lists, then gather
  // each state tensor like the shard; rank 0 unflattens it (about 20 lines).
  TORCH_CHECK(false, "TODO(lesson7, step 6): full_optim_state() is not implemented yet");
}
// [full_optim_state]

}  // namespace fsdp
