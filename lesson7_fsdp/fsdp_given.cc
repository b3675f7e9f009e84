// Lesson 7 — given code (not an exercise), compiled into both the skeleton and the reference solution: the
// agreement every rank makes before it gathers a layer (step 3 calls it; fsdp.h says what it checks and throws).
// It is plumbing, not FSDP: ranks that would meet in different rings fail at once, by name, on every rank.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/Functions.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include "lesson7_fsdp/fsdp.h"

namespace fsdp {

// [agree_on_layer]
namespace {

// What a rank found wrong with its own arguments: it goes into the record, so that every rank throws it.
enum LayerError : int64_t { kLayerOk = 0, kOtherRank = 1, kShardNotLeaf = 2, kBadParamDtype = 3, kBadReduceDtype = 4 };

// A fingerprint of one layer's parameter shapes (FNV-1a over the dimensions).
int64_t shapes_fingerprint(const FlatParam& flat) {
  uint64_t h = 1469598103934665603ull;
  const auto mix = [&h](int64_t v) { h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull; };
  for (const auto& shape : flat.shapes) {
    mix(static_cast<int64_t>(shape.size()));
    for (const int64_t d : shape) mix(d);
  }
  return static_cast<int64_t>(h >> 1);
}

// A record: {phase (1 forward, 2 backward), flat.rank, flat.world_size, numel, fingerprint, param dtype, reduce
// dtype, error}.
std::string layer_call(const std::vector<int64_t>& rec) {
  return c10::str(rec[0] == 2 ? "the backward" : "the forward", " of a layer of ", rec[3], " elements (shapes #",
                  rec[4] % 10000, "), gathered in ", static_cast<at::ScalarType>(rec[5]), ", reduced in ",
                  static_cast<at::ScalarType>(rec[6]));
}

std::string layer_error(const std::vector<int64_t>& rec, size_t rank, int world_size) {
  switch (rec[7]) {
    case kOtherRank:
      return c10::str("the FlatParam was made for rank ", rec[1], " of ", rec[2], ", but this is rank ", rank, " of ",
                      world_size);
    case kShardNotLeaf:
      return "the layer's shard must be a leaf that requires grad (flatten_and_shard makes it one)";
    case kBadParamDtype:
      return c10::str("MixedPrecision: param_dtype must be float32, bfloat16 or float16, got ",
                      static_cast<at::ScalarType>(rec[5]));
    default:
      return c10::str("MixedPrecision: reduce_dtype must be float32 or the param_dtype (",
                      static_cast<at::ScalarType>(rec[5]), "), got ", static_cast<at::ScalarType>(rec[6]));
  }
}

}  // namespace

void agree_on_layer(dist::Comm& comm, const FlatParam& flat, bool backward, at::ScalarType param_dtype,
                    at::ScalarType reduce_dtype) {
  // This rank's own findings go into its record, not into a throw of its own: its peers would wait here for it.
  int64_t error = kLayerOk;
  if (flat.rank != comm.rank() || flat.world_size != comm.world_size()) {
    error = kOtherRank;
  } else if (!backward && !(flat.shard.defined() && flat.shard.is_leaf() && flat.shard.requires_grad())) {
    error = kShardNotLeaf;
  } else if (param_dtype != at::kFloat && param_dtype != at::kBFloat16 && param_dtype != at::kHalf) {
    error = kBadParamDtype;
  } else if (reduce_dtype != at::kFloat && reduce_dtype != param_dtype) {
    error = kBadReduceDtype;
  }
  const std::vector<int64_t> mine{backward ? 2 : 1,
                                  flat.rank,
                                  flat.world_size,
                                  flat.numel,
                                  shapes_fingerprint(flat),
                                  static_cast<int64_t>(param_dtype),
                                  static_cast<int64_t>(reduce_dtype),
                                  error};
  std::vector<std::vector<int64_t>> all;
  for (const at::Tensor& t : comm.all_gather(at::tensor(mine, at::kLong))) {
    const at::Tensor c = t.contiguous();
    all.emplace_back(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  }
  for (size_t r = 0; r < all.size(); ++r) {
    TORCH_CHECK(all[r][7] == kLayerOk, "agree_on_layer: on rank ", r, ": ", layer_error(all[r], r, comm.world_size()));
  }
  // The same call everywhere: every slot but the FlatParam's rank (slot 1) is the same on every rank.
  bool same = true;
  for (const auto& rec : all) {
    for (size_t i = 0; i < rec.size(); ++i) same = same && (i == 1 || rec[i] == all[0][i]);
  }
  if (same) return;
  std::string ranks;
  for (size_t r = 0; r < all.size(); ++r) ranks += c10::str(r ? "; " : "", "rank ", r, ": ", layer_call(all[r]));
  TORCH_CHECK(false, "agree_on_layer: the ranks disagree on the layer they are about to gather (", ranks,
              "): every rank must run the same layers in the same order, in the same dtypes, and backpropagate "
              "through each of them (a layer that one rank's loss skips gets no gradient there)");
}
// [agree_on_layer]

}  // namespace fsdp
