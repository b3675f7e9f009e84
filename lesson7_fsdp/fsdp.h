// Lesson 7 — Fully sharded data parallel: the API you implement. Steps, background and hints: lesson7_fsdp/README.md.
//
// Every rank keeps 1/N of each layer's parameters (a slice of one flat, padded buffer), gathers a layer's full
// parameters just before the layer runs and frees them after, and turns the layer's gradient into its own
// slice of the average at once (a reduce-scatter). The collectives are rings of Gloo's point-to-point
// send/recv through lesson 5's counting communicator (dist::Comm), so every byte is counted.
#pragma once

#include <cstdint>
#include <functional>
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
/// "elements, but" (full is not N x shard: "full has 10 elements, but 2 ranks x 4 need 8").
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

}  // namespace fsdp
