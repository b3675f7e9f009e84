// Lesson 7, step 7 — What fits: the napkin arithmetic of fully sharded training at the scale it is made for. Which
// transformer fits on how many H200s with DDP, ZeRO-1, ZeRO-2 or full sharding, with and without activation
// checkpointing, and what the step's collectives cost on the links between the GPUs. Nothing here runs a model:
// every function is arithmetic on integers (bytes) and one division (seconds). See lesson7_fsdp/README.md, step 7.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lesson4_memory/planner.h"

namespace fsdp {

// [api_fits_shape]
/// The two families of the published shapes. They differ in where the parameters are (see layer_parameters):
///  - kGpt (GPT-2/GPT-3): biases in every Linear, LayerNorm (weight and bias), a 4h MLP of two matrices, learned
///    position embeddings, the output head tied to the token embedding;
///  - kLlama (Llama 2): no biases, RMSNorm (weight only), a gated (SwiGLU) MLP of three matrices of width `ffn`,
///    rotary positions (no parameters), an output head of its own, grouped-query attention (`kv_heads` <= heads).
enum class Family { kGpt, kLlama };

/// A decoder-only transformer, and the batch each GPU trains on.
struct TransformerShape {
  std::string name;
  Family family = Family::kLlama;
  int64_t layers = 0;       ///< transformer blocks
  int64_t hidden = 0;       ///< h, the model width
  int64_t heads = 0;        ///< a, attention heads (hidden / heads is the head width)
  int64_t kv_heads = 0;     ///< key/value heads (= heads without grouped-query attention)
  int64_t ffn = 0;          ///< the MLP's inner width (4h for GPT)
  int64_t vocab = 0;        ///< V, tokens
  int64_t sequence = 0;     ///< s, tokens per sequence (the trained context length)
  int64_t micro_batch = 0;  ///< b, sequences per GPU per forward/backward
};

/// The four shapes of the table, from their public configs: GPT-3 XL (1.3B; Brown et al. 2020, table 2.1, with
/// 16 heads of 128 so that heads x head width = 2048), Llama 2 7B, 13B and 70B (Touvron et al. 2023; the
/// config.json of meta-llama/Llama-2-*-hf: layers, hidden_size, num_attention_heads, num_key_value_heads,
/// intermediate_size, vocab_size, and the 4096-token context). One sequence per GPU per micro-batch.
inline std::vector<TransformerShape> published_shapes() {
  return {
      {"GPT-3 1.3B", Family::kGpt, 24, 2048, 16, 16, 8192, 50257, 2048, 1},
      {"Llama-2 7B", Family::kLlama, 32, 4096, 32, 32, 11008, 32000, 4096, 1},
      {"Llama-2 13B", Family::kLlama, 40, 5120, 40, 40, 13824, 32000, 4096, 1},
      {"Llama-2 70B", Family::kLlama, 80, 8192, 64, 8, 28672, 32000, 4096, 1},
  };
}

/// Where a model's parameters are, as FSDP wraps them: one unit (one flat buffer, step 2) per transformer block
/// and one more for everything else (embeddings, final norm, output head).
struct ParamCount {
  int64_t layers = 0;     ///< how many blocks
  int64_t per_layer = 0;  ///< parameters of one block
  int64_t other = 0;      ///< parameters outside the blocks
  int64_t total() const { return layers * per_layer + other; }
};

/// Step 7: the parameters of one block of `shape`. Attention: the query and output projections h x h each, the
/// key and value projections h x (kv_heads x h / heads) each; the MLP: 2 x h x ffn (kGpt) or 3 x h x ffn (kLlama,
/// gated); two norms of h (RMSNorm) or 2h (LayerNorm) each; and for kGpt the biases: h + 2 x kv width + h for
/// attention, ffn + h for the MLP. Throws "layers must be > 0" (and the same words for hidden, heads, kv_heads,
/// ffn, vocab, sequence, micro_batch), "heads must divide hidden", "kv_heads must divide heads" and "unknown
/// family" (a `family` that is neither kGpt nor kLlama).
int64_t layer_parameters(const TransformerShape& shape);

/// Step 7: the parameters of the whole model, by FSDP unit: `layers` blocks of layer_parameters(shape), and
/// outside them the token embedding V x h, for kGpt the learned positions s x h and a final LayerNorm of 2h (the
/// head is tied to the embedding), for kLlama a final RMSNorm of h and an output head V x h of its own. Throws
/// what layer_parameters throws.
ParamCount count_parameters(const TransformerShape& shape);
// [api_fits_shape]

// [api_fits_bytes]
/// How the model state is split over the GPUs (the ZeRO paper's stages; PyTorch FSDP's ShardingStrategy).
enum class Strategy {
  kDdp,        ///< everything replicated (lesson 5; FSDP's NO_SHARD)
  kZero1,      ///< optimizer state sharded (lesson 5, step 5)
  kZero2,      ///< optimizer state and gradients sharded (FSDP's SHARD_GRAD_OP, almost: see the page)
  kFullShard,  ///< optimizer state, gradients and parameters sharded (steps 1-6; FSDP's FULL_SHARD, ZeRO-3)
};

/// "DDP", "ZeRO-1", "ZeRO-2", "full shard" ("unknown" for a value that is none of them).
inline std::string strategy_name(Strategy strategy) {
  switch (strategy) {
    case Strategy::kDdp:
      return "DDP";
    case Strategy::kZero1:
      return "ZeRO-1";
    case Strategy::kZero2:
      return "ZeRO-2";
    case Strategy::kFullShard:
      return "full shard";
  }
  return "unknown";
}

/// The four strategies, in the order above.
inline std::vector<Strategy> all_strategies() {
  return {Strategy::kDdp, Strategy::kZero1, Strategy::kZero2, Strategy::kFullShard};
}

/// Mixed-precision Adam, the ZeRO paper's 2 + 2 + 12 bytes per parameter: a bfloat16 parameter, a bfloat16
/// gradient, and the optimizer's float32 master copy and two float32 moments.
constexpr int64_t kParamBytes = 2;
constexpr int64_t kGradBytes = 2;
constexpr int64_t kOptimizerBytes = 12;

/// Bytes of model state on each GPU.
struct StateBytes {
  int64_t params = 0;     ///< bfloat16 parameters kept between steps (all, or the GPU's shards)
  int64_t grads = 0;      ///< bfloat16 gradients kept after the backward (all, or the GPU's shards)
  int64_t optimizer = 0;  ///< float32 master copy and Adam's two moments (all, or the GPU's shards)
  int64_t working = 0;    ///< full buffers that exist only while a unit computes (see model_state_bytes)
  int64_t total() const { return params + grads + optimizer + working; }
};

/// Step 7: the elements of one GPU's shards of the whole model on `gpus` GPUs: every unit's flat buffer padded
/// to a multiple of N and split in N (step 2), so layers x ceil(per_layer / N) + ceil(other / N). Throws "gpus
/// must be > 0" and "parameter counts must be >= 0".
int64_t sharded_elements(const ParamCount& count, int gpus);

/// Step 7: the bytes of model state on each of `gpus` GPUs. A sharded piece holds sharded_elements(count, gpus)
/// elements, a replicated one count.total(), at kParamBytes, kGradBytes and kOptimizerBytes each:
///  - kDdp: parameters, gradients and optimizer state replicated;
///  - kZero1: the optimizer state sharded;
///  - kZero2: also the gradients; `working` is one unit's full bfloat16 gradient before its reduce-scatter;
///  - kFullShard: also the parameters; `working` is two units' full bfloat16 parameters in flight (the one that
///    computes and the prefetched one, step 4) and one unit's full bfloat16 gradient before its reduce-scatter.
/// "One unit" is the largest: max(per_layer, other). On one GPU the shard is the whole model and nothing is
/// gathered: `working` is 0 for every strategy (PyTorch's FSDP switches to NO_SHARD there). Throws "unknown strategy" and what sharded_elements throws.
StateBytes model_state_bytes(const ParamCount& count, Strategy strategy, int gpus);
// [api_fits_bytes]

// [api_fits_activations]
/// Step 7: bytes of activations a GPU saves for the backward, counted tensor by tensor in the shape's own block as
/// Korthikanti et al. 2022 count a GPT-3 layer ("Reducing Activation Recomputation in Large Transformer Models",
/// section 4.1, no tensor parallelism), whose total is their equation 1, 34 s b h + 5 a s^2 b. With s = sequence,
/// b = micro_batch, h = hidden, a = heads, kv = kv_heads x h / a (the width of K and of V), f = ffn, 2 bytes per
/// element (bfloat16) and 1 per element of a dropout mask, one block saves:
///  - in both families: each norm's input (2 s b h, two norms), the input the q, k and v projections share
///    (2 s b h), Q (2 s b h) and K (2 s b kv) for Q K^T, the softmax's output (2 a s^2 b), V (2 s b kv), the output
///    projection's input (2 s b h) and the MLP's input (2 s b h): 12 s b h + 4 s b kv + 2 a s^2 b;
///  - kGpt, also: GeLU's input and its output, the second matrix's input (2 s b f each), and the dropout: the
///    scores' mask (a s^2 b), the dropped scores that multiply V (2 a s^2 b), the masks after the attention and
///    after the MLP (s b h each): 14 s b h + 4 s b kv + 4 s b f + 5 a s^2 b in all. At f = 4h and kv = h that is the
///    paper's 34 s b h + 5 a s^2 b: its attention's 11 s b h + 5 a s^2 b (q/k/v input 2, Q and K 4, softmax output
///    2 a s^2 b, its dropout mask a s^2 b, dropout output 2 a s^2 b, V 2, projection input 2, dropout mask 1), its
///    MLP's 19 s b h (the two matrices' inputs 2 and 8, GeLU's input 8, dropout mask 1) and its LayerNorms' 4 s b h;
///  - kLlama, also: SwiGLU's four tensors of width f, gate, up, silu(gate) and their product, the down projection's
///    input (2 s b f each); no dropout, so the softmax's output is what multiplies V: 12 s b h + 4 s b kv +
///    8 s b f + 2 a s^2 b in all.
/// Not counted: a norm's per-token statistics (the paper counts none for LayerNorm), rotary's tables of cos and sin
/// (constants), the residual additions (they save nothing). K and V are counted kv wide, as a kernel that reads
/// each key/value head for its group of query heads keeps them; code that first repeats them to all a heads saves
/// them h wide. Without checkpointing every block keeps its own: layers x that. With every block checkpointed
/// (lesson 4) a block keeps only its input, 2 s b h bytes, and the backward recomputes one block at a time:
/// layers x 2 s b h + one block. Throws what layer_parameters throws.
int64_t activation_bytes(const TransformerShape& shape, bool checkpointing);
// [api_fits_activations]

// [api_fits_comm]
/// Step 7: the bytes each GPU sends per training step in the rings of step 1 (bfloat16 gradients and
/// parameters): a reduce-scatter or an all-gather of the whole model sends N - 1 chunks of one GPU's shard,
/// (N - 1) x sharded_elements x 2 bytes, padding included; an all-reduce is two of them.
///  - kDdp: one all-reduce of the gradients (2 rings);
///  - kZero1, kZero2: a reduce-scatter of the gradients, and an all-gather of the updated parameters (2 rings);
///  - kFullShard: an all-gather before the forward, one before the backward and a reduce-scatter (3 rings).
/// One GPU sends nothing. Throws "unknown strategy" and what sharded_elements throws.
int64_t comm_bytes_per_step(const ParamCount& count, Strategy strategy, int gpus);

/// The links, as assumptions (see the page): GPUs of one node talk over NVLink, nodes over one network port per
/// GPU. The network is given as its data sheet gives it, in gigaBITS per second.
struct Cluster {
  int gpus_per_node = 8;
  double nvlink_gigabytes_per_s = 450.0;  ///< per GPU and direction (NVLink 4: 18 links x 25 GB/s)
  double network_gigabits_per_s = 400.0;  ///< per GPU and direction (one 400 Gb/s port per GPU)
  int64_t gpu_bytes = 141000000000;       ///< memory per GPU: an H200's 141 GB
};

/// Step 7: the napkin time of `bytes` sent per GPU in rings over `gpus` GPUs: bytes / the slowest link a ring
/// crosses, NVLink while gpus <= gpus_per_node, the network beyond (its gigabits are 1e9 / 8 bytes per second).
/// Throws "gpus must be > 0", "bytes must be >= 0" and "bandwidth must be > 0".
double comm_seconds(int64_t bytes, int gpus, const Cluster& cluster);
// [api_fits_comm]

// [api_fits_verdict]
/// One cell of the table: one model, strategy, number of GPUs, with or without checkpointing.
struct Fit {
  StateBytes state;         ///< model_state_bytes
  int64_t activations = 0;  ///< activation_bytes
  int64_t total = 0;        ///< state.total() + activations
  bool fits = false;        ///< total <= cluster.gpu_bytes
  int64_t comm_bytes = 0;   ///< comm_bytes_per_step
  double comm_s = 0;        ///< comm_seconds of comm_bytes
};

/// Step 7: the cell. Throws what the functions above throw, and "gpu_bytes must be > 0".
Fit what_fits(const TransformerShape& shape, Strategy strategy, int gpus, bool checkpointing, const Cluster& cluster);
// [api_fits_verdict]

// [api_fits_plan]
/// Step 7: one GPU's peak bytes when it trains `batch` sequences of `shape` per step with lesson 4's `recipe`
/// (mem::Recipe; shape.micro_batch is not used): model_state_bytes(strategy, gpus) + the activations of one
/// micro-batch of recipe.micro_batch sequences (0: all `batch` of them), with b = that micro-batch in
/// activation_bytes' block:
///  - S = recipe.segments, as lesson 4's checkpoint_sequential splits the blocks: S near-equal segments, every
///    one but the last checkpointed. In the backward the S - 1 checkpointed segments' inputs are kept (2 s b h
///    each) and one segment's blocks hold their activations at a time, the largest ceil(layers / S) of them:
///    (S - 1) x 2 s b h + ceil(layers / S) x block. S = 1 is no checkpointing, activation_bytes(shape, false);
///    S = layers keeps one input fewer than activation_bytes(shape, true), whose every block is checkpointed,
///    the last one too (PyTorch's apply_activation_checkpointing);
///  - recipe.low_precision false: the activations are float32, twice those bytes. The model state stays as
///    model_state_bytes counts it (mixed precision) for every recipe.
/// Throws "batch must be > 0", "micro_batch must be in [0, batch]", "segments must be in [1, layers]", and what
/// model_state_bytes and activation_bytes throw.
int64_t recipe_peak_bytes(const TransformerShape& shape, Strategy strategy, int gpus, int64_t batch,
                          const mem::Recipe& recipe);

/// Step 7: lesson 4's planner asked the question of the table: mem::plan_for_budget(cluster.gpu_bytes, batch,
/// shape.layers, probe) with recipe_peak_bytes as the probe (arithmetic in place of lesson 4's measured run).
/// Throws what plan_for_budget throws ("budget_bytes must be > 0" when cluster.gpu_bytes is not, "batch must be
/// >= 1", "no recipe fits the budget" with the smallest peak) and what recipe_peak_bytes throws.
mem::Plan plan_cell(const TransformerShape& shape, Strategy strategy, int gpus, int64_t batch, const Cluster& cluster);
// [api_fits_plan]

}  // namespace fsdp
