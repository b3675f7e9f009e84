// Lesson 7 — reference solution.
#include "lesson7_fsdp/fsdp.h"

#include <string>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>  // Tensor with its methods and operators (+, *, ...)
#include <c10/util/Exception.h>

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

}  // namespace fsdp
