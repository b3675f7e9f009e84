// Checks for lesson 7, step 2: flat padded shards (FSDP's FlatParameter).
// Run: bazel test //lesson7_fsdp:fsdp_step2_test
#include "lesson7_fsdp/fsdp_test_helpers.h"

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "lesson5_distributed/comm.h"
#include "lesson7_fsdp/fsdp.h"

using fsdp_checks::Contains;
using fsdp_checks::launch;

namespace {

// A layer's worth of parameters: 12 + 4 + 8 = 24 elements, each a distinct value.
std::vector<at::Tensor> layer_params() {
  const at::Tensor values = at::arange(1, 25, at::kFloat);
  return {values.narrow(0, 0, 12).view({3, 4}).clone(), values.narrow(0, 12, 4).clone(),
          values.narrow(0, 16, 8).view({2, 2, 2}).clone()};
}

// The parameters laid end to end, padded with zeros to `padded` elements.
at::Tensor padded_flat(const std::vector<at::Tensor>& params, int64_t padded) {
  std::vector<at::Tensor> pieces;
  int64_t numel = 0;
  for (const auto& p : params) {
    pieces.push_back(p.reshape({-1}));
    numel += p.numel();
  }
  pieces.push_back(at::zeros({padded - numel}));
  return at::cat(pieces);
}

}  // namespace

TEST_CASE("[step2] padded_numel rounds up to a multiple of N, at and around the multiples") {
  for (int n = 1; n <= 5; ++n) {
    CAPTURE(n);
    CHECK(fsdp::padded_numel(0, n) == 0);
    CHECK(fsdp::padded_numel(1, n) == n);
    CHECK(fsdp::padded_numel(n - 1, n) == (n == 1 ? 0 : n));
    CHECK(fsdp::padded_numel(n, n) == n);
    CHECK(fsdp::padded_numel(n + 1, n) == (n == 1 ? 2 : 2 * n));
    CHECK(fsdp::padded_numel(3 * n, n) == 3 * n);
    CHECK(fsdp::padded_numel(3 * n + 1, n) == (n == 1 ? 4 : 4 * n));
  }
  CHECK(fsdp::padded_numel(24, 5) == 25);
  CHECK(fsdp::padded_numel(24, 7) == 28);
  CHECK_THROWS_WITH(fsdp::padded_numel(8, 0), Contains("world_size must be > 0"));
}

TEST_CASE("[step2] flatten_and_shard keeps slice r of the padded flat buffer, and only 1/N of it") {
  const std::vector<at::Tensor> params = layer_params();
  for (const int n : {1, 2, 3, 4, 5, 7}) {
    const int64_t padded = fsdp::padded_numel(24, n), size = padded / n;
    const at::Tensor expected = padded_flat(params, padded);
    int64_t persistent = 0;
    for (int r = 0; r < n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      const fsdp::FlatParam flat = fsdp::flatten_and_shard(params, r, n);
      CHECK(flat.numel == 24);
      CHECK(flat.padded_numel == padded);
      CHECK(flat.rank == r);
      CHECK(flat.world_size == n);
      CHECK(flat.offsets == std::vector<int64_t>{0, 12, 16});
      CHECK(flat.shapes == std::vector<std::vector<int64_t>>{{3, 4}, {4}, {2, 2, 2}});
      REQUIRE(flat.shard.defined());
      CHECK((flat.shard.scalar_type() == at::kFloat));
      REQUIRE(flat.shard.numel() == size);
      CHECK(at::equal(flat.shard.detach(), expected.narrow(0, r * size, size)));
      // Its own storage of exactly S floats: the persistent bytes of this rank are 1/N of the padded total.
      CHECK(flat.shard.storage().nbytes() == static_cast<size_t>(size * 4));
      CHECK(flat.shard.is_leaf());
      CHECK(flat.shard.requires_grad());
      persistent += static_cast<int64_t>(flat.shard.storage().nbytes());
    }
    CHECK(persistent == padded * 4);
  }
}

TEST_CASE("[step2] the shard is a copy: the caller's tensors can change or go") {
  std::vector<at::Tensor> params = layer_params();
  const fsdp::FlatParam flat = fsdp::flatten_and_shard(params, 0, 2);
  const at::Tensor before = flat.shard.detach().clone();
  for (auto& p : params) p.fill_(-1);
  CHECK(at::equal(flat.shard.detach(), before));
}

TEST_CASE("[step2] unflatten gives the parameters back as views that alias the gathered buffer") {
  const std::vector<at::Tensor> params = layer_params();
  const fsdp::FlatParam flat = fsdp::flatten_and_shard(params, 1, 5);
  at::Tensor full = padded_flat(params, flat.padded_numel);
  const std::vector<at::Tensor> views = fsdp::unflatten(flat, full);
  REQUIRE(views.size() == 3);
  for (size_t i = 0; i < views.size(); ++i) {
    CAPTURE(i);
    CHECK(views[i].sizes() == params[i].sizes());
    CHECK(at::equal(views[i], params[i]));
    CHECK(views[i].is_alias_of(full));  // the same storage: no copy
    CHECK(static_cast<const char*>(views[i].data_ptr()) ==
          static_cast<const char*>(full.data_ptr()) + 4 * flat.offsets[i]);
  }
  views[1].fill_(100);  // a write through a view is a write into the buffer
  CHECK(at::equal(full.narrow(0, 12, 4), at::full({4}, 100.0)));
  CHECK_THROWS_WITH(fsdp::unflatten(flat, at::zeros({24})), Contains("elements, but"));
}

TEST_CASE("[step2] unflatten refuses a buffer of any other size than padded_numel, larger as well as smaller") {
  const std::vector<at::Tensor> params = layer_params();  // 24 elements
  for (const int n : {1, 5, 7}) {
    const fsdp::FlatParam flat = fsdp::flatten_and_shard(params, 0, n);
    const int64_t padded = flat.padded_numel;  // 24, 25, 28
    for (const int64_t size : {int64_t{0}, padded - 1, padded + 1, padded + n, 2 * padded}) {
      CAPTURE(n);
      CAPTURE(size);
      CHECK_THROWS_WITH(fsdp::unflatten(flat, at::zeros({size})), Contains("elements, but"));
    }
    if (padded > flat.numel)
      CHECK_THROWS_WITH(fsdp::unflatten(flat, at::zeros({flat.numel})), Contains("elements, but"));
    CHECK(fsdp::unflatten(flat, at::zeros({padded})).size() == 3);
  }
}

TEST_CASE("[step2] gather_full on N ranks rebuilds every parameter, shapes and values, on every rank") {
  const std::vector<at::Tensor> params = layer_params();
  for (const int n : {2, 3}) {
    std::vector<std::vector<at::Tensor>> got(static_cast<size_t>(n));
    std::vector<int64_t> sent(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const fsdp::FlatParam flat = fsdp::flatten_and_shard(params, comm.rank(), n);
      const at::Tensor full = fsdp::gather_full(comm, flat);
      got[static_cast<size_t>(comm.rank())] = fsdp::unflatten(flat, full);
      sent[static_cast<size_t>(comm.rank())] = comm.stats().send_bytes;
    });
    const int64_t padded = fsdp::padded_numel(24, n);
    for (int r = 0; r < n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      REQUIRE(got[static_cast<size_t>(r)].size() == 3);
      for (size_t i = 0; i < 3; ++i) CHECK(at::equal(got[static_cast<size_t>(r)][i], params[i]));
      CHECK(sent[static_cast<size_t>(r)] == (n - 1) * (padded / n) * 4);
    }
  }
}

TEST_CASE("[step2] bad input is refused by name") {
  const std::vector<at::Tensor> params = layer_params();
  CHECK_THROWS_WITH(fsdp::flatten_and_shard({}, 0, 2), Contains("no parameters"));
  CHECK_THROWS_WITH(fsdp::flatten_and_shard({at::zeros({2}, at::kDouble)}, 0, 2), Contains("must be float32"));
  CHECK_THROWS_WITH(fsdp::flatten_and_shard({at::zeros({2}), at::Tensor()}, 0, 2), Contains("must be float32"));
  CHECK_THROWS_WITH(fsdp::flatten_and_shard(params, 2, 2), Contains("outside 0 .."));
  CHECK_THROWS_WITH(fsdp::flatten_and_shard(params, -1, 2), Contains("outside 0 .."));
  fsdp_checks::check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        const fsdp::FlatParam flat = fsdp::flatten_and_shard(params, comm.rank(), 3);  // made for 3 ranks
        fsdp::gather_full(comm, flat);
      },
      "was made for rank");
}
