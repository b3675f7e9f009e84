// Checks for lesson 7, step 7: what fits (the napkin arithmetic of what_fits.h). Every number here is worked by
// hand on the page (lesson7_fsdp/README.md, "Step 7 — What fits"), or taken from the source it names.
// Run: bazel test //lesson7_fsdp:fsdp_step7_test
#include "tests/torch_doctest.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lesson4_memory/planner.h"
#include "lesson7_fsdp/what_fits.h"

using doctest::Contains;

namespace {

// The page's round model: 7e9 parameters in 28 blocks of 250e6, nothing outside them.
fsdp::ParamCount round_7b() {
  fsdp::ParamCount count;
  count.layers = 28;
  count.per_layer = 250000000;
  count.other = 0;
  return count;
}

fsdp::TransformerShape shape_named(const std::string& name) {
  for (const auto& shape : fsdp::published_shapes()) {
    if (shape.name == name) {
      return shape;
    }
  }
  FAIL("no published shape named " << name);
  return {};
}

// Two toy shapes small enough to count on paper (the page does).
fsdp::TransformerShape toy_gpt() { return {"toy GPT", fsdp::Family::kGpt, 2, 4, 2, 2, 16, 10, 3, 1}; }
fsdp::TransformerShape toy_llama() { return {"toy Llama", fsdp::Family::kLlama, 2, 8, 4, 2, 12, 10, 3, 1}; }

int64_t kept(const fsdp::StateBytes& b) { return b.params + b.grads + b.optimizer; }

}  // namespace

TEST_CASE("[step7] parameters counted from the shape: the toy shapes by hand, the published ones as published") {
  // Toy GPT (h 4, ffn 16, V 10, s 3): attention 2*16 + 2*4*4 = 64, MLP 2*4*16 = 128, biases (4+8+4) + (16+4) = 36,
  // two LayerNorms 16: 244 per block; outside: 40 + 12 + 8 = 60.
  CHECK(fsdp::layer_parameters(toy_gpt()) == 244);
  fsdp::ParamCount gpt = fsdp::count_parameters(toy_gpt());
  CHECK(gpt.layers == 2);
  CHECK(gpt.per_layer == 244);
  CHECK(gpt.other == 60);
  CHECK(gpt.total() == 548);
  // Toy Llama (h 8, 4 heads, 2 kv heads: kv width 4, ffn 12): 2*64 + 2*8*4 = 192, 3*8*12 = 288, norms 16: 496;
  // outside: 80 + 8 + 80 = 168.
  CHECK(fsdp::layer_parameters(toy_llama()) == 496);
  fsdp::ParamCount llama = fsdp::count_parameters(toy_llama());
  CHECK(llama.per_layer == 496);
  CHECK(llama.other == 168);
  CHECK(llama.total() == 1160);
  // The published totals (Hugging Face's parameter counts of the Llama 2 checkpoints; GPT-3's "1.3B").
  CHECK(fsdp::count_parameters(shape_named("GPT-3 1.3B")).total() == 1315723264);
  CHECK(fsdp::count_parameters(shape_named("Llama-2 7B")).total() == 6738415616);
  CHECK(fsdp::count_parameters(shape_named("Llama-2 13B")).total() == 13015864320);
  fsdp::ParamCount l70 = fsdp::count_parameters(shape_named("Llama-2 70B"));
  CHECK(l70.per_layer == 855654400);
  CHECK(l70.other == 524296192);
  CHECK(l70.total() == 68976648192);
}

TEST_CASE("[step7] the ZeRO paper's figure 1: 7.5B parameters on 64 GPUs, K = 12") {
  // Rajbhandari et al. 2020, figure 1: 120 GB, 31.4 GB, 16.6 GB and 1.9 GB per GPU.
  fsdp::ParamCount count;
  count.layers = 1;
  count.per_layer = 7500000000;
  CHECK(kept(fsdp::model_state_bytes(count, fsdp::Strategy::kDdp, 64)) == 120000000000);
  CHECK(kept(fsdp::model_state_bytes(count, fsdp::Strategy::kZero1, 64)) == 31406250000);
  CHECK(kept(fsdp::model_state_bytes(count, fsdp::Strategy::kZero2, 64)) == 16640625000);
  CHECK(kept(fsdp::model_state_bytes(count, fsdp::Strategy::kFullShard, 64)) == 1875000000);
}

TEST_CASE("[step7] bytes per GPU of every strategy for the round 7B model on 8 GPUs, piece by piece") {
  const fsdp::ParamCount m = round_7b();
  CHECK(fsdp::sharded_elements(m, 8) == 875000000);
  fsdp::StateBytes ddp = fsdp::model_state_bytes(m, fsdp::Strategy::kDdp, 8);
  CHECK(ddp.params == 14000000000);
  CHECK(ddp.grads == 14000000000);
  CHECK(ddp.optimizer == 84000000000);
  CHECK(ddp.working == 0);
  CHECK(ddp.total() == 112000000000);
  fsdp::StateBytes z1 = fsdp::model_state_bytes(m, fsdp::Strategy::kZero1, 8);
  CHECK(z1.params == 14000000000);
  CHECK(z1.grads == 14000000000);
  CHECK(z1.optimizer == 10500000000);
  CHECK(z1.working == 0);
  CHECK(z1.total() == 38500000000);
  fsdp::StateBytes z2 = fsdp::model_state_bytes(m, fsdp::Strategy::kZero2, 8);
  CHECK(z2.params == 14000000000);
  CHECK(z2.grads == 1750000000);
  CHECK(z2.optimizer == 10500000000);
  CHECK(z2.working == 500000000);  // one block's full bfloat16 gradient
  CHECK(z2.total() == 26750000000);
  fsdp::StateBytes full = fsdp::model_state_bytes(m, fsdp::Strategy::kFullShard, 8);
  CHECK(full.params == 1750000000);
  CHECK(full.grads == 1750000000);
  CHECK(full.optimizer == 10500000000);
  CHECK(full.working == 1500000000);  // two gathered blocks and one full gradient, 2 bytes each
  CHECK(full.total() == 15500000000);
}

TEST_CASE("[step7] around the node boundary and beyond: N = 1, 9 (padding per unit) and 64") {
  const fsdp::ParamCount m = round_7b();
  // N = 1: every strategy keeps all 16 bytes of every parameter, and nothing is gathered.
  CHECK(fsdp::sharded_elements(m, 1) == 7000000000);
  for (fsdp::Strategy s : fsdp::all_strategies()) {
    CAPTURE(fsdp::strategy_name(s));
    fsdp::StateBytes one = fsdp::model_state_bytes(m, s, 1);
    CHECK(one.total() == 112000000000);
    CHECK(one.working == 0);
  }
  // N = 9: 250e6 / 9 rounds up to 27,777,778 per block: 28 x 27,777,778 = 777,777,784 elements, not 777,777,778.
  CHECK(fsdp::sharded_elements(m, 9) == 777777784);
  CHECK(fsdp::model_state_bytes(m, fsdp::Strategy::kDdp, 9).total() == 112000000000);
  CHECK(fsdp::model_state_bytes(m, fsdp::Strategy::kZero1, 9).total() == 37333333408);
  CHECK(fsdp::model_state_bytes(m, fsdp::Strategy::kZero2, 9).total() == 25388888976);
  CHECK(fsdp::model_state_bytes(m, fsdp::Strategy::kFullShard, 9).total() == 13944444544);
  // N = 64.
  CHECK(fsdp::sharded_elements(m, 64) == 109375000);
  CHECK(fsdp::model_state_bytes(m, fsdp::Strategy::kZero1, 64).total() == 29312500000);
  CHECK(fsdp::model_state_bytes(m, fsdp::Strategy::kZero2, 64).total() == 16031250000);
  CHECK(fsdp::model_state_bytes(m, fsdp::Strategy::kFullShard, 64).total() == 3250000000);
  // The unit outside the blocks is padded on its own, and the working set counts the larger unit.
  fsdp::ParamCount mixed;
  mixed.layers = 2;
  mixed.per_layer = 10;
  mixed.other = 13;
  CHECK(fsdp::sharded_elements(mixed, 4) == 2 * 3 + 4);
  fsdp::StateBytes full = fsdp::model_state_bytes(mixed, fsdp::Strategy::kFullShard, 4);
  CHECK(full.params == 2 * 10);
  CHECK(full.working == 6 * 13);
  CHECK(fsdp::model_state_bytes(mixed, fsdp::Strategy::kZero2, 4).working == 2 * 13);
}

TEST_CASE("[step7] activations counted from the block's own tensors, with and without checkpointing") {
  // Toy GPT (s 3, b 1, h 4, a 2, kv width 4, ffn 16): sbh = 12, a block 14 * 12 + 4 * 12 + 4 * 3 * 16 + 5 * 2 * 9 =
  // 168 + 48 + 192 + 90 = 498 (= 34 * 12 + 5 * 2 * 9); two blocks 996; checkpointed, two inputs of 2 * 12 and one
  // block recomputed: 48 + 498 = 546.
  CHECK(fsdp::activation_bytes(toy_gpt(), false) == 996);
  CHECK(fsdp::activation_bytes(toy_gpt(), true) == 546);
  fsdp::TransformerShape two = toy_gpt();
  two.micro_batch = 2;  // everything doubles: a block 996
  CHECK(fsdp::activation_bytes(two, false) == 1992);
  CHECK(fsdp::activation_bytes(two, true) == 96 + 996);
  // GPT with an MLP of 12, not 4h = 16: GeLU's two tensors are 2 * 3 * 12 bytes each: 168 + 48 + 144 + 90 = 450.
  fsdp::TransformerShape narrow = toy_gpt();
  narrow.ffn = 12;
  CHECK(fsdp::activation_bytes(narrow, false) == 2 * 450);
  CHECK(fsdp::activation_bytes(narrow, true) == 48 + 450);
  // GPT with 1 key/value head for 2 heads: K and V are 2 wide, 2 * 3 * 2 bytes each: 168 + 24 + 192 + 90 = 474.
  fsdp::TransformerShape grouped = toy_gpt();
  grouped.kv_heads = 1;
  CHECK(fsdp::activation_bytes(grouped, false) == 2 * 474);
  // Toy Llama (s 3, b 1, h 8, a 4, 2 kv heads: kv width 4, ffn 12), no dropout: 12 * 24 + 4 * 3 * 4 + 8 * 3 * 12 +
  // 2 * 4 * 9 = 288 + 48 + 288 + 72 = 696 a block; two 1,392; checkpointed 2 * 2 * 24 + 696 = 792.
  CHECK(fsdp::activation_bytes(toy_llama(), false) == 1392);
  CHECK(fsdp::activation_bytes(toy_llama(), true) == 792);
  fsdp::TransformerShape full_kv = toy_llama();
  full_kv.kv_heads = 4;  // K and V 8 wide: 288 + 96 + 288 + 72 = 744
  CHECK(fsdp::activation_bytes(full_kv, false) == 2 * 744);
  fsdp::TransformerShape llama_two = toy_llama();
  llama_two.micro_batch = 2;  // everything doubles
  CHECK(fsdp::activation_bytes(llama_two, false) == 2 * 1392);
  // Llama-2 7B, one sequence of 4096 (kv width 4096, ffn 11008): a block 12 * 4096^2 + 4 * 4096^2 + 8 * 4096 * 11008
  // + 2 * 32 * 4096^2 = 201,326,592 + 67,108,864 + 360,710,144 + 1,073,741,824 = 1,702,887,424 bytes.
  const fsdp::TransformerShape l7 = shape_named("Llama-2 7B");
  CHECK(fsdp::activation_bytes(l7, false) == 32 * int64_t{1702887424});
  CHECK(fsdp::activation_bytes(l7, false) == 54492397568);
  CHECK(fsdp::activation_bytes(l7, true) == 2776629248);
  // Llama-2 70B (8 kv heads of 128: kv width 1024, ffn 28672): 12 * 4096 * 8192 + 4 * 4096 * 1024 +
  // 8 * 4096 * 28672 + 2 * 64 * 4096^2 = 402,653,184 + 16,777,216 + 939,524,096 + 2,147,483,648 = 3,506,438,144.
  CHECK(fsdp::activation_bytes(shape_named("Llama-2 70B"), false) == 80 * int64_t{3506438144});
}

TEST_CASE("[step7] a GPT block with ffn = 4h and kv_heads = heads saves Korthikanti et al.'s 34 s b h + 5 a s^2 b") {
  std::vector<fsdp::TransformerShape> shapes = {toy_gpt(), shape_named("GPT-3 1.3B")};
  shapes.push_back({"GPT, 3 heads of 4", fsdp::Family::kGpt, 3, 12, 3, 3, 48, 10, 7, 2});
  shapes.push_back({"GPT, 1 head", fsdp::Family::kGpt, 1, 6, 1, 1, 24, 10, 5, 3});
  for (const fsdp::TransformerShape& s : shapes) {
    CAPTURE(s.name);
    REQUIRE(s.ffn == 4 * s.hidden);
    REQUIRE(s.kv_heads == s.heads);
    const int64_t sbh = s.sequence * s.micro_batch * s.hidden;
    const int64_t eq1 = 34 * sbh + 5 * s.heads * s.sequence * s.sequence * s.micro_batch;
    CHECK(fsdp::activation_bytes(s, false) == s.layers * eq1);
    CHECK(fsdp::activation_bytes(s, true) == s.layers * 2 * sbh + eq1);
  }
  // GPT-3 1.3B: 24 x (34 x 2048^2 + 5 x 16 x 2048^2) = 24 x 478,150,656.
  CHECK(fsdp::activation_bytes(shape_named("GPT-3 1.3B"), false) == 11475615744);
}

TEST_CASE("[step7] bytes on the wire per step: 2 rings for DDP, ZeRO-1 and ZeRO-2, 3 for full sharding") {
  const fsdp::ParamCount m = round_7b();
  for (fsdp::Strategy s : fsdp::all_strategies()) {
    CAPTURE(fsdp::strategy_name(s));
    CHECK(fsdp::comm_bytes_per_step(m, s, 1) == 0);
  }
  // N = 8: one ring is 7 x 875e6 x 2 bytes = 12.25e9.
  CHECK(fsdp::comm_bytes_per_step(m, fsdp::Strategy::kDdp, 8) == 24500000000);
  CHECK(fsdp::comm_bytes_per_step(m, fsdp::Strategy::kZero1, 8) == 24500000000);
  CHECK(fsdp::comm_bytes_per_step(m, fsdp::Strategy::kZero2, 8) == 24500000000);
  CHECK(fsdp::comm_bytes_per_step(m, fsdp::Strategy::kFullShard, 8) == 36750000000);
  // N = 9: padded chunks, 8 x 777,777,784 x 2 per ring.
  CHECK(fsdp::comm_bytes_per_step(m, fsdp::Strategy::kDdp, 9) == 24888889088);
  CHECK(fsdp::comm_bytes_per_step(m, fsdp::Strategy::kFullShard, 9) == 37333333632);
  // N = 64: 63 x 109,375,000 x 2 per ring.
  CHECK(fsdp::comm_bytes_per_step(m, fsdp::Strategy::kZero2, 64) == 27562500000);
  CHECK(fsdp::comm_bytes_per_step(m, fsdp::Strategy::kFullShard, 64) == 41343750000);
}

TEST_CASE("[step7] napkin seconds: NVLink inside a node of 8, 400 Gb/s = 50e9 bytes/s beyond it") {
  const fsdp::Cluster h200;
  CHECK(fsdp::comm_seconds(0, 8, h200) == 0.0);
  CHECK(fsdp::comm_seconds(24500000000, 8, h200) == doctest::Approx(24.5 / 450).epsilon(1e-12));
  CHECK(fsdp::comm_seconds(36750000000, 8, h200) == doctest::Approx(36.75 / 450).epsilon(1e-12));
  CHECK(fsdp::comm_seconds(36750000000, 1, h200) == doctest::Approx(36.75 / 450).epsilon(1e-12));
  CHECK(fsdp::comm_seconds(24888889088, 9, h200) == doctest::Approx(0.49777778176).epsilon(1e-12));
  CHECK(fsdp::comm_seconds(41343750000, 64, h200) == doctest::Approx(0.826875).epsilon(1e-12));
  fsdp::Cluster nodes_of_4;
  nodes_of_4.gpus_per_node = 4;
  CHECK(fsdp::comm_seconds(50000000000, 4, nodes_of_4) == doctest::Approx(50.0 / 450).epsilon(1e-12));
  CHECK(fsdp::comm_seconds(50000000000, 5, nodes_of_4) == doctest::Approx(1.0).epsilon(1e-12));
}

TEST_CASE("[step7] the verdict: Llama-2 7B on 8 H200s, and the budget at and just below the total") {
  const fsdp::TransformerShape l7 = shape_named("Llama-2 7B");
  const fsdp::Cluster h200;
  CHECK(h200.gpu_bytes == 141000000000);
  // Full sharding: 16 x 842,301,952 + 6 x 262,148,096 (the embedding-and-head unit is the largest) = 15,049,719,808.
  fsdp::Fit full = fsdp::what_fits(l7, fsdp::Strategy::kFullShard, 8, true, h200);
  CHECK(full.state.total() == 15049719808);
  CHECK(full.activations == 2776629248);
  CHECK(full.total == 17826349056);
  CHECK(full.fits);
  CHECK(full.comm_bytes == 3 * 7 * int64_t{842301952} * 2);
  CHECK(full.comm_s == doctest::Approx(3 * 7 * 842301952.0 * 2 / 450e9).epsilon(1e-12));
  CHECK(fsdp::what_fits(l7, fsdp::Strategy::kFullShard, 8, false, h200).total == 69542117376);
  CHECK(fsdp::what_fits(l7, fsdp::Strategy::kFullShard, 8, false, h200).fits);
  // DDP: 16 x 6,738,415,616 = 107,814,649,856 of state; with every activation it does not fit, checkpointed it does.
  fsdp::Fit ddp = fsdp::what_fits(l7, fsdp::Strategy::kDdp, 8, false, h200);
  CHECK(ddp.total == 162307047424);
  CHECK_FALSE(ddp.fits);
  fsdp::Fit ddp_ckpt = fsdp::what_fits(l7, fsdp::Strategy::kDdp, 8, true, h200);
  CHECK(ddp_ckpt.total == 110591279104);
  CHECK(ddp_ckpt.fits);
  // At the budget it fits; one byte less and it does not.
  fsdp::Cluster tight;
  tight.gpu_bytes = full.total;
  CHECK(fsdp::what_fits(l7, fsdp::Strategy::kFullShard, 8, true, tight).fits);
  tight.gpu_bytes = full.total - 1;
  CHECK_FALSE(fsdp::what_fits(l7, fsdp::Strategy::kFullShard, 8, true, tight).fits);
  // Llama-2 70B does not fit on 8 even fully sharded, and does on 64 when checkpointed.
  const fsdp::TransformerShape l70 = shape_named("Llama-2 70B");
  CHECK_FALSE(fsdp::what_fits(l70, fsdp::Strategy::kFullShard, 8, true, h200).fits);
  CHECK(fsdp::what_fits(l70, fsdp::Strategy::kFullShard, 64, true, h200).fits);
  CHECK_FALSE(fsdp::what_fits(l70, fsdp::Strategy::kFullShard, 64, false, h200).fits);
}

// A toy Llama of 5 blocks: one block of b sequences saves 12 s b h + 4 s b kv + 8 s b ffn + 2 a s^2 b =
// (288 + 48 + 288 + 72) b = 696 b bytes, its input 2 s b h = 48 b.
fsdp::TransformerShape toy_llama_5() {
  fsdp::TransformerShape s = toy_llama();
  s.layers = 5;
  return s;
}

TEST_CASE("[step7] a lesson 4 recipe's peak: segments, micro-batch and float32 on a toy of 5 blocks") {
  const fsdp::TransformerShape toy = toy_llama_5();
  for (auto strategy : {fsdp::Strategy::kDdp, fsdp::Strategy::kFullShard}) {
    for (int gpus : {1, 2, 3}) {
      CAPTURE(fsdp::strategy_name(strategy));
      CAPTURE(gpus);
      // The state is model_state_bytes' total, working buffers included.
      const int64_t state = fsdp::model_state_bytes(fsdp::count_parameters(toy), strategy, gpus).total();
      const auto activations = [&](int64_t micro, int64_t segments, bool low) {
        return fsdp::recipe_peak_bytes(toy, strategy, gpus, 4, mem::Recipe{micro, segments, low}) - state;
      };
      // b = 2 of a batch of 4, 16-bit: no checkpointing keeps all 5 blocks, 5 x 1,392 = 6,960.
      CHECK(activations(2, 1, true) == 6960);
      // 2 segments (3 + 2 blocks): 1 kept input of 96 and the larger segment, 3 blocks: 96 + 4,176.
      CHECK(activations(2, 2, true) == 4272);
      // 3 segments (2 + 2 + 1): 2 inputs, 2 blocks: 192 + 2,784.
      CHECK(activations(2, 3, true) == 2976);
      // 5 segments of one block: 4 inputs and one block, one input fewer than activation_bytes' checkpointing.
      CHECK(activations(2, 5, true) == 1776);
      fsdp::TransformerShape two = toy;
      two.micro_batch = 2;
      CHECK(activations(2, 5, true) == fsdp::activation_bytes(two, true) - 96);
      CHECK(activations(2, 1, true) == fsdp::activation_bytes(two, false));
      // float32 activations: twice the bytes; micro-batch 0: the whole batch of 4 at once.
      CHECK(activations(2, 3, false) == 2 * 2976);
      CHECK(activations(0, 1, true) == 5 * 696 * 4);
      CHECK(activations(4, 1, true) == 5 * 696 * 4);
      CHECK(activations(1, 2, false) == 2 * (48 + 3 * 696));
    }
  }
  // shape.micro_batch plays no part: the recipe says how many sequences go through at once.
  fsdp::TransformerShape other = toy;
  other.micro_batch = 3;
  CHECK(fsdp::recipe_peak_bytes(other, fsdp::Strategy::kDdp, 2, 4, mem::Recipe{2, 3, true}) ==
        fsdp::recipe_peak_bytes(toy, fsdp::Strategy::kDdp, 2, 4, mem::Recipe{2, 3, true}));
}

TEST_CASE("[step7] lesson 4's planner on the napkin: Llama-2 7B, 8 sequences per GPU, by hand on the page") {
  const fsdp::TransformerShape l7 = shape_named("Llama-2 7B");
  const fsdp::Cluster h200;
  // Full sharding on 8: 15,049,719,808 of state; b = 8: a block 8 x 1,702,887,424 = 13,623,099,392, an input
  // 2 x 4096 x 8 x 4096 = 268,435,456; 6 segments (round(sqrt(32))): 5 inputs and 6 blocks.
  const mem::Plan plan = fsdp::plan_cell(l7, fsdp::Strategy::kFullShard, 8, 8, h200);
  CHECK(plan.recipe.micro_batch == 0);  // all 8 sequences at once
  CHECK(plan.recipe.segments == 6);
  CHECK(plan.recipe.low_precision);
  CHECK(plan.peak_bytes == 15049719808 + 5 * int64_t{268435456} + 6 * int64_t{13623099392});
  CHECK(plan.peak_bytes == 98130493440);
  CHECK(plan.peak_bytes == fsdp::recipe_peak_bytes(l7, fsdp::Strategy::kFullShard, 8, 8, plan.recipe));
  // The least-memory recipe first, then the 4 of micro-batch 8 in order: 5 probes.
  CHECK(plan.probes == 5);
  // At that budget the same plan; one byte less and float32 at b = 4 costs exactly as much (twice the bytes of
  // half the sequences), so the planner goes on to 16-bit at b = 4: 15,049,719,808 + 5 x 134,217,728 +
  // 6 x 6,811,549,696 = 56,590,106,624, after 9 probes.
  fsdp::Cluster tight;
  tight.gpu_bytes = plan.peak_bytes;
  CHECK(fsdp::plan_cell(l7, fsdp::Strategy::kFullShard, 8, 8, tight).recipe.micro_batch == 0);
  tight.gpu_bytes = plan.peak_bytes - 1;
  const mem::Plan smaller = fsdp::plan_cell(l7, fsdp::Strategy::kFullShard, 8, 8, tight);
  CHECK(smaller.recipe.micro_batch == 4);
  CHECK(smaller.recipe.segments == 6);
  CHECK(smaller.recipe.low_precision);
  CHECK(smaller.peak_bytes == 56590106624);
  CHECK(smaller.probes == 9);
  CHECK(fsdp::recipe_peak_bytes(l7, fsdp::Strategy::kFullShard, 8, 8, mem::Recipe{4, 6, false}) == plan.peak_bytes);
  // DDP on 8 keeps 107,814,649,856 of state: two sequences at a time fit, checkpointed.
  const mem::Plan ddp = fsdp::plan_cell(l7, fsdp::Strategy::kDdp, 8, 8, h200);
  CHECK(ddp.recipe.micro_batch == 2);
  CHECK(ddp.recipe.segments == 6);
  CHECK(ddp.recipe.low_precision);
  CHECK(ddp.peak_bytes == 107814649856 + 5 * int64_t{67108864} + 6 * int64_t{3405774848});
  // Llama-2 13B replicated: no recipe fits, and the error says so.
  CHECK_THROWS_WITH(fsdp::plan_cell(shape_named("Llama-2 13B"), fsdp::Strategy::kDdp, 8, 8, h200),
                    Contains("no recipe fits the budget"));
}

TEST_CASE("[step7] bad input is refused by name") {
  const fsdp::ParamCount m = round_7b();
  const fsdp::Cluster h200;
  CHECK_THROWS_WITH(fsdp::sharded_elements(m, 0), Contains("gpus must be > 0"));
  CHECK_THROWS_WITH(fsdp::sharded_elements(m, -8), Contains("gpus must be > 0"));
  CHECK_THROWS_WITH(fsdp::model_state_bytes(m, fsdp::Strategy::kFullShard, 0), Contains("gpus must be > 0"));
  CHECK_THROWS_WITH(fsdp::comm_bytes_per_step(m, fsdp::Strategy::kDdp, 0), Contains("gpus must be > 0"));
  CHECK_THROWS_WITH(fsdp::comm_seconds(1, 0, h200), Contains("gpus must be > 0"));
  fsdp::ParamCount negative = m;
  negative.per_layer = -1;
  CHECK_THROWS_WITH(fsdp::sharded_elements(negative, 8), Contains("parameter counts must be >= 0"));
  negative = m;
  negative.other = -1;
  CHECK_THROWS_WITH(fsdp::model_state_bytes(negative, fsdp::Strategy::kDdp, 8),
                    Contains("parameter counts must be >= 0"));
  const auto unknown = static_cast<fsdp::Strategy>(7);
  CHECK_THROWS_WITH(fsdp::model_state_bytes(m, unknown, 8), Contains("unknown strategy"));
  CHECK_THROWS_WITH(fsdp::comm_bytes_per_step(m, unknown, 8), Contains("unknown strategy"));
  CHECK_THROWS_WITH(fsdp::comm_seconds(-1, 8, h200), Contains("bytes must be >= 0"));
  fsdp::Cluster no_link;
  no_link.network_gigabits_per_s = 0;
  CHECK_THROWS_WITH(fsdp::comm_seconds(1, 16, no_link), Contains("bandwidth must be > 0"));
  no_link = h200;
  no_link.nvlink_gigabytes_per_s = -1;
  CHECK_THROWS_WITH(fsdp::comm_seconds(1, 16, no_link), Contains("bandwidth must be > 0"));
  fsdp::Cluster no_memory;
  no_memory.gpu_bytes = 0;
  CHECK_THROWS_WITH(fsdp::what_fits(toy_gpt(), fsdp::Strategy::kDdp, 8, true, no_memory),
                    Contains("gpu_bytes must be > 0"));
  // Each size of the shape, by name.
  const std::vector<std::pair<std::string, int64_t fsdp::TransformerShape::*>> sizes = {
      {"layers", &fsdp::TransformerShape::layers},     {"hidden", &fsdp::TransformerShape::hidden},
      {"heads", &fsdp::TransformerShape::heads},       {"kv_heads", &fsdp::TransformerShape::kv_heads},
      {"ffn", &fsdp::TransformerShape::ffn},           {"vocab", &fsdp::TransformerShape::vocab},
      {"sequence", &fsdp::TransformerShape::sequence}, {"micro_batch", &fsdp::TransformerShape::micro_batch}};
  for (const auto& size : sizes) {
    const std::string name = size.first;
    const auto field = size.second;
    CAPTURE(name);
    for (int64_t bad : {int64_t{0}, int64_t{-4}}) {
      fsdp::TransformerShape s = toy_llama();
      s.*field = bad;
      CHECK_THROWS_WITH(fsdp::layer_parameters(s), Contains((name + " must be > 0").c_str()));
      CHECK_THROWS_WITH(fsdp::count_parameters(s), Contains((name + " must be > 0").c_str()));
      CHECK_THROWS_WITH(fsdp::activation_bytes(s, true), Contains((name + " must be > 0").c_str()));
      CHECK_THROWS_WITH(fsdp::what_fits(s, fsdp::Strategy::kDdp, 8, true, h200),
                        Contains((name + " must be > 0").c_str()));
    }
  }
  // Lesson 4's recipe, by name; and the planner's own refusals come through plan_cell.
  const fsdp::TransformerShape toy = toy_llama_5();
  CHECK_THROWS_WITH(fsdp::recipe_peak_bytes(toy, fsdp::Strategy::kDdp, 2, 0, mem::Recipe{0, 1, true}),
                    Contains("batch must be > 0"));
  for (int64_t micro : {int64_t{-1}, int64_t{5}}) {
    CHECK_THROWS_WITH(fsdp::recipe_peak_bytes(toy, fsdp::Strategy::kDdp, 2, 4, mem::Recipe{micro, 1, true}),
                      Contains("micro_batch must be in [0, batch]"));
  }
  for (int64_t segments : {int64_t{0}, int64_t{6}}) {
    CHECK_THROWS_WITH(fsdp::recipe_peak_bytes(toy, fsdp::Strategy::kDdp, 2, 4, mem::Recipe{1, segments, true}),
                      Contains("segments must be in [1, layers]"));
  }
  CHECK_THROWS_WITH(fsdp::recipe_peak_bytes(toy, fsdp::Strategy::kDdp, 0, 4, mem::Recipe{1, 1, true}),
                    Contains("gpus must be > 0"));
  CHECK_THROWS_WITH(fsdp::recipe_peak_bytes(toy, unknown, 2, 4, mem::Recipe{1, 1, true}), Contains("unknown strategy"));
  fsdp::TransformerShape flat = toy;
  flat.layers = 0;
  CHECK_THROWS_WITH(fsdp::recipe_peak_bytes(flat, fsdp::Strategy::kDdp, 2, 4, mem::Recipe{1, 1, true}),
                    Contains("layers must be > 0"));
  CHECK_THROWS_WITH(fsdp::plan_cell(toy, fsdp::Strategy::kDdp, 2, 0, h200), Contains("batch must be"));
  CHECK_THROWS_WITH(fsdp::plan_cell(toy, fsdp::Strategy::kDdp, 2, 4, no_memory), Contains("budget_bytes must be > 0"));
  // The shape's rules between its sizes, and its family, at every function that takes a shape.
  std::vector<std::pair<fsdp::TransformerShape, std::string>> bad;
  fsdp::TransformerShape s = toy_llama();
  s.heads = 3;  // of hidden 8
  bad.emplace_back(s, "heads must divide hidden");
  s = toy_llama();
  s.kv_heads = 3;  // of 4 heads
  bad.emplace_back(s, "kv_heads must divide heads");
  s.kv_heads = 8;  // more key/value heads than heads
  bad.emplace_back(s, "kv_heads must divide heads");
  s = toy_gpt();
  s.family = static_cast<fsdp::Family>(2);
  bad.emplace_back(s, "unknown family");
  s.family = static_cast<fsdp::Family>(-1);
  bad.emplace_back(s, "unknown family");
  for (const auto& shape_and_message : bad) {
    const fsdp::TransformerShape& shape = shape_and_message.first;
    const char* message = shape_and_message.second.c_str();
    CAPTURE(shape_and_message.second);
    CHECK_THROWS_WITH(fsdp::layer_parameters(shape), Contains(message));
    CHECK_THROWS_WITH(fsdp::count_parameters(shape), Contains(message));
    CHECK_THROWS_WITH(fsdp::activation_bytes(shape, false), Contains(message));
    CHECK_THROWS_WITH(fsdp::activation_bytes(shape, true), Contains(message));
    CHECK_THROWS_WITH(fsdp::what_fits(shape, fsdp::Strategy::kFullShard, 8, true, h200), Contains(message));
    CHECK_THROWS_WITH(fsdp::recipe_peak_bytes(shape, fsdp::Strategy::kDdp, 2, 4, mem::Recipe{1, 1, true}),
                      Contains(message));
    CHECK_THROWS_WITH(fsdp::plan_cell(shape, fsdp::Strategy::kDdp, 2, 4, h200), Contains(message));
  }
}
