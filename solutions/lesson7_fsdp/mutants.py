"""Lesson 7's mutants: plausible mistakes in the reference solution that its checks must catch
(tools/mutants/run.sh applies each one and runs the lesson's solution checks)."""

SOLUTION = "solutions/lesson7_fsdp/fsdp.cc"

MUTANTS = [
    # Step 1: the rings.
    ("l7_shard_numel_rounds_down", SOLUTION,
     "return (numel + world_size - 1) / world_size;", "return numel / world_size;",
     "the shard size rounds down: the last elements of a size N does not divide are dropped"),
    ("l7_rs_ring_off_by_one", SOLUTION,
     "travelling = chunk_of(flat, mod(r - 2 - step, n), size) + received;",
     "travelling = chunk_of(flat, mod(r - 1 - step, n), size) + received;",
     "reduce-scatter: the chunk added to what arrived is one round off"),
    ("l7_rs_starts_with_own_chunk", SOLUTION,
     "at::Tensor travelling = chunk_of(flat, mod(r - 1, n), size).clone();",
     "at::Tensor travelling = chunk_of(flat, r, size).clone();",
     "reduce-scatter: the ring starts with the rank's own chunk instead of chunk r - 1"),
    ("l7_rs_one_round_short", SOLUTION,
     "  for (int64_t step = 0; step < n - 1; ++step) {\n    dist::AsyncWork recv = comm.recv_async(received,",
     "  for (int64_t step = 0; step < n - 2; ++step) {\n    dist::AsyncWork recv = comm.recv_async(received,",
     "reduce-scatter: one round too few (right for N = 2 only)"),
    ("l7_ag_recv_wrong_slot", SOLUTION,
     "comm.recv_async(chunk_of(flat, mod(r - 1 - step, n), size), left,",
     "comm.recv_async(chunk_of(flat, mod(r + 1 + step, n), size), left,",
     "all-gather: the chunk that arrives is stored in the wrong place (right for N = 2 only)"),
    ("l7_ag_sends_own_every_round", SOLUTION,
     "comm.send_async(chunk_of(flat, mod(r - step, n), size), right,",
     "comm.send_async(chunk_of(flat, r, size), right,",
     "all-gather: every round sends the rank's own chunk instead of the one it got last"),
    ("l7_no_dtype_check", SOLUTION,
     "  TORCH_CHECK(full.scalar_type() == shard.scalar_type(), op,",
     "  TORCH_CHECK(true || full.scalar_type() == shard.scalar_type(), op,",
     "mixed dtypes are not refused by name"),
    ("l7_padding_dropped", SOLUTION,
     "  const int64_t size = shard_numel(tensor.numel(), comm.world_size());\n",
     "  const int64_t size = tensor.numel() / comm.world_size();\n",
     "reduce_scatter does not pad: a size N does not divide loses its tail"),
]
