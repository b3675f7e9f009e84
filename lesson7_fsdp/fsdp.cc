// Lesson 7 — your code. Replace each TODO with an implementation; the checks in fsdp_step*_test.cc tell you when
// it is right:  bazel test //lesson7_fsdp:all
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
  // TODO(lesson7, step 1): refuse world_size <= 0 ("world_size must be > 0") and numel < 0 ("numel must be
  // >= 0"); return numel / world_size rounded up.
  TORCH_CHECK(false, "TODO(lesson7, step 1): shard_numel() is not implemented yet");
}
// [shard_numel]

// [reduce_scatter_into]
void reduce_scatter_into(dist::Comm& comm, const at::Tensor& full, const at::Tensor& shard) {
  // TODO(lesson7, step 1): check the arguments first, on every rank, before any traffic ("is undefined", "must be
  // contiguous", "must have the same dtype", "full has 10 elements, but 2 ranks x 4 need 8"). Then the ring: a
  // partial sum travels right (to rank + 1 mod N) N - 1 times; each rank adds its own chunk to what arrives from
  // the left and passes it on, so that the last arrival is the full sum of chunk comm.rank(). Post the receive
  // and the send together (comm.recv_async, comm.send_async), then wait on both: a blocking send to a rank that
  // is itself sending never returns.
  TORCH_CHECK(false, "TODO(lesson7, step 1): reduce_scatter_into() is not implemented yet");
}
// [reduce_scatter_into]

// [all_gather_into]
void all_gather_into(dist::Comm& comm, const at::Tensor& shard, const at::Tensor& full) {
  // TODO(lesson7, step 1): the same checks; copy shard into chunk comm.rank() of full, then N - 1 times send
  // the chunk you got last to the right and receive the next one from the left straight into its place in full.
  TORCH_CHECK(false, "TODO(lesson7, step 1): all_gather_into() is not implemented yet");
}
// [all_gather_into]

// [padded_wrappers]
at::Tensor reduce_scatter(dist::Comm& comm, const at::Tensor& tensor) {
  // TODO(lesson7, step 1): pad tensor with zeros to N x shard_numel(numel, N), reduce_scatter_into a new shard.
  TORCH_CHECK(false, "TODO(lesson7, step 1): reduce_scatter() is not implemented yet");
}

at::Tensor all_gather(dist::Comm& comm, const at::Tensor& shard, int64_t numel) {
  // TODO(lesson7, step 1): refuse a shard that is not shard_numel(numel, N) long ("elements, but"),
  // all_gather_into a padded buffer, return its first numel elements.
  TORCH_CHECK(false, "TODO(lesson7, step 1): all_gather() is not implemented yet");
}
// [padded_wrappers]

// [padded_numel]
int64_t padded_numel(int64_t numel, int world_size) {
  // TODO(lesson7, step 2): refuse world_size <= 0 ("world_size must be > 0"); numel rounded up to a multiple of
  // world_size (shard_numel does half of it).
  TORCH_CHECK(false, "TODO(lesson7, step 2): padded_numel() is not implemented yet");
}
// [padded_numel]

// [flatten_and_shard]
FlatParam flatten_and_shard(const std::vector<at::Tensor>& params, int rank, int world_size) {
  // TODO(lesson7, step 2): refuse an empty list ("no parameters"), a parameter that is not float32 ("must be
  // float32") and a rank outside 0 .. world_size - 1 ("outside 0 .."). Record each parameter's shape and offset,
  // lay the parameters end to end with zeros up to padded_numel, and keep slice `rank` as the shard: a copy with
  // its own storage (clone), a leaf that requires grad.
  TORCH_CHECK(false, "TODO(lesson7, step 2): flatten_and_shard() is not implemented yet");
}
// [flatten_and_shard]

// [unflatten]
std::vector<at::Tensor> unflatten(const FlatParam& flat, const at::Tensor& full) {
  // TODO(lesson7, step 2): refuse a buffer that is not padded_numel long ("elements, but"); return one view per
  // parameter: narrow at its offset, view in its shape. No copies.
  TORCH_CHECK(false, "TODO(lesson7, step 2): unflatten() is not implemented yet");
}
// [unflatten]

// [gather_full]
at::Tensor gather_full(dist::Comm& comm, const FlatParam& flat) {
  // TODO(lesson7, step 2): refuse a FlatParam made for another rank or world size ("was made for rank"); then a
  // fresh buffer of padded_numel floats, filled by all_gather_into from the shard (detached: no autograd here).
  TORCH_CHECK(false, "TODO(lesson7, step 2): gather_full() is not implemented yet");
}
// [gather_full]

// [agree_on_layer]
void agree_on_layer(dist::Comm& comm, const FlatParam& flat, bool backward, at::ScalarType param_dtype,
                    at::ScalarType reduce_dtype) {
  // TODO(lesson7, step 3): find what is wrong with this rank's arguments, in this order, as a number (0: nothing):
  // a FlatParam of another rank or world size than comm's ("was made for rank"), in the forward a shard that is
  // not a leaf that requires grad ("requires grad"), a param_dtype other than float32, bfloat16 and float16
  // ("param_dtype must be float32, bfloat16 or float16"), a reduce_dtype other than float32 and the param_dtype
  // ("reduce_dtype must be float32 or the param_dtype"). Do NOT throw yet: your peers would wait for you. Put
  // it in a record of 8 int64 with the phase, flat.rank, flat.world_size, flat.numel, a fingerprint of
  // flat.shapes (a hash of every dimension), and the two dtypes (static_cast<int64_t>), and all-gather the
  // records (comm.all_gather of an at::kLong tensor). Then on every rank alike: throw "on rank r: " and the
  // message of the first record that names an error; throw "the ranks disagree on the layer they are about to
  // gather" (with each rank's call) when the records differ in anything but flat.rank.
  TORCH_CHECK(false, "TODO(lesson7, step 3): agree_on_layer() is not implemented yet");
}
// [agree_on_layer]

// [sharded_forward]
at::Tensor sharded_forward(dist::Comm& comm, FlatParam& flat, LayerFn fn, const at::Tensor& x) {
  // TODO(lesson7, step 3): write a custom autograd function (struct L : torch::autograd::Function<L>, static
  // forward and backward; call it with L::apply(x, flat.shard, &comm, &flat, &fn)). Its forward saves x, agrees
  // (agree_on_layer, forward: that also refuses a shard that does not require grad, on every rank), gathers the
  // full buffer, returns fn(x, unflatten(...)) and lets the buffer go. Its backward agrees (agree_on_layer,
  // backward: a rank whose loss skips the layer is elsewhere, and every rank learns it), gathers again,
  // recomputes fn with autograd on (at::AutoGradMode) from a leaf copy of the buffer, takes
  // torch::autograd::grad of it (and of x where ctx->needs_input_grad(0); with allow_unused, and zeros for the
  // buffer's gradient where fn did not use the parameters on this rank), divides the buffer's gradient by N,
  // reduce-scatters it into a new shard-sized tensor and returns {grad of x, that shard gradient, and an
  // undefined tensor for each of the other inputs}.
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
  // TODO(lesson7, step 4): wait on every work (sends and receives), then return the buffer.
  TORCH_CHECK(false, "TODO(lesson7, step 4): PendingGather::wait() is not implemented yet");
}

PendingGather start_gather(dist::Comm& comm, const FlatParam& flat, int tag) {
  // TODO(lesson7, step 4): refuse a FlatParam of another rank or world size ("was made for rank"). A fresh buffer
  // of padded_numel floats; copy the shard into slice comm.rank(); then for k = 1 .. N - 1 post (do not wait) a
  // receive from rank r - k into its slice and a send of your slice to rank r + k, all with `tag`; keep the
  // works in the PendingGather.
  TORCH_CHECK(false, "TODO(lesson7, step 4): start_gather() is not implemented yet");
}
// [start_gather]

// [sharded_stack]
at::Tensor ShardedStack::forward(const at::Tensor& x) {
  // TODO(lesson7, step 4): refuse lists of different lengths ("one LayerFn per FlatParam"). Then, like
  // sharded_forward, a custom autograd function per layer (with state_.get() and the
  // layer's index among its arguments), applied to the layers in order. In its forward: take the layer's buffer
  // (state_->pending[layer] if its gather is in flight, else start_gather now and wait), then, when prefetching,
  // start layer + 1's gather before computing. In its backward: the same with layer - 1. Give each layer's gather
  // its own tag (apart from the rings' 0 .. N - 2). Note every buffer in state_->gathered (weakly) and, each time
  // a layer computes, set state_->max_alive to the most of them still alive.
  // The agreements (fsdp.h): a record of 8 int64 all-gathered (comm.all_gather) before the forward's first gather
  // (layer count, LayerFn count, elements, a fingerprint of the shapes, and what this rank found wrong: lists of
  // different lengths, a shard that is not a leaf requiring grad, a shard listed twice (is_same), a layer whose
  // node in state_->awaiting_backward has not expired, a backward since the last finish():
  // state_->backwards_since_finish > 0) and before each layer's backward takes its buffer (the layer). Throw the
  // same error on every rank when any record names an error or the records differ. Note each layer's node (the
  // output's grad_fn()) in state_->awaiting_backward; reset it in the layer's backward and count the backward in
  // state_->backwards_since_finish. Recompute with allow_unused, as in step 3.
  TORCH_CHECK(false, "TODO(lesson7, step 4): ShardedStack::forward() is not implemented yet");
}

void ShardedStack::finish() {
  // TODO(lesson7, step 4): set state_->backwards_since_finish to 0, then one more agreement: a record that says
  // "finish()". A rank whose backward never reached the stack is here while its peers agree before a layer's
  // backward: the records differ, and every rank throws "layer L got no gradient on rank r (it is in finish()
  // instead ...)". Records that match nothing else: "the ranks are at different calls".
  TORCH_CHECK(false, "TODO(lesson7, step 4): ShardedStack::finish() is not implemented yet");
}
// [sharded_stack]

// [mixed_precision]
void check_mixed_precision(const MixedPrecision& mp) {
  // TODO(lesson7, step 5): refuse a param_dtype other than float32, bfloat16 and float16 ("param_dtype must be
  // float32, bfloat16 or float16") and a reduce_dtype that is neither float32 nor the param_dtype ("reduce_dtype
  // must be float32 or the param_dtype").
  TORCH_CHECK(false, "TODO(lesson7, step 5): check_mixed_precision() is not implemented yet");
}

at::Tensor gather_full_as(dist::Comm& comm, const FlatParam& flat, at::ScalarType dtype) {
  // TODO(lesson7, step 5): gather_full's check ("was made for rank"); then a fresh buffer of padded_numel elements
  // of `dtype`, filled by all_gather_into from the shard cast to dtype FIRST (so the ring carries dtype's bytes).
  TORCH_CHECK(false, "TODO(lesson7, step 5): gather_full_as() is not implemented yet");
}

at::Tensor sharded_forward_mixed(dist::Comm& comm, FlatParam& flat, LayerFn fn, const at::Tensor& x,
                                 const MixedPrecision& mp) {
  // TODO(lesson7, step 5): step 3's autograd function with three casts (pass mp by value to apply; keep its
  // dtypes in ctx->saved_data as integers). Its forward agrees first, with mp's dtypes (agree_on_layer(..., false,
  // mp.param_dtype, mp.reduce_dtype): it refuses bad dtypes and a shard that does not require grad on every rank,
  // and ranks whose dtypes differ), gathers with gather_full_as(..., mp.param_dtype) and computes on
  // x.to(param_dtype); the backward agrees (backward, the same dtypes), gathers the same way, recomputes from x
  // cast to param_dtype (allow_unused, zeros where the buffer's gradient is undefined, as in step 3), casts the
  // buffer's gradient to mp.reduce_dtype, divides it by N, reduce-scatters it in reduce_dtype and returns it cast
  // to float32 (and x's gradient, where defined, in x's dtype).
  TORCH_CHECK(false, "TODO(lesson7, step 5): sharded_forward_mixed() is not implemented yet");
}
// [mixed_precision]

// [start_gather_as]
PendingGather start_gather_as(dist::Comm& comm, const FlatParam& flat, int tag, at::ScalarType dtype) {
  // TODO(lesson7, step 5): start_gather with a buffer of padded_numel elements of `dtype`: copying the shard into
  // your slice of it casts it, so the sends carry dtype's bytes ("was made for rank" as in start_gather).
  // Then the stack in mixed precision, in your step 4 code (state_->mixed and state_->mp are given): when
  // state_->mixed, gather with start_gather_as(..., state_->mp.param_dtype); in a layer's forward and in its
  // recomputation run fn on x cast to the param dtype; cast the incoming gradient to y's dtype before
  // torch::autograd::grad; reduce-scatter the buffer's gradient cast to mp.reduce_dtype (divided by N) into a
  // shard-sized tensor of reduce_dtype and return it cast to float32, and x's gradient in x's dtype. Without a
  // MixedPrecision every dtype is float32 and none of these casts copies. In the forward's record put the two
  // dtypes (ranks whose dtypes differ: "the models differ across ranks") and, when state_->mixed and
  // check_mixed_precision refuses state_->mp, an error that every rank throws as "on rank r: " and
  // check_mixed_precision's own message (catch its c10::Error: a rank that threw alone would leave its peers
  // waiting in the agreement).
  TORCH_CHECK(false, "TODO(lesson7, step 5): start_gather_as() is not implemented yet");
}
// [start_gather_as]

// [sharded_unscale]
bool sharded_unscale_and_check(dist::Comm& comm, const std::vector<FlatParam>& flats, double scale) {
  // TODO(lesson7, step 5): refuse a scale that is not finite and > 0 ("scale must be finite and > 0"). Multiply
  // each shard's gradient (where it has one) by 1 / scale in place, once, and set a one-element float32 flag to 1
  // if any holds an inf or NaN (at::isfinite). Then agree: comm.all_reduce(flag, dist::ReduceOp::kMax), so that
  // every rank returns the same answer; return whether the flag is non-zero.
  TORCH_CHECK(false, "TODO(lesson7, step 5): sharded_unscale_and_check() is not implemented yet");
}
// [sharded_unscale]

// [checkpoint_save]
void save_sharded(dist::Comm& comm, const std::string& dir, const ShardedCheckpoint& ckpt) {
  // TODO(lesson7, step 6): check, before writing anything, that every FlatParam was made for comm's rank and world
  // size ("was made for rank"), that there is one state list per FlatParam ("one state list per FlatParam"),
  // that every layer has as many state tensors as layer 0 ("state tensors, but") and that each is S elements
  // long ("elements, but"). Then build one list of tensors: a header (an int64 tensor: a format number of your
  // choice, N, rank, layers, ckpt.step, state tensors per layer), then per layer its shapes (an int64 tensor,
  // e.g. {count, ndim, dims..., ndim, dims...}), its numel, its shard (detached) and its state tensors. Create
  // `dir` (std::filesystem::create_directories) and torch::save the list to `dir`/rank_R.pt (R: the rank).
  TORCH_CHECK(false, "TODO(lesson7, step 6): save_sharded() is not implemented yet");
}
// [checkpoint_save]

// [checkpoint_load]
ShardedCheckpoint load_sharded(dist::Comm& comm, const std::string& dir,
                               const std::vector<std::vector<std::vector<int64_t>>>& shapes) {
  // TODO(lesson7, step 6): on every rank, in the same order (so that every rank fails alike, with no traffic):
  // rank_0.pt must exist ("missing rank file") and be yours ("is not a sharded checkpoint"); its shapes must equal
  // `shapes` ("was saved for another model"); every rank_Q.pt of the old N must exist ("missing rank file").
  // Then per layer: the FlatParam of comm's rank and N' (shapes, offsets, numel, padded_numel), and its shard
  // of S' = padded_numel(numel, N') / N' zeros, into which you copy the unpadded range [r * S', min((r + 1) * S',
  // numel)) from the old shards that overlap it (old rank q holds [q * S, (q + 1) * S)); the state tensors the
  // same way. Read an old file only when it is needed, and check its header ("is not rank"). The shard must
  // end a leaf that requires grad.
  TORCH_CHECK(false, "TODO(lesson7, step 6): load_sharded() is not implemented yet");
}
// [checkpoint_load]

// [full_state]
std::vector<at::Tensor> full_state(dist::Comm& comm, const std::vector<FlatParam>& flats) {
  // TODO(lesson7, step 6): gather_full every layer on EVERY rank (all take part in each ring); rank 0 keeps a
  // copy of each view unflatten gives, in order; the other ranks return an empty list.
  TORCH_CHECK(false, "TODO(lesson7, step 6): full_state() is not implemented yet");
}
// [full_state]

// [full_optim_state]
std::vector<std::vector<at::Tensor>> full_optim_state(dist::Comm& comm, const std::vector<FlatParam>& flats,
                                                      const std::vector<std::vector<at::Tensor>>& optim_state) {
  // TODO(lesson7, step 6): first agree, so that bad arguments on one rank fail every rank: find, without
  // throwing, what is wrong on this rank (a FlatParam of another rank or world size: "was made for rank"; not one
  // state list per FlatParam: "one state list per FlatParam"; a layer with another number of state tensors than
  // layer 0: "state tensors, but"; a state tensor that is not S elements long: "elements, but"), put it with the
  // layer count and the state tensors per layer into a record of 6 int64 and all-gather the records; on every rank
  // throw "on rank r: ..." for the first error, and "the ranks disagree on the state they gather" when the counts
  // differ. Then for every layer and every state tensor, in order, all_gather_into a fresh buffer of padded_numel
  // floats, as gather_full does with the shard (every rank takes part); rank 0 unflattens it and appends a copy
  // of each view to its parameter's list. Rank 0 returns one list per parameter, the others an empty list.
  TORCH_CHECK(false, "TODO(lesson7, step 6): full_optim_state() is not implemented yet");
}
// [full_optim_state]

}  // namespace fsdp
