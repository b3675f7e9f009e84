// Lesson 7 — Fully sharded data parallel: the API you implement. Steps, background and hints: lesson7_fsdp/README.md.
//
// Every rank keeps 1/N of each layer's parameters (a slice of one flat, padded buffer), gathers a layer's full
// parameters just before the layer runs and frees them after, and turns the layer's gradient into its own
// slice of the average at once (a reduce-scatter). The collectives are rings of Gloo's point-to-point
// send/recv through lesson 5's counting communicator (dist::Comm), so every byte is counted.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "lesson5_distributed/comm.h"

namespace fsdp {

// [api_ring]
/// Step 1: the elements of one rank's shard when `numel` elements are split over `world_size` ranks: numel / N
/// rounded UP (the last shards end in padding). Throws "world_size must be > 0" and "numel must be >= 0".
int64_t shard_numel(int64_t numel, int world_size);

/// Step 1: ring reduce-scatter. `full` holds N equal chunks (N = comm.world_size(), full.numel() ==
/// N * shard.numel()); afterwards `shard` holds the SUM over every rank of chunk comm.rank(). In N - 1 steps each
/// rank sends one chunk to rank + 1 (mod N) and receives one from rank - 1, adding its own chunk to what it
/// received: (N - 1) / N of full's bytes sent per rank, half of a ring all-reduce. `full` is not changed.
/// Both tensors contiguous, defined, of one dtype, on the communicator's device. Throws, on the rank that
/// sees it and before any traffic: "is undefined", "must be contiguous", "must have the same dtype",
/// "elements, but" (full is not N x shard: "full has 10 elements, but 2 ranks x 4 need 8"). The checks set it
/// beside the process group's own, lesson 5's dist::Comm::group_reduce_scatter(shard, full) (LibTorch 2.x's
/// Gloo: an all-reduce inside; 1.13's: "does not support"), which refuses a full tensor that is not N x shard
/// with "input must have N x output.numel() elements".
void reduce_scatter_into(dist::Comm& comm, const at::Tensor& full, const at::Tensor& shard);

/// Step 1: ring all-gather, the inverse: afterwards chunk r of `full` is rank r's `shard` (on every rank). In
/// N - 1 steps each rank passes the chunk it got last to rank + 1: (N - 1) / N of full's bytes sent per rank.
/// The same rules and messages as reduce_scatter_into.
void all_gather_into(dist::Comm& comm, const at::Tensor& shard, const at::Tensor& full);

/// Step 1: reduce-scatter of a 1-D tensor of any size: padded with zeros to N * shard_numel(numel, N), then
/// reduce_scatter_into. Returns this rank's shard (shard_numel elements; padding sums to 0).
at::Tensor reduce_scatter(dist::Comm& comm, const at::Tensor& tensor);

/// Step 1: all_gather_into of every rank's `shard` (shard_numel(numel, N) elements each), the padding dropped:
/// returns the first `numel` elements. Throws "elements, but" when shard is not shard_numel(numel, N) long.
at::Tensor all_gather(dist::Comm& comm, const at::Tensor& shard, int64_t numel);
// [api_ring]

// [api_flat]
/// Step 2: FSDP's FlatParameter: one layer's parameters laid end to end in one flat buffer, padded with zeros
/// to a multiple of N, of which this rank keeps only slice `rank` — its only persistent storage of them.
struct FlatParam {
  std::vector<std::vector<int64_t>> shapes;  ///< each parameter's shape, in order
  std::vector<int64_t> offsets;              ///< where each parameter starts in the flat buffer
  int64_t numel = 0;                         ///< the parameters' elements together
  int64_t padded_numel = 0;                  ///< numel rounded up to a multiple of world_size
  int rank = 0;
  int world_size = 1;
  /// Elements [rank * S, (rank + 1) * S) of the padded flat buffer, S = padded_numel / world_size: float32,
  /// its own storage of exactly S elements (not a view of a bigger buffer), a leaf that requires grad (the
  /// optimizer steps it and nothing else).
  at::Tensor shard;
};

/// Step 2: numel rounded up to a multiple of world_size (0 stays 0). Throws "world_size must be > 0".
int64_t padded_numel(int64_t numel, int world_size);

/// Step 2: flattens `params` (float32, as many as the layer has, any shapes) into a zero-padded flat buffer of
/// padded_numel(sum of numel, world_size) elements and keeps slice `rank` as `shard` (a copy: the caller's
/// tensors may be freed). Throws "no parameters" for an empty list, "must be float32" for another dtype or an
/// undefined tensor, and "outside 0 .." for a rank that is not in 0 .. world_size - 1.
FlatParam flatten_and_shard(const std::vector<at::Tensor>& params, int rank, int world_size);

/// Step 2: the parameters again, as VIEWS into `full` (a gathered flat buffer of flat.padded_numel elements), in
/// flat.shapes: no copy, so what writes one writes the other, and the views keep `full`'s storage alive.
/// Throws "elements, but" when full is not padded_numel long.
std::vector<at::Tensor> unflatten(const FlatParam& flat, const at::Tensor& full);

/// Step 2: a new buffer of flat.padded_numel elements holding every rank's shard (all_gather_into). Throws "was made
/// for rank" when `flat` belongs to another rank or world size than `comm`.
at::Tensor gather_full(dist::Comm& comm, const FlatParam& flat);
// [api_flat]

// [api_layer]
/// What one layer computes from its input and its parameters (the views unflatten makes, in order).
using LayerFn = std::function<at::Tensor(const at::Tensor& x, const std::vector<at::Tensor>& params)>;

/// Given (lesson7_fsdp/fsdp_given.cc): the ranks agree before each gather of a layer (step 3's sharded_forward, forward
/// and backward, and step 5's sharded_forward_mixed call it), so that ranks that are not at the same layer fail at
/// once, by name, on EVERY rank, instead of waiting in a ring for a peer that is elsewhere until the timeout (or, when
/// the rings' messages differ in size, Gloo aborting the process). Every rank all-gathers (comm.all_gather) a record of
/// 8 int64: the phase (forward, or backward when `backward`), flat.rank and flat.world_size, flat.numel, a fingerprint
/// of flat.shapes, `param_dtype` (the gather's dtype) and `reduce_dtype` (the reduce-scatter's; step 3 passes float32
/// for both), and what this rank found wrong with its own arguments, checked in this order and put into the record
/// instead of thrown alone: a FlatParam made for another rank or world size ("the FlatParam was made for rank R of N,
/// but this is rank r of n"), in the forward a shard that is not a leaf that requires grad ("the layer's shard must be
/// a leaf that requires grad"), a param_dtype other than float32, bfloat16 and float16 ("param_dtype must be float32,
/// bfloat16 or float16"), a reduce_dtype other than float32 and the param_dtype ("reduce_dtype must be float32 or the
/// param_dtype"). Every rank then throws "on rank r: " and the first such rank's finding; or, when the records differ
/// in anything but flat.rank, "the ranks disagree on the layer they are about to gather (" and each rank's call in rank
/// order, joined by "; ", each starting "rank R: the forward of a layer of E elements" or "rank R: the backward of a
/// layer of E elements" (E: flat.numel; what follows "elements", such as the dtypes, is free), then ")". A rank whose
/// loss skips a layer that another rank's loss uses is in another layer's backward, or its next forward, when its peers
/// start that layer's backward. Layers of the same shapes look alike here (ShardedStack, step 4, knows each layer's
/// index); a rank that skips a layer's backward and makes no further call of these is left to the timeout.
void agree_on_layer(dist::Comm& comm, const FlatParam& flat, bool backward, at::ScalarType param_dtype = at::kFloat,
                    at::ScalarType reduce_dtype = at::kFloat);

/// Step 3: runs one layer on sharded parameters, as FSDP does. Forward: agree_on_layer, then gathers the full
/// flat buffer (gather_full), computes fn(x, unflatten(...)), frees the full buffer before returning (nothing of
/// it is kept). Backward (autograd calls it when the loss is backpropagated): agree_on_layer (backward), gathers
/// again, recomputes the layer with autograd to get the gradients of x and of the flat buffer, divides the flat
/// gradient by N and reduce-scatters it into flat.shard's grad (accumulated like any leaf's .grad), and frees
/// the buffer again. Per call and per backward: two all-gathers and one reduce-scatter of padded_numel floats,
/// and the two agreements (all-gathers of 64 bytes per rank), nothing else. Where fn does not use the
/// parameters on this rank, their gradient here is zeros (autograd::grad with allow_unused), and this rank joins
/// the reduce-scatter like the others instead of throwing alone. `fn` is taken by value and kept (a copy the
/// autograd node owns, e.g. in ctx->saved_data as an IValue::make_capsule of a torch::CustomClassHolder that
/// holds it) until the graph is freed, so a temporary is fine; `comm` and `flat` must outlive the backward.
/// Throws, on every rank, agree_on_layer's errors ("requires grad" when flat.shard is not a leaf that requires
/// grad on some rank).
at::Tensor sharded_forward(dist::Comm& comm, FlatParam& flat, LayerFn fn, const at::Tensor& x);
// [api_layer]

struct MixedPrecision;  // step 5 (below)

// [api_prefetch]
/// Step 4: an all-gather in flight. wait() waits for every send and receive and returns the gathered buffer
/// (padded_numel elements, every rank's shard in rank order: float32, or start_gather_as's dtype).
struct PendingGather {
  at::Tensor full;
  std::vector<dist::AsyncWork> works;
  at::Tensor wait();
};

/// Step 4: starts the all-gather of `flat` and returns at once: each rank posts a send of its shard to every
/// other rank and a receive from each, straight into its place in `full`, all with tag `tag`. The same
/// (N - 1) / N x padded bytes per rank as the ring, in one round instead of N - 1, and nothing to wait for until
/// the buffer is needed. Throws "was made for rank" like gather_full.
PendingGather start_gather(dist::Comm& comm, const FlatParam& flat, int tag);

/// Step 4: a stack of sharded layers run in order (layer 0 first), each as sharded_forward runs one, but with
/// the NEXT layer's all-gather in flight while a layer computes: in the forward, layer l + 1's gather starts
/// before layer l runs; in the backward, layer l - 1's starts before layer l recomputes and reduce-scatters. At
/// most two layers' full parameters are alive at once. With prefetch = false each gather starts only when its
/// layer needs it: the same results and the same bytes. `comm`, `flats` and the stack must outlive the
/// backward.
///
/// The ranks agree before they wait for each other: before the forward and before each layer's backward every
/// rank all-gathers a record of 8 int64 (what it is about to do), so that a fault on one rank is an error on
/// EVERY rank, by name, not a gather or a reduce-scatter left waiting until the timeout. forward() checks
/// locally and puts what it finds into its record (every rank then throws "on rank r: ..."): "one LayerFn per
/// FlatParam" (lists of different lengths), "layer L's FlatParam was made for rank" (another rank's or another
/// world size's: its gather would fail on this rank alone), "must be a leaf that requires grad", "is layer K
/// again" (one shard listed twice, next to itself or not: a layer runs once per forward) and "was gathered
/// twice before its backward" (a forward while the previous forward's graph still waits for its backward).
/// Records that differ: "the models differ across ranks" (layer counts, sizes or shapes) and "layer L got no
/// gradient on rank r" (the rank's loss does not depend on layer L: its backward never reaches L, and it is
/// elsewhere, in its finish() or its next forward, when its peers start L's backward). A layer function that does
/// not use its parameters (or its input) on some rank is no fault: that rank's gradient is zeros, and it joins
/// the reduce-scatter like the others.
///
/// One step: forward(), the backward, finish() (as lesson 5's Reducer), then the optimizer's step.
class ShardedStack {
 public:
  ShardedStack(dist::Comm& comm, std::vector<FlatParam>& flats, std::vector<LayerFn> fns, bool prefetch = true);
  /// Step 5: the same stack in mixed precision (MixedPrecision, below), as sharded_forward_mixed runs one layer:
  /// every gather, prefetched or not, in mp.param_dtype (start_gather_as: half the bytes and half the gathered
  /// buffers' bytes for a 16-bit dtype), each layer computed in it from its input cast to it, each gradient
  /// reduce-scattered in mp.reduce_dtype and handed to the optimizer as float32; the shards stay the float32
  /// masters. Layer by layer the same results, bit for bit, as sharded_forward_mixed. The forward's agreement
  /// carries the two dtypes: a precision check_mixed_precision refuses, on any rank, fails EVERY rank with "on
  /// rank r: " and check_mixed_precision's message; ranks whose precisions differ, "the models differ across
  /// ranks". A stack made without one is float32 throughout (step 4).
  ShardedStack(dist::Comm& comm, std::vector<FlatParam>& flats, std::vector<LayerFn> fns, bool prefetch,
               const MixedPrecision& mp);
  ~ShardedStack();
  /// Runs every layer on x; backpropagating from the result fills every flat.shard's grad.
  at::Tensor forward(const at::Tensor& x);
  /// The most gathered buffers that were alive at once when a layer computed (forward or backward), so far.
  int max_alive() const;
  /// After every backward, on every rank: one more agreement (a record that says "finish()"), so that a rank
  /// whose backward never reached the stack meets its peers' record for a layer's backward here, and every rank
  /// throws "layer L got no gradient on rank r (it is in finish() instead ...)" at once, even when that rank
  /// makes no call after it. forward() after a backward without finish() puts "finish() was not called after
  /// the previous backward" into its record (every rank throws it). Ranks at calls that match nothing else
  /// (finish() on one, a forward on another, no backward in between): "the ranks are at different calls".
  void finish();

  struct State;  ///< what the forward and the backward share (defined in fsdp.cc)

 private:
  std::unique_ptr<State> state_;
};
// [api_prefetch]

// [api_mixed]
/// Step 5: FSDP's MixedPrecision. The master copy stays the float32 shard (FlatParam::shard, what the optimizer
/// steps); a layer's parameters are gathered in `param_dtype` (the shard cast first, so the wire carries the
/// 16-bit bytes), the layer computes in it, and its gradient is reduce-scattered in `reduce_dtype`, then cast
/// back to float32 for the optimizer. All float32: exactly step 3.
struct MixedPrecision {
  at::ScalarType param_dtype = at::kFloat;   ///< float32, bfloat16 or float16
  at::ScalarType reduce_dtype = at::kFloat;  ///< float32 or param_dtype
};

/// Step 5: refuses, by name, a param_dtype other than float32, bfloat16 and float16 ("param_dtype must be
/// float32, bfloat16 or float16": float64 and the integer types included) and a reduce_dtype that is neither
/// float32 nor the param_dtype ("reduce_dtype must be float32 or the param_dtype").
void check_mixed_precision(const MixedPrecision& mp);

/// Step 5: gather_full in `dtype`: each rank casts its float32 shard to `dtype` and all-gathers that, so each
/// rank sends (N - 1) x S x (bytes of dtype), half of gather_full's bytes for a 16-bit dtype. Returns a new
/// buffer of flat.padded_numel elements of `dtype`. Throws "was made for rank" like gather_full.
at::Tensor gather_full_as(dist::Comm& comm, const FlatParam& flat, at::ScalarType dtype);

/// Step 5: start_gather in `dtype`, as gather_full_as is gather_full in it: each rank's shard cast to `dtype`
/// (into its own slice of the new buffer) and sent from there, so that each rank sends (N - 1) x S x (bytes of
/// dtype), and the buffer that wait() returns is padded_numel elements of `dtype`. The stack with a
/// MixedPrecision gathers with it. Throws "was made for rank" like start_gather.
PendingGather start_gather_as(dist::Comm& comm, const FlatParam& flat, int tag, at::ScalarType dtype);

/// Step 5: sharded_forward in mixed precision. Forward: agree_on_layer with mp's dtypes (which also refuses, on
/// every rank, what check_mixed_precision refuses), gather in mp.param_dtype (gather_full_as), compute fn(x cast
/// to param_dtype, the views): the result is param_dtype. Backward: agree_on_layer (backward, mp's dtypes),
/// gather again in param_dtype, recompute with autograd (allow_unused: zeros where fn ignores the parameters
/// on this rank), cast the flat gradient to mp.reduce_dtype, divide it by N and reduce-scatter it in
/// reduce_dtype; the shard's gradient is that, cast to float32 (the optimizer sees float32 only); x's gradient
/// comes back in x's dtype. flat.shard stays float32, never rounded. The same rules as sharded_forward
/// ("requires grad"); ranks whose mp differ fail with "the ranks disagree on the layer". `fn` is kept as
/// sharded_forward keeps it (a temporary is fine).
at::Tensor sharded_forward_mixed(dist::Comm& comm, FlatParam& flat, LayerFn fn, const at::Tensor& x,
                                 const MixedPrecision& mp);

/// Step 5: the gradient scaler across shards, as PyTorch's ShardedGradScaler. Each rank multiplies the gradient
/// of each of ITS shards by 1 / scale in place (once) and notes whether any holds an inf or NaN; then the ranks
/// agree with one all-reduce MAX of three float64 (24 bytes): that flag, the scale and minus the scale, so that
/// the result is the same on EVERY rank: true when any rank's shard saw an inf or NaN. The caller then skips the
/// step and backs the scale off on every rank, or steps on every rank. Shards without a gradient are skipped (the
/// rank still joins the all-reduce). A scale that is not finite and > 0 on any rank: EVERY rank throws "on rank
/// r: scale must be finite and > 0" after the all-reduce (that rank unscales nothing, puts 2 + r in its flag and
/// -inf in the two scale slots: the MAX carries it to every rank, and no rank is left waiting for the one that
/// would have thrown alone). Valid scales that differ across ranks (two scalers out of step: each rank's shards
/// would be unscaled by another factor, silently): EVERY rank throws "the ranks passed different scales (from
/// LOW to HIGH)".
bool sharded_unscale_and_check(dist::Comm& comm, const std::vector<FlatParam>& flats, double scale);
// [api_mixed]

// [api_checkpoint]
/// Step 6: one rank's part of a sharded checkpoint (FSDP's SHARDED_STATE_DICT): its FlatParams, the optimizer's
/// state of each shard and the optimizer's step count.
struct ShardedCheckpoint {
  std::vector<FlatParam> flats;  ///< this rank's shards, one FlatParam per layer
  /// Per FlatParam, the optimizer's state of its shard: float32 tensors of the shard's S elements each, in an
  /// order the caller fixes (Adam: exp_avg, exp_avg_sq); every FlatParam has the same number of them.
  std::vector<std::vector<at::Tensor>> optim_state;
  int64_t step = 0;  ///< the optimizer's step count
};

/// Step 6: sharded save. Each rank writes ONE file, `dir`/rank_R.pt, R the rank (torch::save of a list of tensors): a
/// header (format, world size N, rank, layers, step, state tensors per layer), then per layer its parameters'
/// shapes (the model's fingerprint), its unpadded numel, its shard and its state shards. N ranks write N files at
/// once, no shard travels. Creates `dir` if needed. Before writing, the ranks agree as full_state does (one all-gather
/// of its record, with the step in it): a fault on any rank fails EVERY rank before any file is written, as
/// "save_sharded: on rank r: " and the first fault: "was made for rank" when a FlatParam belongs to another rank or
/// world size than `comm`, "one state list per FlatParam", "state tensors, but" (a layer with another number of state
/// tensors than layer 0) and "elements, but" (a state tensor that is not S elements long); ranks whose layers, state
/// counts or steps differ: "the ranks disagree on the checkpoint they save". After writing, the ranks agree again (one
/// all-gather of a flag): a write that failed on rank r fails EVERY rank with "on rank r: could not write" and the
/// file's path (so that no rank goes on believing the checkpoint is whole).
void save_sharded(dist::Comm& comm, const std::string& dir, const ShardedCheckpoint& ckpt);

/// Step 6: resharding load into comm's world size N', which may differ from the N that saved. Each rank reads
/// rank 0's header, checks the model's fingerprint against `shapes` (per layer, its parameters' shapes), then
/// checks EVERY old rank's file against rank 0's before it uses any (the same world size, layers, step, state
/// count, shapes and elements per layer, and shards of the old length), and for each layer builds its new shard:
/// elements [r * S', (r + 1) * S') of the new padded buffer, S' = padded_numel(numel, N') / N', copied from the
/// unpadded part of every old rank's shard that overlaps it (the old padding is dropped, the new one is zeros);
/// the state shards the same way. No traffic: every rank checks the same files in the same order, so a bad
/// checkpoint fails on EVERY rank, by name, at once. Throws "missing rank file" when a file of the N old ranks is
/// absent, "was saved for another model" when the shapes differ, "is not a sharded checkpoint" for a file of
/// another format, "is not rank" for a file whose header disagrees with its name, "does not belong to the
/// checkpoint" for a file whose header or shapes disagree with rank 0's (a leftover of another run: another step,
/// world size, model), and "elements, but" for a shard of another length than the old N makes.
/// The shards it returns are leaves that require grad, as flatten_and_shard makes them.
ShardedCheckpoint load_sharded(dist::Comm& comm, const std::string& dir,
                               const std::vector<std::vector<std::vector<int64_t>>>& shapes);

/// Step 6: the full state on rank 0 (FSDP's FULL_STATE_DICT with rank0_only): every layer gathered
/// (gather_full, so every rank takes part), unflattened and copied; rank 0 returns every parameter in order,
/// the other ranks an empty list. First the ranks agree (one all-gather of a record of 8 int64 per rank: the
/// layers, their elements, a fingerprint of their shapes and world size, what this rank found wrong), so that a
/// fault on any rank fails EVERY rank before any gather: "on rank r: FlatParam l was made for rank" (another
/// rank's or world size's); ranks whose layers differ in count, size or shape: "the ranks disagree on the
/// layers they gather" (gathers of different sizes would make Gloo abort the process).
std::vector<at::Tensor> full_state(dist::Comm& comm, const std::vector<FlatParam>& flats);

/// Step 6: the optimizer's state in full on rank 0, as FSDP's optim_state_dict gives it with FULL_STATE_DICT and
/// rank0_only: `optim_state` is this rank's state per FlatParam, as in ShardedCheckpoint (K float32 tensors of
/// the shard's S elements each, every FlatParam the same K; Adam: exp_avg, exp_avg_sq). Each state tensor is
/// gathered as gather_full gathers the shard (all_gather_into, every rank takes part: per layer K gathers of S
/// floats), its padding dropped and unflattened in the parameters' shapes. Rank 0 returns, per parameter in
/// full_state's order, its K tensors in the parameter's shape (copies: what Adam keeps for an unsharded
/// parameter); the other ranks an empty list. First the ranks agree (full_state's record of 8 int64, with the
/// state tensors per layer), so that a bad argument on any rank fails EVERY rank, as "on rank r: ...": "was made
/// for rank", "one state list per FlatParam", "state tensors, but", "elements, but"; ranks whose layers differ
/// (count, sizes, shapes) or whose state counts differ: "the ranks disagree on the state they gather".
std::vector<std::vector<at::Tensor>> full_optim_state(dist::Comm& comm, const std::vector<FlatParam>& flats,
                                                      const std::vector<std::vector<at::Tensor>>& optim_state);
// [api_checkpoint]

}  // namespace fsdp
