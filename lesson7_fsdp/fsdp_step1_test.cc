// Checks for lesson 7, step 1: ring reduce-scatter and all-gather on point-to-point send/recv.
// Run: bazel test //lesson7_fsdp:fsdp_step1_test
#include "lesson7_fsdp/fsdp_test_helpers.h"

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/version.h>

#include "lesson5_distributed/comm.h"
#include "lesson7_fsdp/fsdp.h"

using fsdp_checks::Contains;
using fsdp_checks::launch;

namespace {

// Rank r's tensor of `numel` small integers (exact in float32, so sums in any order are equal).
at::Tensor rank_tensor(int r, int64_t numel) {
  return at::arange(numel, at::kFloat).remainder(7) + static_cast<double>(10 * (r + 1));
}

// The sum of every rank's tensor: what a reduce-scatter's shards make up.
at::Tensor summed(int n, int64_t numel) {
  at::Tensor sum = at::zeros({numel});
  for (int r = 0; r < n; ++r) sum += rank_tensor(r, numel);
  return sum;
}

}  // namespace

TEST_CASE("[step1] shard_numel rounds up") {
  CHECK(fsdp::shard_numel(8, 2) == 4);
  CHECK(fsdp::shard_numel(9, 2) == 5);
  CHECK(fsdp::shard_numel(10, 3) == 4);
  CHECK(fsdp::shard_numel(12, 3) == 4);
  CHECK(fsdp::shard_numel(13, 4) == 4);
  CHECK(fsdp::shard_numel(0, 4) == 0);
  CHECK(fsdp::shard_numel(5, 1) == 5);
  CHECK_THROWS_WITH(fsdp::shard_numel(4, 0), Contains("world_size must be > 0"));
  CHECK_THROWS_WITH(fsdp::shard_numel(-1, 2), Contains("numel must be >= 0"));
}

TEST_CASE("[step1] reduce_scatter_into: each rank gets its chunk of the sum, (N-1)/N of the bytes sent") {
  for (const int n : {2, 3, 4}) {
    const int64_t shard = 5;
    const at::Tensor sum = summed(n, n * shard);
    std::vector<at::Tensor> got(static_cast<size_t>(n));
    std::vector<dist::CommStats> stats(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const at::Tensor full = rank_tensor(comm.rank(), n * shard);
      const at::Tensor before = full.clone();
      at::Tensor out = at::zeros({shard});
      fsdp::reduce_scatter_into(comm, full, out);
      CHECK(at::equal(full, before));  // the input is not changed (every rank checks)
      got[static_cast<size_t>(comm.rank())] = out;
      stats[static_cast<size_t>(comm.rank())] = comm.stats();
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      CHECK(at::equal(got[static_cast<size_t>(r)], sum.narrow(0, r * shard, shard)));
      const dist::CommStats& s = stats[static_cast<size_t>(r)];
      CHECK(s.send_bytes == (n - 1) * shard * 4);  // (N - 1) / N x the full tensor's bytes
      CHECK(s.recv_bytes == (n - 1) * shard * 4);
      CHECK(s.send_calls == n - 1);
      CHECK(s.all_reduce_calls == 0);
      CHECK(s.all_gather_calls == 0);
    }
  }
}

TEST_CASE("[step1] beside the group's own reduce-scatter: the same shards; LibTorch 1.13's Gloo has none") {
  // 2.x's Gloo makes its reduce-scatter of an all-reduce (ProcessGroupGloo::reduce_scatter_tensor_coalesced): the
  // demo times the two side by side. Here: the ring's shards are the group's, and 1.13 refuses by name.
  for (const int n : {2, 3}) {
    const int64_t shard = 6;
    std::vector<at::Tensor> ring(static_cast<size_t>(n)), group(static_cast<size_t>(n));
    std::vector<std::string> refused(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const at::Tensor full = rank_tensor(comm.rank(), n * shard);
      CHECK_THROWS_WITH(comm.group_reduce_scatter(at::zeros({shard}), full.narrow(0, 0, shard + 1)),
                        Contains("input must have N x output.numel() elements"));
      at::Tensor mine = at::zeros({shard});
      fsdp::reduce_scatter_into(comm, full, mine);
      ring[static_cast<size_t>(comm.rank())] = mine;
      at::Tensor theirs = at::zeros({shard});
      try {
        comm.group_reduce_scatter(theirs, full);
        group[static_cast<size_t>(comm.rank())] = theirs;
      } catch (const c10::Error& error) {
        refused[static_cast<size_t>(comm.rank())] = error.what();
      }
    });
    const at::Tensor sum = summed(n, n * shard);
    for (int r = 0; r < n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      CHECK(at::equal(ring[static_cast<size_t>(r)], sum.narrow(0, r * shard, shard)));
#if TORCH_VERSION_MAJOR >= 2
      REQUIRE_MESSAGE(refused[static_cast<size_t>(r)].empty(), refused[static_cast<size_t>(r)]);
      CHECK(at::equal(group[static_cast<size_t>(r)], ring[static_cast<size_t>(r)]));
#else
      CHECK_MESSAGE(refused[static_cast<size_t>(r)].find("does not support") != std::string::npos,
                    refused[static_cast<size_t>(r)]);
#endif
    }
  }
}

TEST_CASE("[step1] all_gather_into: every rank gets every shard in rank order, (N-1)/N of the bytes sent") {
  for (const int n : {2, 3, 4}) {
    const int64_t shard = 3;
    std::vector<at::Tensor> got(static_cast<size_t>(n));
    std::vector<dist::CommStats> stats(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      at::Tensor full = at::full({n * shard}, -1.0);
      fsdp::all_gather_into(comm, rank_tensor(comm.rank(), shard), full);
      got[static_cast<size_t>(comm.rank())] = full;
      stats[static_cast<size_t>(comm.rank())] = comm.stats();
    });
    std::vector<at::Tensor> shards;
    for (int r = 0; r < n; ++r) shards.push_back(rank_tensor(r, shard));
    const at::Tensor expected = at::cat(shards);
    for (int r = 0; r < n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      CHECK(at::equal(got[static_cast<size_t>(r)], expected));
      CHECK(stats[static_cast<size_t>(r)].send_bytes == (n - 1) * shard * 4);
      CHECK(stats[static_cast<size_t>(r)].send_calls == n - 1);
    }
  }
}

TEST_CASE("[step1] reduce_scatter and all_gather pad sizes that N does not divide; the bytes are of the padded size") {
  for (const int n : {2, 3, 4}) {
    for (const int64_t numel : {int64_t{1}, int64_t{7}, int64_t{10}, int64_t{13}}) {
      const int64_t shard = fsdp::shard_numel(numel, n);
      const at::Tensor sum = summed(n, numel);
      at::Tensor padded_sum = at::zeros({n * shard});
      padded_sum.narrow(0, 0, numel).copy_(sum);
      std::vector<at::Tensor> shards(static_cast<size_t>(n)), gathered(static_cast<size_t>(n));
      std::vector<int64_t> sent(static_cast<size_t>(n));
      dist::run_ranks(launch(n), [&](dist::Comm& comm) {
        const at::Tensor mine = fsdp::reduce_scatter(comm, rank_tensor(comm.rank(), numel));
        shards[static_cast<size_t>(comm.rank())] = mine;
        gathered[static_cast<size_t>(comm.rank())] = fsdp::all_gather(comm, mine, numel);
        sent[static_cast<size_t>(comm.rank())] = comm.stats().send_bytes;
      });
      for (int r = 0; r < n; ++r) {
        CAPTURE(n);
        CAPTURE(numel);
        CAPTURE(r);
        REQUIRE(shards[static_cast<size_t>(r)].numel() == shard);
        CHECK(at::equal(shards[static_cast<size_t>(r)], padded_sum.narrow(0, r * shard, shard)));
        CHECK(at::equal(gathered[static_cast<size_t>(r)], sum));
        CHECK(sent[static_cast<size_t>(r)] == 2 * (n - 1) * shard * 4);  // two rings of the padded size
      }
    }
  }
}

TEST_CASE("[step1] one rank alone: the rings copy and send nothing") {
  dist::run_ranks(launch(1), [&](dist::Comm& comm) {
    const at::Tensor x = rank_tensor(0, 6);
    at::Tensor shard = at::zeros({6});
    fsdp::reduce_scatter_into(comm, x, shard);
    CHECK(at::equal(shard, x));
    at::Tensor full = at::zeros({6});
    fsdp::all_gather_into(comm, shard, full);
    CHECK(at::equal(full, x));
    CHECK(comm.stats().send_calls == 0);
  });
}

TEST_CASE("[step1] bad input is refused by name on every rank, before any traffic (no timeout)") {
  using fsdp_checks::check_fails_on_every_rank;
  check_fails_on_every_rank(
      2, [](dist::Comm& comm) { fsdp::reduce_scatter_into(comm, at::zeros({10}), at::zeros({4})); },
      "full has 10 elements, but 2 ranks x 4 need 8");
  check_fails_on_every_rank(
      3, [](dist::Comm& comm) { fsdp::all_gather_into(comm, at::zeros({4}), at::zeros({8})); }, "elements, but");
  check_fails_on_every_rank(
      2, [](dist::Comm& comm) { fsdp::reduce_scatter_into(comm, at::zeros({8}), at::zeros({4}, at::kDouble)); },
      "must have the same dtype");
  check_fails_on_every_rank(
      2, [](dist::Comm& comm) { fsdp::all_gather_into(comm, at::zeros({4}, at::kBFloat16), at::zeros({8})); },
      "must have the same dtype");
  check_fails_on_every_rank(
      2, [](dist::Comm& comm) { fsdp::all_gather_into(comm, at::Tensor(), at::zeros({8})); }, "is undefined");
  check_fails_on_every_rank(
      2,
      [](dist::Comm& comm) {
        fsdp::reduce_scatter_into(comm, at::zeros({4, 4}).t(), at::zeros({8}));
      },
      "must be contiguous");
  check_fails_on_every_rank(
      2, [](dist::Comm& comm) { fsdp::all_gather(comm, at::zeros({3}), 10); }, "elements, but");
  // Sizes that are wrong the other way: a full tensor too small, a shard too long.
  check_fails_on_every_rank(
      2, [](dist::Comm& comm) { fsdp::reduce_scatter_into(comm, at::zeros({6}), at::zeros({4})); },
      "full has 6 elements, but 2 ranks x 4 need 8");
  check_fails_on_every_rank(
      3, [](dist::Comm& comm) { fsdp::all_gather_into(comm, at::zeros({4}), at::zeros({16})); }, "elements, but");
  check_fails_on_every_rank(
      2, [](dist::Comm& comm) { fsdp::all_gather(comm, at::zeros({6}), 10); }, "elements, but");
}
