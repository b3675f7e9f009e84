// Lesson 7 — reference solution.
#include "lesson7_fsdp/fsdp.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>  // Tensor with its methods and operators (+, *, ...)
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/serialize.h>

namespace fsdp {

namespace {

// The checks both rings make before any traffic: every rank that gets bad input fails at once, by name.
void check_ring_args(const dist::Comm& comm, const char* op, const at::Tensor& shard, const at::Tensor& full) {
  TORCH_CHECK(full.defined(), op, ": full is undefined");
  TORCH_CHECK(shard.defined(), op, ": shard is undefined");
  TORCH_CHECK(full.is_contiguous() && shard.is_contiguous(), op, ": full and shard must be contiguous");
  TORCH_CHECK(full.scalar_type() == shard.scalar_type(), op, ": full and shard must have the same dtype, got ",
              full.scalar_type(), " and ", shard.scalar_type());
  const int64_t n = comm.world_size();
  TORCH_CHECK(full.numel() == n * shard.numel(), op, ": full has ", full.numel(), " elements, but ", n, " ranks x ",
              shard.numel(), " need ", n * shard.numel());
}

// Chunk i of N equal chunks of a flat tensor (a contiguous view).
at::Tensor chunk_of(const at::Tensor& flat, int64_t i, int64_t size) { return flat.narrow(0, i * size, size); }

int64_t mod(int64_t a, int64_t n) { return ((a % n) + n) % n; }

int64_t elements_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

}  // namespace

// [shard_numel]
int64_t shard_numel(int64_t numel, int world_size) {
  TORCH_CHECK(world_size > 0, "shard_numel: world_size must be > 0, got ", world_size);
  TORCH_CHECK(numel >= 0, "shard_numel: numel must be >= 0, got ", numel);
  return (numel + world_size - 1) / world_size;
}
// [shard_numel]

// [reduce_scatter_into]
void reduce_scatter_into(dist::Comm& comm, const at::Tensor& full, const at::Tensor& shard) {
  check_ring_args(comm, "reduce_scatter_into", shard, full);
  const int64_t n = comm.world_size(), r = comm.rank(), size = shard.numel();
  const at::Tensor flat = full.view({-1});
  const int right = static_cast<int>(mod(r + 1, n)), left = static_cast<int>(mod(r - 1, n));
  // The partial sum that travels: it starts as our chunk r - 1 and, N - 1 hops later, arrives here as chunk r.
  at::Tensor travelling = chunk_of(flat, mod(r - 1, n), size).clone();
  at::Tensor received = at::empty_like(travelling);
  for (int64_t step = 0; step < n - 1; ++step) {
    dist::AsyncWork recv = comm.recv_async(received, left, static_cast<int>(step));
    dist::AsyncWork send = comm.send_async(travelling, right, static_cast<int>(step));
    send.wait();
    recv.wait();
    // What came from the left is the partial sum of chunk r - 2 - step: add ours and pass it on.
    travelling = chunk_of(flat, mod(r - 2 - step, n), size) + received;
  }
  shard.view({-1}).copy_(travelling);
}
// [reduce_scatter_into]

// [all_gather_into]
void all_gather_into(dist::Comm& comm, const at::Tensor& shard, const at::Tensor& full) {
  check_ring_args(comm, "all_gather_into", shard, full);
  const int64_t n = comm.world_size(), r = comm.rank(), size = shard.numel();
  const at::Tensor flat = full.view({-1});
  const int right = static_cast<int>(mod(r + 1, n)), left = static_cast<int>(mod(r - 1, n));
  chunk_of(flat, r, size).copy_(shard.view({-1}));
  for (int64_t step = 0; step < n - 1; ++step) {
    // Pass on the chunk we got last (our own first); the one from the left lands in its place directly.
    dist::AsyncWork recv = comm.recv_async(chunk_of(flat, mod(r - 1 - step, n), size), left, static_cast<int>(step));
    dist::AsyncWork send = comm.send_async(chunk_of(flat, mod(r - step, n), size), right, static_cast<int>(step));
    send.wait();
    recv.wait();
  }
}
// [all_gather_into]

// [padded_wrappers]
at::Tensor reduce_scatter(dist::Comm& comm, const at::Tensor& tensor) {
  TORCH_CHECK(tensor.defined(), "reduce_scatter: tensor is undefined");
  const int64_t size = shard_numel(tensor.numel(), comm.world_size());
  at::Tensor padded = at::zeros({size * comm.world_size()}, tensor.options());
  padded.narrow(0, 0, tensor.numel()).copy_(tensor.reshape({-1}));
  at::Tensor shard = at::empty({size}, tensor.options());
  reduce_scatter_into(comm, padded, shard);
  return shard;
}

at::Tensor all_gather(dist::Comm& comm, const at::Tensor& shard, int64_t numel) {
  TORCH_CHECK(shard.defined(), "all_gather: shard is undefined");
  const int64_t size = shard_numel(numel, comm.world_size());
  TORCH_CHECK(shard.numel() == size, "all_gather: shard has ", shard.numel(), " elements, but ", numel,
              " elements over ", comm.world_size(), " ranks need ", size, " per rank");
  at::Tensor full = at::empty({size * comm.world_size()}, shard.options());
  all_gather_into(comm, shard, full);
  return full.narrow(0, 0, numel);
}
// [padded_wrappers]

// [padded_numel]
int64_t padded_numel(int64_t numel, int world_size) {
  TORCH_CHECK(world_size > 0, "padded_numel: world_size must be > 0, got ", world_size);
  return shard_numel(numel, world_size) * world_size;
}
// [padded_numel]

// [flatten_and_shard]
FlatParam flatten_and_shard(const std::vector<at::Tensor>& params, int rank, int world_size) {
  TORCH_CHECK(!params.empty(), "flatten_and_shard: no parameters");
  TORCH_CHECK(world_size > 0, "flatten_and_shard: world_size must be > 0, got ", world_size);
  TORCH_CHECK(rank >= 0 && rank < world_size, "flatten_and_shard: rank ", rank, " is outside 0 .. ", world_size - 1);
  FlatParam flat;
  flat.rank = rank;
  flat.world_size = world_size;
  std::vector<at::Tensor> pieces;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    TORCH_CHECK(p.defined() && p.scalar_type() == at::kFloat, "flatten_and_shard: parameter ", i,
                " must be float32, got ", p.defined() ? c10::toString(p.scalar_type()) : "an undefined tensor");
    flat.shapes.push_back(p.sizes().vec());
    flat.offsets.push_back(flat.numel);
    flat.numel += p.numel();
    pieces.push_back(p.detach().reshape({-1}));
  }
  flat.padded_numel = padded_numel(flat.numel, world_size);
  const int64_t size = flat.padded_numel / world_size;
  pieces.push_back(at::zeros({flat.padded_numel - flat.numel}, at::kFloat));  // the padding: zeros
  const at::Tensor whole = at::cat(pieces);
  // clone(): the shard gets storage of its own, S elements; a view would keep the whole buffer alive.
  flat.shard = whole.narrow(0, rank * size, size).clone().requires_grad_(true);
  return flat;
}
// [flatten_and_shard]

// [unflatten]
std::vector<at::Tensor> unflatten(const FlatParam& flat, const at::Tensor& full) {
  TORCH_CHECK(full.defined(), "unflatten: full is undefined");
  TORCH_CHECK(full.numel() == flat.padded_numel, "unflatten: full has ", full.numel(),
              " elements, but the FlatParam needs ", flat.padded_numel, " (padded_numel)");
  const at::Tensor f = full.view({-1});
  std::vector<at::Tensor> views;
  for (size_t i = 0; i < flat.shapes.size(); ++i) {
    views.push_back(f.narrow(0, flat.offsets[i], elements_of(flat.shapes[i])).view(flat.shapes[i]));
  }
  return views;
}
// [unflatten]

// [gather_full]
at::Tensor gather_full(dist::Comm& comm, const FlatParam& flat) {
  TORCH_CHECK(flat.rank == comm.rank() && flat.world_size == comm.world_size(),
              "gather_full: the FlatParam was made for rank ", flat.rank, " of ", flat.world_size,
              ", but this is rank ", comm.rank(), " of ", comm.world_size());
  at::Tensor full = at::empty({flat.padded_numel}, at::kFloat);
  all_gather_into(comm, flat.shard.detach(), full);
  return full;
}
// [gather_full]

// [sharded_forward]
namespace {

// The layer function, owned by the autograd node (ctx->saved_data keeps IValues only: a capsule holds any C++
// object): a temporary the caller passed is gone by the backward, this copy is not.
struct HeldFn : torch::CustomClassHolder {
  explicit HeldFn(LayerFn f) : fn(std::move(f)) {}
  LayerFn fn;
};

c10::IValue hold(LayerFn fn) { return c10::IValue::make_capsule(c10::make_intrusive<HeldFn>(std::move(fn))); }

const LayerFn& held(torch::autograd::AutogradContext* ctx) {
  return static_cast<const HeldFn*>(ctx->saved_data["fn"].toCapsule().get())->fn;
}

// One layer on sharded parameters, as an autograd function: what autograd calls in the backward is ours, so the
// gather before the layer's backward and the reduce-scatter right after it happen exactly there.
struct ShardedLayer : public torch::autograd::Function<ShardedLayer> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& shard,
                            dist::Comm* comm, FlatParam* flat, const LayerFn* fn) {
    // Autograd keeps plain data only: the communicator and the FlatParam go in as addresses (the caller keeps
    // them alive), the layer function as a copy the node owns.
    ctx->saved_data["comm"] = reinterpret_cast<int64_t>(comm);
    ctx->saved_data["flat"] = reinterpret_cast<int64_t>(flat);
    ctx->saved_data["fn"] = hold(*fn);
    ctx->save_for_backward({x});
    agree_on_layer(*comm, *flat, false);  // every rank is about to gather this layer, or every rank learns why not
    const at::Tensor full = gather_full(*comm, *flat);
    return (*fn)(x, unflatten(*flat, full));
    // `full` and its views end here: nothing of the gathered buffer outlives the forward.
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto* comm = reinterpret_cast<dist::Comm*>(ctx->saved_data["comm"].toInt());
    auto* flat = reinterpret_cast<FlatParam*>(ctx->saved_data["flat"].toInt());
    const LayerFn& fn = held(ctx);
    const at::Tensor x = ctx->get_saved_variables()[0];
    const bool needs_x = ctx->needs_input_grad(0);
    // A rank whose loss skips this layer is in another layer's agreement (or its next forward's): named, not a wait.
    agree_on_layer(*comm, *flat, true);
    // Gather again (the forward freed it) and recompute the layer with autograd on, from the saved input.
    const at::Tensor full = gather_full(*comm, *flat).requires_grad_(true);
    const at::Tensor x_in = x.detach().requires_grad_(needs_x);
    torch::autograd::variable_list grads;
    {
      at::AutoGradMode enable(true);
      const at::Tensor y = fn(x_in, unflatten(*flat, full));
      torch::autograd::variable_list inputs{full};
      if (needs_x) inputs.push_back(x_in);
      // allow_unused: where fn ignores its parameters on this rank, their gradient is zeros, not a throw on this
      // rank alone that would leave its peers waiting in the reduce-scatter.
      grads = torch::autograd::grad({y}, inputs, {grad_outputs[0]}, {}, false, true);
    }
    const at::Tensor local = grads[0].defined() ? grads[0] : at::zeros({flat->padded_numel}, at::kFloat);
    // The average over the ranks, and only this rank's slice of it: a reduce-scatter of grad / N.
    const at::Tensor flat_grad = local / static_cast<double>(comm->world_size());
    at::Tensor shard_grad = at::empty({flat->padded_numel / flat->world_size}, at::kFloat);
    reduce_scatter_into(*comm, flat_grad, shard_grad);
    return {needs_x ? grads[1] : at::Tensor(), shard_grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor sharded_forward(dist::Comm& comm, FlatParam& flat, LayerFn fn, const at::Tensor& x) {
  // A shard that does not require grad is refused in the forward's agreement, on every rank.
  return ShardedLayer::apply(x, flat.shard, &comm, &flat, &fn);
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
  for (auto& work : works) work.wait();
  works.clear();
  return full;
}

namespace {

// start_gather's exchange in `dtype` (float32 here; step 5's start_gather_as passes its param dtype).
PendingGather post_gather(dist::Comm& comm, const FlatParam& flat, int tag, at::ScalarType dtype, const char* op) {
  TORCH_CHECK(flat.rank == comm.rank() && flat.world_size == comm.world_size(), op,
              ": the FlatParam was made for rank ", flat.rank, " of ", flat.world_size, ", but this is rank ",
              comm.rank(), " of ", comm.world_size());
  const int n = comm.world_size(), r = comm.rank();
  const int64_t size = flat.padded_numel / n;
  PendingGather pending;
  pending.full = at::empty({flat.padded_numel}, at::TensorOptions().dtype(dtype));
  const at::Tensor mine = pending.full.narrow(0, r * size, size);
  mine.copy_(flat.shard.detach());  // in dtype: the cast (none for float32) comes before the sends
  for (int k = 1; k < n; ++k) {     // round k: receive from rank r - k, send to rank r + k; all posted now
    const int from = (r - k + n) % n, to = (r + k) % n;
    pending.works.push_back(comm.recv_async(pending.full.narrow(0, from * size, size), from, tag));
    pending.works.push_back(comm.send_async(mine, to, tag));
  }
  return pending;
}

}  // namespace

PendingGather start_gather(dist::Comm& comm, const FlatParam& flat, int tag) {
  return post_gather(comm, flat, tag, at::kFloat, "start_gather");
}
// [start_gather]

// [sharded_stack]
namespace {

constexpr int kPrefetchTag = 1 << 16;  // + layer: apart from the rings' tags (0 .. N - 2)

// The agreements. Before a forward and before each layer's backward every
// rank says what it is about to do in one all-gather of a record of kRecord int64. Every rank then sees every
// rank's record and throws the same error, instead of waiting in a gather or a reduce-scatter that a peer never
// joins. A record: {phase, a, b, c, d, error, error_layer, error_other}.
enum Phase : int64_t { kForwardPhase = 1, kBackwardPhase = 2, kFinishPhase = 3 };
enum LocalError : int64_t {
  kNoError = 0,
  kFnCount = 1,
  kNotLeaf = 2,
  kListedTwice = 3,
  kGatheredTwice = 4,
  kNotFinished = 5,
  kBadPrecision = 6,
  kStackOtherRank = 7
};
constexpr int64_t kRecord = 8;

// The stack's two dtypes (step 5) in one slot of the forward's record, and back.
int64_t precision_code(const MixedPrecision& mp) {
  return static_cast<int64_t>(mp.param_dtype) * 256 + static_cast<int64_t>(mp.reduce_dtype);
}
MixedPrecision precision_of(int64_t code) {
  return {static_cast<at::ScalarType>(code / 256), static_cast<at::ScalarType>(code % 256)};
}

std::string doing(const std::vector<int64_t>& rec) {
  if (rec[0] == kForwardPhase) {
    const MixedPrecision mp = precision_of(rec[2]);
    const std::string precision = rec[2] == precision_code(MixedPrecision())
                                      ? std::string()
                                      : c10::str(", gathered in ", mp.param_dtype, ", reduced in ", mp.reduce_dtype);
    return c10::str("a forward of ", rec[1], " layers (", rec[3], " elements", precision, ")");
  }
  if (rec[0] == kFinishPhase) return "finish()";
  return c10::str("layer ", rec[1], "'s backward");
}

// check_mixed_precision's message for a precision it refuses (empty when it accepts it): the stack's rules and
// words are step 5's, not a copy of them.
std::string precision_error(const MixedPrecision& mp) {
  try {
    check_mixed_precision(mp);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return {};
}

// A FlatParam's rank and world size in one slot of the record (error_other), and back.
int64_t rank_code(const FlatParam& flat) {
  return static_cast<int64_t>(flat.rank) * (int64_t{1} << 32) + flat.world_size;
}

std::string local_error(const std::vector<int64_t>& rec, size_t rank, int world_size) {
  switch (rec[5]) {
    case kStackOtherRank:
      return c10::str("layer ", rec[6], "'s FlatParam was made for rank ", rec[7] >> 32, " of ", rec[7] & 0xffffffff,
                      ", but this is rank ", rank, " of ", world_size);
    case kFnCount:
      return c10::str("one LayerFn per FlatParam, got ", rec[6], " FlatParams and ", rec[7], " LayerFns");
    case kBadPrecision:
      return precision_error(precision_of(rec[2]));
    case kNotLeaf:
      return c10::str("layer ", rec[6], "'s shard must be a leaf that requires grad");
    case kListedTwice:
      return c10::str("layer ", rec[6], " is layer ", rec[7],
                      " again (the same shard): a layer runs once per forward, and an optimizer, a checkpoint or "
                      "full_state given every shard would take it twice");
    case kNotFinished:
      return c10::str("finish() was not called after the previous backward (", rec[6],
                      " layers backpropagated since): call it after every backward, on every rank");
    default:
      return c10::str("layer ", rec[6], " was gathered twice before its backward: the previous forward's graph ",
                      "still waits for its backward (a layer runs once per forward; backpropagate first, or run "
                      "the forward under no-grad)");
  }
}

// Exchanges this rank's record and throws, on every rank alike, when the records disagree or one names an error.
void agree(ShardedStack::State& s, std::vector<int64_t> mine) {
  mine.resize(kRecord, 0);
  std::vector<std::vector<int64_t>> all;
  for (const at::Tensor& t : s.comm.all_gather(at::tensor(mine, at::kLong))) {
    const at::Tensor c = t.contiguous();
    all.emplace_back(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  }
  for (size_t r = 0; r < all.size(); ++r) {
    TORCH_CHECK(all[r][0] != kForwardPhase || all[r][5] == kNoError, "ShardedStack: on rank ", r, ": ",
                local_error(all[r], r, s.comm.world_size()));
  }
  if (std::all_of(all.begin(), all.end(), [&](const auto& rec) { return rec == all[0]; })) return;
  std::string ranks;
  for (size_t r = 0; r < all.size(); ++r) ranks += c10::str(r ? "; " : "", "rank ", r, ": ", doing(all[r]));
  const bool forwards = std::all_of(all.begin(), all.end(), [](const auto& rec) { return rec[0] == kForwardPhase; });
  TORCH_CHECK(!forwards,
              "ShardedStack: the models differ across ranks in their layers' count, sizes, shapes or mixed precision (",
              ranks, "): every rank must run the same layers in the same dtypes");
  // In a backward: the layer that is missing somewhere is the highest one a rank is at (the backward walks down);
  // the first rank that is not there is one whose loss does not depend on it.
  int64_t layer = -1;
  for (const auto& rec : all) {
    if (rec[0] == kBackwardPhase) layer = std::max(layer, rec[1]);
  }
  TORCH_CHECK(layer >= 0, "ShardedStack: the ranks are at different calls (", ranks,
              "): every rank must call forward(), backpropagate and call finish() alike");
  size_t missing = 0;
  while (missing + 1 < all.size() && all[missing][0] == kBackwardPhase && all[missing][1] == layer) ++missing;
  const std::string why = c10::str("it is in ", doing(all[missing]), " instead: its loss does not depend on the layer");
  TORCH_CHECK(false, "ShardedStack: layer ", layer, " got no gradient on rank ", missing, " (", why,
              ") but did on another: every rank must backpropagate through every layer, or none does (", ranks, ")");
}

// A fingerprint of the stack's layers (their shapes and world sizes), for the forward's record.
int64_t fingerprint(const std::vector<FlatParam>& flats) {
  uint64_t h = 1469598103934665603ull;
  const auto mix = [&h](int64_t v) { h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull; };
  for (const FlatParam& flat : flats) {
    mix(flat.world_size);
    mix(static_cast<int64_t>(flat.shapes.size()));
    for (const auto& shape : flat.shapes) {
      mix(static_cast<int64_t>(shape.size()));
      for (const int64_t d : shape) mix(d);
    }
  }
  return static_cast<int64_t>(h >> 1);
}

// Starts layer's gather (when prefetching and the layer exists) and notes its buffer.
void start_layer(ShardedStack::State& s, int64_t layer) {
  if (layer < 0 || layer >= static_cast<int64_t>(s.flats.size()) || s.pending[layer]) return;
  const int tag = kPrefetchTag + static_cast<int>(layer);
  // Step 5: a stack made with a MixedPrecision gathers in its param dtype.
  s.pending[layer] =
      std::make_unique<PendingGather>(s.mixed ? start_gather_as(s.comm, s.flats[layer], tag, s.mp.param_dtype)
                                              : start_gather(s.comm, s.flats[layer], tag));
  s.gathered.push_back(s.pending[layer]->full.storage().getWeakStorageImpl());
}

// Layer's gathered buffer: the one in flight (started ahead), or one gathered now.
at::Tensor take_layer(ShardedStack::State& s, int64_t layer) {
  start_layer(s, layer);  // nothing in flight: start it now (and wait below)
  const at::Tensor full = s.pending[layer]->wait();
  s.pending[layer].reset();
  return full;
}

// The gathered buffers alive now (the one in use and any in flight): the most of them is max_alive.
void note_alive(ShardedStack::State& s) {
  s.gathered.erase(std::remove_if(s.gathered.begin(), s.gathered.end(), [](const auto& g) { return g.expired(); }),
                   s.gathered.end());
  s.max_alive = std::max(s.max_alive, static_cast<int>(s.gathered.size()));
}

struct StackLayer : public torch::autograd::Function<StackLayer> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& shard,
                            ShardedStack::State* s, int64_t layer) {
    ctx->saved_data["state"] = reinterpret_cast<int64_t>(s);
    ctx->saved_data["layer"] = layer;
    ctx->save_for_backward({x});
    const at::Tensor full = take_layer(*s, layer);
    if (s->prefetch) start_layer(*s, layer + 1);  // the next layer's gather travels while this one computes
    note_alive(*s);
    return s->fns[layer](x.to(s->mp.param_dtype), unflatten(s->flats[layer], full));  // step 5: in the param dtype
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto* s = reinterpret_cast<ShardedStack::State*>(ctx->saved_data["state"].toInt());
    const int64_t layer = ctx->saved_data["layer"].toInt();
    s->awaiting_backward[layer].reset();
    s->backwards_since_finish += 1;
    // Every rank is about to backpropagate through this layer, or every rank learns which one is not.
    agree(*s, {kBackwardPhase, layer});
    const at::Tensor x = ctx->get_saved_variables()[0];
    const bool needs_x = ctx->needs_input_grad(0);
    const at::Tensor full = take_layer(*s, layer).requires_grad_(true);
    if (s->prefetch) start_layer(*s, layer - 1);  // the layer below is next in the backward
    note_alive(*s);
    const at::Tensor x_in = x.detach().to(s->mp.param_dtype).requires_grad_(needs_x);
    torch::autograd::variable_list grads{at::Tensor(), at::Tensor()};
    {
      at::AutoGradMode enable(true);
      const at::Tensor y = s->fns[layer](x_in, unflatten(s->flats[layer], full));
      torch::autograd::variable_list inputs{full};
      if (needs_x) inputs.push_back(x_in);
      // allow_unused: a layer function that ignores its parameters (or its input) on this rank gives an undefined
      // gradient here, where autograd::grad would otherwise throw on this rank alone.
      const at::Tensor grad_y = grad_outputs[0].to(y.scalar_type());
      if (y.requires_grad()) grads = torch::autograd::grad({y}, inputs, {grad_y}, {}, false, true);
      grads.resize(2);
    }
    const FlatParam& flat = s->flats[layer];
    // A layer function that did not use the parameters on this rank: its share of the average is zero, and this
    // rank still joins the reduce-scatter that its peers are in.
    const at::Tensor local = grads[0].defined() ? grads[0] : at::zeros({flat.padded_numel}, at::kFloat);
    // Reduced in the reduce dtype, then float32 for the optimizer, as step 5's sharded_forward_mixed does
    // (without a MixedPrecision both are float32, and neither cast copies). Autograd's engine would cast the
    // shard's gradient to the shard's float32 anyway; the cast says where the optimizer's float32 comes from.
    const at::ScalarType reduce_dtype = s->mp.reduce_dtype;
    const at::Tensor flat_grad = local.to(reduce_dtype) / static_cast<double>(s->comm.world_size());
    at::Tensor reduced = at::empty({flat.padded_numel / flat.world_size}, at::TensorOptions().dtype(reduce_dtype));
    reduce_scatter_into(s->comm, flat_grad, reduced);
    const at::Tensor shard_grad = reduced.to(at::kFloat);
    return {grads[1].defined() ? grads[1].to(x.scalar_type()) : at::Tensor(), shard_grad, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor ShardedStack::forward(const at::Tensor& x) {
  State& s = *state_;
  // This rank's own findings go into its record, not into a throw: a rank that threw alone would leave its peers
  // waiting in the agreement.
  std::vector<int64_t> record(kRecord, 0);  // {phase, layers, precision, elements, fingerprint, error, its layers}
  record[0] = kForwardPhase;
  record[1] = static_cast<int64_t>(s.flats.size());
  record[2] = precision_code(s.mp);  // step 5: ranks whose dtypes differ would gather different bytes
  record[4] = fingerprint(s.flats);
  const auto fail = [&record](int64_t error, size_t layer, int64_t other) {
    if (record[5] != kNoError) return;
    record[5] = error;
    record[6] = static_cast<int64_t>(layer);
    record[7] = other;
  };
  if (s.backwards_since_finish > 0) fail(kNotFinished, static_cast<size_t>(s.backwards_since_finish), 0);
  if (s.fns.size() != s.flats.size()) fail(kFnCount, s.flats.size(), s.fns.size());
  if (s.mixed && !precision_error(s.mp).empty()) fail(kBadPrecision, 0, 0);  // step 5: every rank says why
  for (size_t l = 0; l < s.flats.size(); ++l) {
    const at::Tensor& shard = s.flats[l].shard;
    record[3] += s.flats[l].numel;
    // Another rank's FlatParam (or another world size's) would pass the comparison of shapes and fail in its
    // gather on this rank alone: it goes into the record.
    if (s.flats[l].rank != s.comm.rank() || s.flats[l].world_size != s.comm.world_size()) {
      fail(kStackOtherRank, l, rank_code(s.flats[l]));
    }
    if (!(shard.defined() && shard.is_leaf() && shard.requires_grad())) fail(kNotLeaf, l, 0);
    for (size_t k = 0; k < l; ++k) {
      if (shard.defined() && shard.is_same(s.flats[k].shard)) fail(kListedTwice, l, k);
    }
    if (!s.awaiting_backward[l].expired()) fail(kGatheredTwice, l, 0);
  }
  agree(s, record);
  at::Tensor h = x;
  for (size_t l = 0; l < s.flats.size(); ++l) {
    h = StackLayer::apply(h, s.flats[l].shard, state_.get(), static_cast<int64_t>(l));
    if (h.grad_fn()) s.awaiting_backward[l] = h.grad_fn();
  }
  return h;
}

void ShardedStack::finish() {
  State& s = *state_;
  s.backwards_since_finish = 0;
  // A rank whose backward never reached the stack comes here while its peers wait before a layer's backward: the
  // records differ, and every rank learns which layer got no gradient where, instead of waiting for the timeout.
  agree(s, {kFinishPhase});
}
// [sharded_stack]

// [mixed_precision]
void check_mixed_precision(const MixedPrecision& mp) {
  const at::ScalarType p = mp.param_dtype, r = mp.reduce_dtype;
  TORCH_CHECK(p == at::kFloat || p == at::kBFloat16 || p == at::kHalf,
              "MixedPrecision: param_dtype must be float32, bfloat16 or float16, got ", p);
  TORCH_CHECK(r == at::kFloat || r == p, "MixedPrecision: reduce_dtype must be float32 or the param_dtype (", p,
              "), got ", r);
}

at::Tensor gather_full_as(dist::Comm& comm, const FlatParam& flat, at::ScalarType dtype) {
  TORCH_CHECK(flat.rank == comm.rank() && flat.world_size == comm.world_size(),
              "gather_full_as: the FlatParam was made for rank ", flat.rank, " of ", flat.world_size,
              ", but this is rank ", comm.rank(), " of ", comm.world_size());
  at::Tensor full = at::empty({flat.padded_numel}, at::TensorOptions().dtype(dtype));
  // Cast the shard BEFORE the gather: the ring then carries the 16-bit bytes, half of float32's.
  all_gather_into(comm, flat.shard.detach().to(dtype), full);
  return full;
}

namespace {

// Step 3's layer with three casts: gather in param_dtype, compute in it, reduce-scatter in reduce_dtype.
struct MixedLayer : public torch::autograd::Function<MixedLayer> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& shard,
                            dist::Comm* comm, FlatParam* flat, const LayerFn* fn, MixedPrecision mp) {
    ctx->saved_data["comm"] = reinterpret_cast<int64_t>(comm);
    ctx->saved_data["flat"] = reinterpret_cast<int64_t>(flat);
    ctx->saved_data["fn"] = hold(*fn);  // a copy the node owns, as step 3's
    ctx->saved_data["param_dtype"] = static_cast<int64_t>(mp.param_dtype);
    ctx->saved_data["reduce_dtype"] = static_cast<int64_t>(mp.reduce_dtype);
    ctx->save_for_backward({x});
    agree_on_layer(*comm, *flat, false, mp.param_dtype, mp.reduce_dtype);
    const at::Tensor full = gather_full_as(*comm, *flat, mp.param_dtype);
    return (*fn)(x.to(mp.param_dtype), unflatten(*flat, full));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto* comm = reinterpret_cast<dist::Comm*>(ctx->saved_data["comm"].toInt());
    auto* flat = reinterpret_cast<FlatParam*>(ctx->saved_data["flat"].toInt());
    const LayerFn& fn = held(ctx);
    const auto param_dtype = static_cast<at::ScalarType>(ctx->saved_data["param_dtype"].toInt());
    const auto reduce_dtype = static_cast<at::ScalarType>(ctx->saved_data["reduce_dtype"].toInt());
    const at::Tensor x = ctx->get_saved_variables()[0];
    const bool needs_x = ctx->needs_input_grad(0);
    agree_on_layer(*comm, *flat, true, param_dtype, reduce_dtype);
    const at::Tensor full = gather_full_as(*comm, *flat, param_dtype).requires_grad_(true);
    const at::Tensor x_in = x.detach().to(param_dtype).requires_grad_(needs_x);
    torch::autograd::variable_list grads;
    {
      at::AutoGradMode enable(true);
      const at::Tensor y = fn(x_in, unflatten(*flat, full));
      torch::autograd::variable_list inputs{full};
      if (needs_x) inputs.push_back(x_in);
      // allow_unused, as step 3: parameters this rank's layer function ignores get zeros, not a throw here alone.
      grads = torch::autograd::grad({y}, inputs, {grad_outputs[0].to(y.scalar_type())}, {}, false, true);
    }
    const at::Tensor local = grads[0].defined() ? grads[0] : at::zeros({flat->padded_numel}, at::kFloat);
    // The reduction in reduce_dtype (divided by N before it, as step 3), then float32 for the optimizer.
    const at::Tensor flat_grad = local.to(reduce_dtype) / static_cast<double>(comm->world_size());
    at::Tensor reduced = at::empty({flat->padded_numel / flat->world_size}, at::TensorOptions().dtype(reduce_dtype));
    reduce_scatter_into(*comm, flat_grad, reduced);
    const at::Tensor shard_grad = reduced.to(at::kFloat);
    return {needs_x && grads[1].defined() ? grads[1].to(x.scalar_type()) : at::Tensor(),
            shard_grad,
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor sharded_forward_mixed(dist::Comm& comm, FlatParam& flat, LayerFn fn, const at::Tensor& x,
                                 const MixedPrecision& mp) {
  // The dtypes and the shard are checked in the forward's agreement, on every rank alike.
  return MixedLayer::apply(x, flat.shard, &comm, &flat, &fn, mp);
}
// [mixed_precision]

// [start_gather_as]
PendingGather start_gather_as(dist::Comm& comm, const FlatParam& flat, int tag, at::ScalarType dtype) {
  // start_gather's exchange with the shard cast to dtype first, as gather_full_as is gather_full's ring.
  return post_gather(comm, flat, tag, dtype, "start_gather_as");
}
// [start_gather_as]

// [sharded_unscale]
bool sharded_unscale_and_check(dist::Comm& comm, const std::vector<FlatParam>& flats, double scale) {
  // What every rank all-reduces (MAX): {flag, scale, -scale}. The flag: 0 clean, 1 an inf or NaN in a shard, 2 + r
  // a bad scale on rank r (the MAX then names the highest such rank): a rank with a bad scale still joins, so that
  // every rank throws. The two scale slots give every rank the highest and the lowest scale of the group.
  const bool bad_scale = !(std::isfinite(scale) && scale > 0);
  const double none = -std::numeric_limits<double>::infinity();  // a bad scale takes no part in the comparison
  at::Tensor agreed = at::tensor(std::vector<double>{bad_scale ? 2.0 + comm.rank() : 0.0, bad_scale ? none : scale,
                                                     bad_scale ? none : -scale},
                                 at::kDouble);
  if (!bad_scale) {
    at::NoGradGuard no_grad;
    for (const FlatParam& flat : flats) {
      const at::Tensor grad = flat.shard.grad();
      if (!grad.defined()) continue;
      grad.mul_(1.0 / scale);  // only this rank's slice of the gradient: it cannot see the others'
      if (!at::isfinite(grad).all().item<bool>()) agreed[0].fill_(1.0);
    }
  }
  // The agreement: every rank sees the same three numbers, so every rank skips (or steps, or throws) together.
  comm.all_reduce(agreed, dist::ReduceOp::kMax);
  const double flag = agreed[0].item<double>(), high = agreed[1].item<double>(), low = -agreed[2].item<double>();
  TORCH_CHECK(flag < 2, "sharded_unscale_and_check: on rank ", static_cast<int>(flag) - 2,
              ": scale must be finite and > 0 (every rank passes the scaler's one scale)");
  TORCH_CHECK(high == low, "sharded_unscale_and_check: the ranks passed different scales (from ", low, " to ", high,
              "): every rank passes the scaler's one scale, and backs it off or grows it alike");
  return flag > 0;
}
// [sharded_unscale]

// [checkpoint_save]
namespace {

constexpr int64_t kCheckpointFormat = 7006;  // the first element of every rank file's header

std::string rank_file(const std::string& dir, int rank) { return dir + "/rank_" + std::to_string(rank) + ".pt"; }

// A layer's parameter shapes as one int64 tensor: {count, ndim, dims..., ndim, dims...}.
at::Tensor encode_shapes(const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<int64_t> out{static_cast<int64_t>(shapes.size())};
  for (const auto& shape : shapes) {
    out.push_back(static_cast<int64_t>(shape.size()));
    out.insert(out.end(), shape.begin(), shape.end());
  }
  return at::tensor(out, at::kLong);
}

std::vector<std::vector<int64_t>> decode_shapes(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  const int64_t size = c.numel();
  std::vector<std::vector<int64_t>> out;
  int64_t i = 1;
  for (int64_t k = 0; k < (size > 0 ? p[0] : 0) && i < size; ++k) {
    const int64_t ndim = p[i++];
    out.emplace_back(p + i, p + std::min(size, i + ndim));
    i += ndim;
  }
  return out;
}

// What a rank found wrong with its arguments: it goes into the record, so that every rank throws it.
enum StateError : int64_t { kStateOk = 0, kStateOtherRank = 1, kStateLists = 2, kStateCount = 3, kStateElements = 4 };

// A record: {layers, state tensors per layer, error, layer, got, want, elements, fingerprint, step}.
std::string state_error(const std::vector<int64_t>& rec, size_t rank, int world_size) {
  switch (rec[2]) {
    case kStateOtherRank:
      return c10::str("FlatParam ", rec[3], " was made for rank ", rec[4], " of ", rec[5], ", but this is rank ", rank,
                      " of ", world_size);
    case kStateLists:
      return c10::str("one state list per FlatParam: ", rec[5], " FlatParams, ", rec[4], " state lists");
    case kStateCount:
      return c10::str("layer ", rec[3], " has ", rec[4], " state tensors, but layer 0 has ", rec[5]);
    default:
      return c10::str("a state tensor of layer ", rec[3], " has ", rec[4], " elements, but the shard has ", rec[5]);
  }
}

// Before save_sharded writes and before full_state's and full_optim_state's gathers, the ranks agree: each
// all-gathers a record of 9 int64 (its layers, their elements and a fingerprint of their shapes and world size, its
// state tensors per layer, the step it saves, and what it found wrong with its arguments), and every rank throws
// alike. Ranks whose layers differ would otherwise meet in gathers of different sizes (Gloo aborts the process) or
// of different counts (the timeout), or write files of one checkpoint that do not belong together; and a rank that
// threw alone would leave its peers in the next collective. `optim_state` is null for full_state, `step` null
// except for save_sharded.
void agree_on_state(dist::Comm& comm, const char* op, const std::vector<FlatParam>& flats,
                    const std::vector<std::vector<at::Tensor>>* optim_state, const int64_t* step = nullptr) {
  const int64_t k = optim_state && !optim_state->empty() ? static_cast<int64_t>((*optim_state)[0].size()) : 0;
  std::vector<int64_t> mine{
      static_cast<int64_t>(flats.size()), k, kStateOk, 0, 0, 0, 0, fingerprint(flats), step ? *step : 0};
  const auto fail = [&mine](int64_t error, size_t layer, int64_t got, int64_t want) {
    if (mine[2] != kStateOk) return;
    mine[2] = error;
    mine[3] = static_cast<int64_t>(layer);
    mine[4] = got;
    mine[5] = want;
  };
  if (optim_state && optim_state->size() != flats.size()) {
    fail(kStateLists, 0, static_cast<int64_t>(optim_state->size()), static_cast<int64_t>(flats.size()));
  }
  for (size_t l = 0; l < flats.size(); ++l) {
    const FlatParam& flat = flats[l];
    mine[6] += flat.numel;
    if (flat.rank != comm.rank() || flat.world_size != comm.world_size()) {
      fail(kStateOtherRank, l, flat.rank, flat.world_size);
    }
    if (!optim_state || l >= optim_state->size()) continue;
    if (static_cast<int64_t>((*optim_state)[l].size()) != k) {
      fail(kStateCount, l, static_cast<int64_t>((*optim_state)[l].size()), k);
    }
    for (const at::Tensor& state : (*optim_state)[l]) {
      const int64_t size = flat.padded_numel / std::max(flat.world_size, 1);
      const int64_t got = state.defined() ? state.numel() : 0;
      if (got != size) fail(kStateElements, l, got, size);
    }
  }
  std::vector<std::vector<int64_t>> all;
  for (const at::Tensor& t : comm.all_gather(at::tensor(mine, at::kLong))) {
    const at::Tensor c = t.contiguous();
    all.emplace_back(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  }
  for (size_t r = 0; r < all.size(); ++r) {
    TORCH_CHECK(all[r][2] == kStateOk, op, ": on rank ", r, ": ", state_error(all[r], r, comm.world_size()));
  }
  std::string ranks;
  bool same = true;
  for (size_t r = 0; r < all.size(); ++r) {
    const auto& rec = all[r];
    same = same && rec[0] == all[0][0] && rec[1] == all[0][1] && rec[6] == all[0][6] && rec[7] == all[0][7] &&
           rec[8] == all[0][8];
    ranks += c10::str(r ? "; " : "", "rank ", r, ": ", rec[0], " layers of ", rec[6], " elements (shapes #",
                      rec[7] % 10000, ")", optim_state ? c10::str(", ", rec[1], " state tensors each") : "",
                      step ? c10::str(", step ", rec[8]) : "");
  }
  const char* what = step ? "checkpoint they save" : optim_state ? "state they gather" : "layers they gather";
  TORCH_CHECK(same, op, ": the ranks disagree on the ", what, " (", ranks,
              "): every rank must pass its shards of the same layers", optim_state ? " and their state" : "",
              step ? ", at the same step" : "");
}


std::string shapes_text(const std::vector<std::vector<std::vector<int64_t>>>& layers) {
  std::string out;
  for (const auto& layer : layers) {
    out += "[";
    for (const auto& shape : layer) out += c10::str(c10::IntArrayRef(shape));
    out += "]";
  }
  return out;
}

}  // namespace

void save_sharded(dist::Comm& comm, const std::string& dir, const ShardedCheckpoint& ckpt) {
  const int r = comm.rank(), n = comm.world_size();
  // Every rank checks its own arguments and the ranks compare what they save before anyone writes: a rank that
  // threw alone would leave its peers waiting in their next collective, with a checkpoint of missing files.
  agree_on_state(comm, "save_sharded", ckpt.flats, &ckpt.optim_state, &ckpt.step);
  const size_t k = ckpt.flats.empty() ? 0 : ckpt.optim_state[0].size();
  std::vector<at::Tensor> out{
      at::tensor(std::vector<int64_t>{kCheckpointFormat, n, r, static_cast<int64_t>(ckpt.flats.size()), ckpt.step,
                                      static_cast<int64_t>(k)},
                 at::kLong)};
  for (size_t l = 0; l < ckpt.flats.size(); ++l) {
    const FlatParam& flat = ckpt.flats[l];
    out.push_back(encode_shapes(flat.shapes));
    out.push_back(at::tensor(std::vector<int64_t>{flat.numel}, at::kLong));
    out.push_back(flat.shard.detach().contiguous());
    for (const at::Tensor& state : ckpt.optim_state[l]) {
      out.push_back(state.detach().to(at::kFloat).contiguous().view({flat.padded_numel / n}));
    }
  }
  // A write that fails (a full disk, a path that is a folder) fails every rank too: the ranks agree on it.
  std::string failure;
  try {
    std::filesystem::create_directories(dir);
    torch::save(out, rank_file(dir, r));
  } catch (const c10::Error& e) {
    failure = e.what_without_backtrace();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const std::vector<at::Tensor> written = comm.all_gather(at::full({1}, failure.empty() ? 0 : 1, at::kLong));
  for (int q = 0; q < n; ++q) {
    TORCH_CHECK(written[static_cast<size_t>(q)].item<int64_t>() == 0, "save_sharded: on rank ", q, ": could not write ",
                rank_file(dir, q), q == r ? c10::str(" (", failure.substr(0, 200), ")") : "");
  }
}
// [checkpoint_save]

// [checkpoint_load]
namespace {

// One old rank's file, read, with its header checked: its format, and its rank and world size against its name
// (old_n < 0: not known yet, rank 0's file tells).
std::vector<at::Tensor> read_rank_file(const std::string& dir, int rank, int64_t old_n) {
  const std::string path = rank_file(dir, rank);
  TORCH_CHECK(std::filesystem::exists(path), "load_sharded: missing rank file ", path, " (the checkpoint in ", dir,
              " was saved by ", old_n < 0 ? std::string("? ") : std::to_string(old_n) + " ", "ranks)");
  std::vector<at::Tensor> in;
  torch::load(in, path);
  TORCH_CHECK(!in.empty() && in[0].scalar_type() == at::kLong && in[0].numel() == 6 &&
                  in[0][0].item<int64_t>() == kCheckpointFormat && in[0][1].item<int64_t>() > 0 &&
                  in[0][3].item<int64_t>() >= 0 && in[0][5].item<int64_t>() >= 0,
              "load_sharded: ", path, " is not a sharded checkpoint of this lesson");
  TORCH_CHECK(in[0][2].item<int64_t>() == rank, "load_sharded: ", path, " is not rank ", rank,
              " (its header says rank ", in[0][2].item<int64_t>(), " of ", in[0][1].item<int64_t>(), ")");
  const int64_t layers = in[0][3].item<int64_t>(), k = in[0][5].item<int64_t>();
  TORCH_CHECK(static_cast<int64_t>(in.size()) == 1 + layers * (3 + k), "load_sharded: ", path,
              " is not a sharded checkpoint of this lesson (", in.size(), " tensors)");
  return in;
}

// A header as text: "3 ranks, 2 layers, step 7, 2 state tensors per layer".
std::string header_text(const at::Tensor& header) {
  return c10::str(header[1].item<int64_t>(), " ranks, ", header[3].item<int64_t>(), " layers, step ",
                  header[4].item<int64_t>(), ", ", header[5].item<int64_t>(), " state tensors per layer");
}

// Old rank q's file against rank 0's: the same checkpoint (world size, layers, step, state count, every layer's
// shapes and elements), every shard and state shard of the old size. Every rank checks every file this way, in the
// same order, before it uses any: a leftover file of another run fails every rank alike, by name.
void check_rank_file(const std::string& dir, int q, const std::vector<at::Tensor>& file,
                     const std::vector<at::Tensor>& head, const std::vector<std::vector<std::vector<int64_t>>>& saved) {
  const auto other = [&](const std::string& what) {
    return c10::str("load_sharded: ", rank_file(dir, q), " does not belong to the checkpoint of ", rank_file(dir, 0),
                    ": ", what, " (a leftover file of another run? save each checkpoint into a folder of its own)");
  };
  for (const int64_t i : {1, 3, 4, 5}) {  // the world size, the layers, the step, the state tensors per layer
    TORCH_CHECK(file[0][i].item<int64_t>() == head[0][i].item<int64_t>(),
                other(c10::str("its header says ", header_text(file[0]), ", rank 0's ", header_text(head[0]))));
  }
  const int64_t old_n = head[0][1].item<int64_t>(), k = head[0][5].item<int64_t>();
  for (size_t l = 0; l < saved.size(); ++l) {
    const size_t at = 1 + l * static_cast<size_t>(3 + k);
    const std::vector<std::vector<int64_t>> shapes = decode_shapes(file[at]);
    TORCH_CHECK(shapes == saved[l], other(c10::str("its layer ", l, " has the shapes ", shapes_text({shapes}),
                                                   ", rank 0's ", shapes_text({saved[l]}))));
    int64_t numel = 0;
    for (const auto& shape : saved[l]) numel += elements_of(shape);
    TORCH_CHECK(file[at + 1].numel() == 1 && file[at + 1].item<int64_t>() == numel, "load_sharded: ", rank_file(dir, q),
                " is not a sharded checkpoint of this lesson (layer ", l, "'s element count)");
    const int64_t old_size = padded_numel(numel, static_cast<int>(old_n)) / old_n;
    for (int64_t i = 0; i <= k; ++i) {
      const at::Tensor& old = file[at + 2 + static_cast<size_t>(i)];
      TORCH_CHECK(old.scalar_type() == at::kFloat && old.numel() == old_size, "load_sharded: layer ", l,
                  " of rank file ", q, " has ", old.numel(), " elements, but ", old_n, " ranks need ", old_size);
    }
  }
}

}  // namespace

ShardedCheckpoint load_sharded(dist::Comm& comm, const std::string& dir,
                               const std::vector<std::vector<std::vector<int64_t>>>& shapes) {
  const int r = comm.rank(), n = comm.world_size();
  // Every rank reads rank 0's header and checks the same things in the same order: all fail, or none.
  const std::vector<at::Tensor> head = read_rank_file(dir, 0, -1);
  const int64_t old_n = head[0][1].item<int64_t>(), layers = head[0][3].item<int64_t>();
  const int64_t k = head[0][5].item<int64_t>();
  std::vector<std::vector<std::vector<int64_t>>> saved;
  for (int64_t l = 0; l < layers; ++l) saved.push_back(decode_shapes(head[1 + l * (3 + k)]));
  TORCH_CHECK(saved == shapes, "load_sharded: the checkpoint in ", dir, " was saved for another model: its shapes ",
              shapes_text(saved), ", this model's ", shapes_text(shapes));
  for (int q = 0; q < old_n; ++q) {
    TORCH_CHECK(std::filesystem::exists(rank_file(dir, q)), "load_sharded: missing rank file ", rank_file(dir, q),
                " (the checkpoint in ", dir, " was saved by ", old_n, " ranks)");
  }
  // The new layout, per layer: the new and the old shard sizes, and the unpadded range [begin, end) of the flat
  // buffer that this rank's new shard holds (everything past numel stays zero; a rank may hold padding only).
  std::vector<int64_t> sizes, old_sizes, begins, ends;
  for (const auto& layer : saved) {
    int64_t numel = 0;
    for (const auto& shape : layer) numel += c10::multiply_integers(shape);
    sizes.push_back(padded_numel(numel, n) / n);                                // S', the new shard
    old_sizes.push_back(padded_numel(numel, static_cast<int>(old_n)) / old_n);  // S, the old one
    begins.push_back(std::min<int64_t>(r * sizes.back(), numel));
    ends.push_back(std::min<int64_t>((r + 1) * sizes.back(), numel));
  }
  // Whether old rank q's shard of layer l holds elements of this rank's new range.
  const auto overlaps = [&](int64_t q, size_t l) {
    return q * old_sizes[l] < ends[l] && (q + 1) * old_sizes[l] > begins[l];
  };
  // Every old rank's file checked, on every rank, before any is used; this rank keeps the ones it copies from.
  std::vector<std::vector<at::Tensor>> files(static_cast<size_t>(old_n));
  for (int q = 0; q < old_n; ++q) {
    std::vector<at::Tensor> file = q == 0 ? head : read_rank_file(dir, q, old_n);
    check_rank_file(dir, q, file, head, saved);
    bool needed = false;
    for (size_t l = 0; l < saved.size(); ++l) needed = needed || overlaps(q, l);
    if (needed) files[static_cast<size_t>(q)] = std::move(file);
  }
  ShardedCheckpoint ckpt;
  ckpt.step = head[0][4].item<int64_t>();
  for (size_t l = 0; l < saved.size(); ++l) {
    FlatParam flat;
    flat.shapes = saved[l];
    for (const auto& shape : flat.shapes) {
      flat.offsets.push_back(flat.numel);
      flat.numel += c10::multiply_integers(shape);
    }
    flat.padded_numel = padded_numel(flat.numel, n);
    flat.rank = r;
    flat.world_size = n;
    const int64_t size = sizes[l], old_size = old_sizes[l], begin = begins[l], end = ends[l];
    std::vector<at::Tensor> pieces(static_cast<size_t>(1 + k));
    for (auto& piece : pieces) piece = at::zeros({size}, at::kFloat);
    for (int64_t q = 0; q < old_n; ++q) {
      if (!overlaps(q, l)) continue;
      const std::vector<at::Tensor>& file = files[static_cast<size_t>(q)];
      const int64_t from = std::max(begin, q * old_size), to = std::min(end, (q + 1) * old_size);
      for (int64_t i = 0; i <= k; ++i) {
        const at::Tensor& old = file[1 + l * static_cast<size_t>(3 + k) + 2 + static_cast<size_t>(i)];
        pieces[static_cast<size_t>(i)]
            .narrow(0, from - r * size, to - from)
            .copy_(old.narrow(0, from - q * old_size, to - from));
      }
    }
    flat.shard = pieces[0].requires_grad_(true);
    ckpt.flats.push_back(std::move(flat));
    ckpt.optim_state.emplace_back(pieces.begin() + 1, pieces.end());
  }
  return ckpt;
}
// [checkpoint_load]

// [full_state]
std::vector<at::Tensor> full_state(dist::Comm& comm, const std::vector<FlatParam>& flats) {
  agree_on_state(comm, "full_state", flats, nullptr);  // a fault on any rank fails every rank, before any gather
  std::vector<at::Tensor> out;
  for (const FlatParam& flat : flats) {
    const at::Tensor full = gather_full(comm, flat);  // every rank takes part in every gather
    if (comm.rank() != 0) continue;
    for (const at::Tensor& view : unflatten(flat, full)) out.push_back(view.clone());
  }
  return out;
}
// [full_state]

// [full_optim_state]
std::vector<std::vector<at::Tensor>> full_optim_state(dist::Comm& comm, const std::vector<FlatParam>& flats,
                                                      const std::vector<std::vector<at::Tensor>>& optim_state) {
  // This rank's findings go into its record: a rank that threw alone would leave its peers in the first gather.
  agree_on_state(comm, "full_optim_state", flats, &optim_state);
  // Per parameter, in full_state's order, its state tensors in its shape: gathered as the parameters are.
  std::vector<std::vector<at::Tensor>> out;
  for (size_t l = 0; l < flats.size(); ++l) {
    const FlatParam& flat = flats[l];
    const size_t first = out.size();
    if (comm.rank() == 0) out.resize(first + flat.shapes.size());
    for (const at::Tensor& state : optim_state[l]) {
      at::Tensor full = at::empty({flat.padded_numel}, at::kFloat);
      all_gather_into(comm, state.detach().to(at::kFloat).contiguous().view({-1}), full);
      if (comm.rank() == 0) {  // rank 0 keeps a copy of each parameter's piece, in its shape
        const std::vector<at::Tensor> views = unflatten(flat, full);
        for (size_t i = 0; i < views.size(); ++i) out[first + i].push_back(views[i].clone());
      }
    }
  }
  return out;
}
// [full_optim_state]

}  // namespace fsdp
