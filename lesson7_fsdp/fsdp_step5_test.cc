// Checks for lesson 7, step 5: mixed precision (16-bit gathers beside float32 shards) and the gradient scaler
// across shards. Run: bazel test //lesson7_fsdp:fsdp_step5_test
#include "lesson7_fsdp/fsdp_test_problem.h"

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/memory_meter.h"
#include "lesson5_distributed/comm.h"
#include "lesson7_fsdp/fsdp.h"

using namespace fsdp_checks;  // NOLINT: the shared problem (fsdp_test_problem.h)

namespace {

const fsdp::MixedPrecision kFloat32{torch::kFloat, torch::kFloat};
const fsdp::MixedPrecision kBf16{torch::kBFloat16, torch::kFloat};

struct Trained {
  std::vector<torch::Tensor> params;  // every parameter gathered back (in the oracle's order)
  std::vector<torch::Tensor> shards;  // this rank's master shards
};

// `steps` sharded SGD steps on this rank: with `mp` through sharded_forward_mixed, else step 3's sharded_forward.
Trained sharded_training(dist::Comm& comm, const Problem& p, int steps, const fsdp::MixedPrecision* mp) {
  const int r = comm.rank(), n = comm.world_size();
  std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
  std::vector<torch::Tensor> shards = master_shards(flats);
  auto optimizer = make_optimizer(shards, Opt::kSgd);
  for (int s = 0; s < steps; ++s) {
    optimizer->zero_grad();
    torch::Tensor h = rows(p.x, r, n);
    for (size_t l = 0; l < flats.size(); ++l) {
      h = mp ? fsdp::sharded_forward_mixed(comm, flats[l], kLayers[l], h, *mp)
             : fsdp::sharded_forward(comm, flats[l], kLayers[l], h);
    }
    torch::mse_loss(h.to(torch::kFloat), rows(p.y, r, n)).backward();
    for (const auto& flat : flats) {
      REQUIRE(flat.shard.grad().defined());
      CHECK((flat.shard.grad().scalar_type() == torch::kFloat));  // the optimizer sees float32 gradients only
    }
    optimizer->step();
  }
  Trained out;
  out.params = gathered_params(comm, flats);
  for (const auto& flat : flats) out.shards.push_back(flat.shard.detach().clone());
  return out;
}

// The sends this rank made, in bytes, in order (the rings' sends: one entry per send).
std::vector<int64_t> send_sizes(const std::vector<std::string>& log) {
  std::vector<int64_t> out;
  for (const auto& entry : log) {
    if (entry.rfind("send ", 0) == 0) out.push_back(std::stoll(entry.substr(5)));
  }
  return out;
}

}  // namespace

TEST_CASE("[step5] a gather in a 16-bit dtype sends exactly half the bytes of float32 and gives the cast shards") {
  const Problem p = make_problem();
  for (const int n : {2, 3}) {
    std::vector<dist::CommStats> f32(static_cast<size_t>(n)), bf16(static_cast<size_t>(n)), f16(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const int r = comm.rank();
      const fsdp::FlatParam flat = fsdp::flatten_and_shard(p.layers[1], r, n);
      comm.reset_stats();
      const torch::Tensor full32 = fsdp::gather_full(comm, flat);
      f32[static_cast<size_t>(r)] = comm.stats();
      comm.reset_stats();
      const torch::Tensor full_bf16 = fsdp::gather_full_as(comm, flat, torch::kBFloat16);
      bf16[static_cast<size_t>(r)] = comm.stats();
      comm.reset_stats();
      const torch::Tensor full_f16 = fsdp::gather_full_as(comm, flat, torch::kHalf);
      f16[static_cast<size_t>(r)] = comm.stats();
      CHECK((full_bf16.scalar_type() == torch::kBFloat16));
      CHECK((full_f16.scalar_type() == torch::kHalf));
      CHECK(full_bf16.numel() == flat.padded_numel);
      CHECK(torch::equal(full_bf16, full32.to(torch::kBFloat16)));  // every rank's shard, rounded once
      CHECK(torch::equal(full_f16, full32.to(torch::kHalf)));
      CHECK((flat.shard.scalar_type() == torch::kFloat));  // the master stays float32
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      const int64_t s = shard_of(kLayerNumel[1], n);
      CHECK(f32[static_cast<size_t>(r)].send_bytes == (n - 1) * s * 4);
      CHECK(bf16[static_cast<size_t>(r)].send_bytes == (n - 1) * s * 2);  // half the bytes
      CHECK(f16[static_cast<size_t>(r)].send_bytes == (n - 1) * s * 2);
      CHECK(2 * bf16[static_cast<size_t>(r)].send_bytes == f32[static_cast<size_t>(r)].send_bytes);
    }
  }
}

TEST_CASE("[step5] per layer: 16-bit gathers, and a reduce-scatter in the reduce dtype (float32 or bfloat16)") {
  const Problem p = make_problem();
  const int n = 2;
  const int64_t s = shard_of(kLayerNumel[1], n);
  for (const torch::ScalarType reduce : {torch::kFloat, torch::kBFloat16}) {
    std::vector<std::vector<int64_t>> forward(static_cast<size_t>(n)), backward(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const int r = comm.rank();
      fsdp::FlatParam flat = fsdp::flatten_and_shard(p.layers[1], r, n);
      const torch::Tensor x = torch::randn({4, 15}).requires_grad_(true);
      // The layer function as a temporary that alone holds a token: sharded_forward_mixed must keep a copy for
      // the backward, as sharded_forward does.
      auto token = std::make_shared<int>(1);
      const std::weak_ptr<int> watch = token;
      comm.reset_stats();
      const torch::Tensor y =
          fsdp::sharded_forward_mixed(comm, flat,
                                      [token = std::move(token)](const torch::Tensor& h,
                                                                 const std::vector<torch::Tensor>& params) {
                                        return hidden(h, params) * static_cast<double>(*token);
                                      },
                                      x, {torch::kBFloat16, reduce});
      forward[static_cast<size_t>(r)] = send_sizes(comm.log());
      CHECK_FALSE(watch.expired());
      if (watch.expired()) return;                   // the backward would call a destroyed function
      CHECK((y.scalar_type() == torch::kBFloat16));  // the layer computed in the param dtype
      comm.reset_stats();
      y.to(torch::kFloat).sum().backward();
      backward[static_cast<size_t>(r)] = send_sizes(comm.log());
      CHECK((flat.shard.scalar_type() == torch::kFloat));
      REQUIRE(flat.shard.grad().defined());
      CHECK((flat.shard.grad().scalar_type() == torch::kFloat));
      CHECK(flat.shard.grad().numel() == s);
      REQUIRE(x.grad().defined());
      CHECK((x.grad().scalar_type() == torch::kFloat));  // in x's dtype
    });
    const int64_t reduce_bytes = reduce == torch::kFloat ? 4 : 2;
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CAPTURE(reduce_bytes);
      CHECK(forward[static_cast<size_t>(r)] == std::vector<int64_t>{2 * s});                     // the gather
      CHECK(backward[static_cast<size_t>(r)] == std::vector<int64_t>{2 * s, reduce_bytes * s});  // gather, reduce
    }
  }
}

TEST_CASE("[step5] float32 'mixed precision' is step 3; bfloat16 gathers track float32 training, master float32") {
  const Problem p = make_problem();
  const std::vector<torch::Tensor> reference = full_batch(p, Opt::kSgd, 3);
  for (const int n : {2, 3}) {
    std::vector<Trained> step3(static_cast<size_t>(n)), f32(static_cast<size_t>(n)), bf16(static_cast<size_t>(n)),
        bf16_all(static_cast<size_t>(n));
    const fsdp::MixedPrecision bf16_reduce{torch::kBFloat16, torch::kBFloat16};
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const auto r = static_cast<size_t>(comm.rank());
      step3[r] = sharded_training(comm, p, 3, nullptr);
      f32[r] = sharded_training(comm, p, 3, &kFloat32);
      bf16[r] = sharded_training(comm, p, 3, &kBf16);
      bf16_all[r] = sharded_training(comm, p, 3, &bf16_reduce);
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      const auto i = static_cast<size_t>(r);
      for (size_t k = 0; k < step3[i].params.size(); ++k) CHECK(torch::equal(f32[i].params[k], step3[i].params[k]));
      const double rel_f32 = rel_error(f32[i].params, reference);
      const double rel_bf16 = rel_error(bf16[i].params, reference);
      const double rel_bf16_all = rel_error(bf16_all[i].params, reference);
      CAPTURE(rel_f32);
      CAPTURE(rel_bf16);
      CAPTURE(rel_bf16_all);
      CHECK(rel_f32 <= 1e-6);
      // bfloat16 keeps 8 significant bits (a rounding is within 2^-9 relative); the master never rounds, only
      // the 3 updates of lr 0.1 are computed from rounded values: the page's bound is 2^-8 of max |p|.
      CHECK(rel_bf16 > 1e-6);  // the layers really computed in bfloat16
      CHECK(rel_bf16 <= std::ldexp(1.0, -8));
      CHECK(rel_bf16_all <= std::ldexp(1.0, -8));
      for (const auto& shard : bf16[i].shards) {
        CHECK((shard.scalar_type() == torch::kFloat));
        // A float32 master holds values that bfloat16 cannot: it was never rounded to the param dtype.
        CHECK_FALSE(torch::equal(shard, shard.to(torch::kBFloat16).to(torch::kFloat)));
      }
    }
  }
}

TEST_CASE("[step5] an overflow on ONE rank's gradient shard makes EVERY rank skip and back off the scale") {
  const Problem p = make_problem();
  for (const int n : {2, 3}) {
    for (const int bad : {0, n - 1}) {
      std::vector<std::vector<torch::Tensor>> before(static_cast<size_t>(n)), after(static_cast<size_t>(n));
      std::vector<double> scale(static_cast<size_t>(n));
      std::vector<int> found(static_cast<size_t>(n)), all_reduces(static_cast<size_t>(n));
      dist::run_ranks(launch(n), [&](dist::Comm& comm) {
        const int r = comm.rank();
        std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
        std::vector<torch::Tensor> shards = master_shards(flats);
        torch::optim::SGD optimizer(shards, torch::optim::SGDOptions(0.1));
        double s = 1024.0;
        for (auto& flat : flats) flat.shard.mutable_grad() = torch::full_like(flat.shard, s).detach();
        if (r == bad) flats[1].shard.grad()[0] = std::numeric_limits<float>::infinity();  // this rank only
        for (const auto& t : shards) before[static_cast<size_t>(r)].push_back(t.detach().clone());
        comm.reset_stats();
        const bool inf = fsdp::sharded_unscale_and_check(comm, flats, s);
        all_reduces[static_cast<size_t>(r)] = static_cast<int>(comm.stats().all_reduce_calls);
        if (inf) {
          s *= 0.5;  // skip the step, back the scale off (GradScaler's backoff_factor)
        } else {
          optimizer.step();
        }
        found[static_cast<size_t>(r)] = inf ? 1 : 0;
        scale[static_cast<size_t>(r)] = s;
        for (const auto& t : shards) after[static_cast<size_t>(r)].push_back(t.detach().clone());
      });
      for (int r = 0; r < n; ++r) {
        CAPTURE(n);
        CAPTURE(bad);
        CAPTURE(r);
        const auto i = static_cast<size_t>(r);
        CHECK(found[i] == 1);        // every rank saw it: the flag was agreed
        CHECK(all_reduces[i] == 1);  // in one all-reduce
        CHECK(scale[i] == 512.0);    // the same scale on every rank
        for (size_t k = 0; k < after[i].size(); ++k) CHECK(torch::equal(after[i][k], before[i][k]));  // skipped
      }
    }
  }
}

TEST_CASE("[step5] a clean step: every shard's gradient unscaled exactly once, no rank skips") {
  const Problem p = make_problem();
  const int n = 2;
  std::vector<int> found(static_cast<size_t>(n));
  dist::run_ranks(launch(n), [&](dist::Comm& comm) {
    std::vector<fsdp::FlatParam> flats = shard_layers(p, comm.rank(), n);
    std::vector<torch::Tensor> expected;
    for (auto& flat : flats) {
      const torch::Tensor g = torch::randn_like(flat.shard).detach();
      expected.push_back(g.clone());
      flat.shard.mutable_grad() = g * 256.0;  // a power of two: unscaling is exact
    }
    found[static_cast<size_t>(comm.rank())] = fsdp::sharded_unscale_and_check(comm, flats, 256.0) ? 1 : 0;
    for (size_t l = 0; l < flats.size(); ++l) CHECK(torch::equal(flats[l].shard.grad(), expected[l]));
  });
  for (int r = 0; r < n; ++r) CHECK(found[static_cast<size_t>(r)] == 0);
}

TEST_CASE("[step5] a param dtype that is not float32, bfloat16 or float16, or a wrong reduce dtype, is refused") {
  const Problem p = make_problem();
  const int n = 2;
  const auto run = [&](fsdp::MixedPrecision mp) {
    return [&p, mp](dist::Comm& comm) {
      fsdp::FlatParam flat = fsdp::flatten_and_shard(p.layers[0], comm.rank(), n);
      fsdp::sharded_forward_mixed(comm, flat, kLayers[0], rows(p.x, comm.rank(), n), mp);
    };
  };
  // check_mixed_precision alone (no ranks), then in the forward's agreement, on every rank.
  CHECK_THROWS_WITH(fsdp::check_mixed_precision({torch::kDouble, torch::kFloat}),
                    Contains("param_dtype must be float32, bfloat16 or float16"));
  CHECK_THROWS_WITH(fsdp::check_mixed_precision({torch::kBFloat16, torch::kHalf}),
                    Contains("reduce_dtype must be float32 or the param_dtype"));
  CHECK_NOTHROW(fsdp::check_mixed_precision({torch::kHalf, torch::kHalf}));
  check_fails_on_every_rank(n, run({torch::kDouble, torch::kFloat}),
                            "param_dtype must be float32, bfloat16 or float16");
  check_fails_on_every_rank(n, run({torch::kInt, torch::kFloat}), "param_dtype must be float32, bfloat16 or float16");
  check_fails_on_every_rank(n, run({torch::kBFloat16, torch::kHalf}),
                            "reduce_dtype must be float32 or the param_dtype");
  check_fails_on_every_rank(n, run({torch::kBFloat16, torch::kDouble}),
                            "reduce_dtype must be float32 or the param_dtype");
  check_fails_on_every_rank(
      n,
      [&](dist::Comm& comm) {
        std::vector<fsdp::FlatParam> flats{fsdp::flatten_and_shard(p.layers[0], comm.rank(), n)};
        fsdp::sharded_unscale_and_check(comm, flats, 0.0);
      },
      "scale must be finite and > 0");
}

TEST_CASE("[step5] ranks whose dtypes or layers differ: the same error on every rank, no timeout") {
  const Problem p = make_problem();
  const int n = 2;
  // `mp_of(rank)` on each rank, one layer's forward.
  const auto forward_with = [&](std::function<fsdp::MixedPrecision(int)> mp_of) {
    return [&p, mp_of](dist::Comm& comm) {
      fsdp::FlatParam flat = fsdp::flatten_and_shard(p.layers[0], comm.rank(), n);
      fsdp::sharded_forward_mixed(comm, flat, kLayers[0], rows(p.x, comm.rank(), n), mp_of(comm.rank()));
    };
  };
  // A bad dtype on rank 1 only: rank 0 must not wait for it.
  check_fails_on_every_rank(n,
                            forward_with([](int r) { return r == 1 ? fsdp::MixedPrecision{torch::kDouble} : kBf16; }),
                            "on rank 1: MixedPrecision: param_dtype must be float32, bfloat16 or float16");
  // Two valid precisions, but not the same: the gathers would differ in bytes.
  check_fails_on_every_rank(n, forward_with([](int r) { return r == 1 ? kFloat32 : kBf16; }),
                            "the ranks disagree on the layer they are about to gather");
  // Step 3's rules, in mixed precision: rank 1's FlatParam made for rank 0, or for 3 ranks, or its shard
  // without grad; rank 0 must not wait for it.
  const auto rank1_flat = [&](std::function<void(fsdp::FlatParam&)> change) {
    return [&p, change](dist::Comm& comm) {
      fsdp::FlatParam flat = fsdp::flatten_and_shard(p.layers[0], comm.rank(), n);
      if (comm.rank() == 1) change(flat);
      fsdp::sharded_forward_mixed(comm, flat, kLayers[0], rows(p.x, comm.rank(), n), kBf16);
    };
  };
  check_fails_on_every_rank(n, rank1_flat([&](fsdp::FlatParam& flat) {
                              flat = fsdp::flatten_and_shard(p.layers[0], 0, n);
                            }),
                            "on rank 1: the FlatParam was made for rank 0 of 2, but this is rank 1 of 2");
  check_fails_on_every_rank(n, rank1_flat([&](fsdp::FlatParam& flat) {
                              flat = fsdp::flatten_and_shard(p.layers[0], 1, 3);
                            }),
                            "on rank 1: the FlatParam was made for rank 1 of 3");
  check_fails_on_every_rank(n, rank1_flat([](fsdp::FlatParam& flat) { flat.shard = flat.shard.detach(); }),
                            "on rank 1: the layer's shard must be a leaf that requires grad");
  // Rank 1's loss reads layer 1's output: its backward skips layer 2.
  check_fails_on_every_rank(
      n,
      [&](dist::Comm& comm) {
        const int r = comm.rank();
        std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
        std::vector<torch::Tensor> outs;
        torch::Tensor h = rows(p.x, r, n);
        for (size_t l = 0; l < 3; ++l)
          outs.push_back(h = fsdp::sharded_forward_mixed(comm, flats[l], kLayers[l], h, kBf16));
        (r == 1 ? outs[1].to(torch::kFloat).sum() : h.to(torch::kFloat).sum()).backward();
      },
      "the ranks disagree on the layer they are about to gather (rank 0: the backward of a layer of 56 elements");
}

TEST_CASE("[step5] a layer that ignores its parameters on one rank: zeros are its share, as in step 3") {
  const Problem p = make_problem();
  const int n = 2;
  const fsdp::LayerFn skip = ignores_params;
  std::vector<torch::Tensor> mixed(n), step3(n);
  const std::vector<dist::RankOutcome> outcomes = dist::run_ranks_collect(launch(n, 5000), [&](dist::Comm& comm) {
    const int r = comm.rank();
    for (const bool use_mixed : {true, false}) {
      std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
      torch::Tensor h = rows(p.x, r, n);
      for (size_t l = 0; l < 3; ++l) {
        const fsdp::LayerFn& fn = (r == 1 && l == 1) ? skip : kLayers[l];
        h = use_mixed ? fsdp::sharded_forward_mixed(comm, flats[l], fn, h, kFloat32)
                      : fsdp::sharded_forward(comm, flats[l], fn, h);
      }
      torch::mse_loss(h, rows(p.y, r, n)).backward();
      (use_mixed ? mixed : step3)[static_cast<size_t>(r)] = flats[1].shard.grad().clone();
    }
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    INFO(outcomes[static_cast<size_t>(r)].error);
    REQUIRE(outcomes[static_cast<size_t>(r)].ok);
    CHECK(torch::equal(mixed[static_cast<size_t>(r)], step3[static_cast<size_t>(r)]));  // float32: exactly step 3
  }
}

namespace {

// How a run of the problem goes through its layers: step 5's sharded_forward_mixed layer by layer, or step 4's
// ShardedStack made with the MixedPrecision (prefetching or not), or a stack made without one (float32).
enum class Path { kLayers, kStack, kStackNoPrefetch, kStackWithout };

struct MixedRun {
  std::vector<torch::Tensor> params;  // every parameter gathered back (in the oracle's order)
  std::vector<torch::Tensor> shards;  // this rank's master shards
  std::vector<int64_t> sends;         // the last step's sends, in bytes, in order
  int64_t sent = 0;                   // the last step's bytes sent
  int64_t agreements = 0;             // the last step's all-gathers (the agreements' records)
  int max_alive = 0;
  int found_inf = 0;  // steps the scaler skipped
};

// `steps` SGD steps of the problem on this rank along `path`, with a loss scale of 1024 (a power of two) and
// step 5's scaler across the shards before each step.
MixedRun mixed_training(dist::Comm& comm, const Problem& p, int steps, const fsdp::MixedPrecision& mp, Path path) {
  const int r = comm.rank(), n = comm.world_size();
  std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
  std::vector<torch::Tensor> shards = master_shards(flats);
  auto optimizer = make_optimizer(shards, Opt::kSgd);
  std::unique_ptr<fsdp::ShardedStack> stack;
  if (path == Path::kStack || path == Path::kStackNoPrefetch) {
    stack = std::make_unique<fsdp::ShardedStack>(comm, flats, kLayers, path == Path::kStack, mp);
  } else if (path == Path::kStackWithout) {
    stack = std::make_unique<fsdp::ShardedStack>(comm, flats, kLayers, true);
  }
  const double scale = 1024.0;
  MixedRun run;
  for (int s = 0; s < steps; ++s) {
    optimizer->zero_grad();
    comm.reset_stats();
    torch::Tensor h = rows(p.x, r, n);
    if (stack) {
      h = stack->forward(h);
    } else {
      for (size_t l = 0; l < flats.size(); ++l) h = fsdp::sharded_forward_mixed(comm, flats[l], kLayers[l], h, mp);
    }
    (torch::mse_loss(h.to(torch::kFloat), rows(p.y, r, n)) * scale).backward();
    if (stack) stack->finish();
    run.sends = send_sizes(comm.log());
    run.sent = comm.stats().send_bytes;
    run.agreements = comm.stats().all_gather_calls;
    for (const auto& flat : flats) {
      REQUIRE(flat.shard.grad().defined());
      CHECK((flat.shard.grad().scalar_type() == torch::kFloat));  // the optimizer sees float32 gradients only
    }
    if (fsdp::sharded_unscale_and_check(comm, flats, scale)) {
      run.found_inf += 1;
    } else {
      optimizer->step();
    }
  }
  if (stack) run.max_alive = stack->max_alive();
  run.params = gathered_params(comm, flats);
  for (const auto& flat : flats) run.shards.push_back(flat.shard.detach().clone());
  return run;
}

int64_t dtype_bytes(torch::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }

}  // namespace

TEST_CASE("[step5] the stack in mixed precision: bit for bit step 5's layers, prefetched or not, 16-bit bytes") {
  const Problem p = make_problem();
  const fsdp::MixedPrecision bf16_reduce{torch::kBFloat16, torch::kBFloat16};
  for (const int n : {2, 3}) {
    for (const fsdp::MixedPrecision& mp : {kBf16, bf16_reduce, kFloat32}) {
      std::vector<MixedRun> layers(static_cast<size_t>(n)), with(static_cast<size_t>(n)),
          without(static_cast<size_t>(n)), plain(static_cast<size_t>(n));
      dist::run_ranks(launch(n), [&](dist::Comm& comm) {
        const auto r = static_cast<size_t>(comm.rank());
        layers[r] = mixed_training(comm, p, 3, mp, Path::kLayers);
        with[r] = mixed_training(comm, p, 3, mp, Path::kStack);
        without[r] = mixed_training(comm, p, 3, mp, Path::kStackNoPrefetch);
        plain[r] = mixed_training(comm, p, 3, mp, Path::kStackWithout);
      });
      // Per layer and step: two gathers in the param dtype and one reduce-scatter in the reduce dtype, each of
      // (N - 1) x S elements per rank.
      const int64_t pb = dtype_bytes(mp.param_dtype), rb = dtype_bytes(mp.reduce_dtype);
      int64_t bytes = 0;
      std::vector<int64_t> s;
      for (int l = 0; l < 3; ++l) {
        s.push_back(shard_of(kLayerNumel[l], n));
        bytes += (n - 1) * s.back() * (2 * pb + rb);
      }
      for (int r = 0; r < n; ++r) {
        CAPTURE(n);
        CAPTURE(r);
        CAPTURE(mp.param_dtype);
        CAPTURE(mp.reduce_dtype);
        const auto i = static_cast<size_t>(r);
        REQUIRE(with[i].params.size() == layers[i].params.size());
        for (size_t k = 0; k < layers[i].params.size(); ++k) {
          // The same casts, the same layer functions, the same sums in the same order: the same bits.
          CHECK(torch::equal(with[i].params[k], layers[i].params[k]));
          CHECK(torch::equal(without[i].params[k], layers[i].params[k]));
          if (mp.param_dtype == torch::kFloat) CHECK(torch::equal(plain[i].params[k], layers[i].params[k]));
        }
        CHECK(with[i].found_inf == 0);
        CHECK(layers[i].sent == bytes);
        CHECK(with[i].sent == bytes);  // exactly the 16-bit counts, prefetched or not
        CHECK(without[i].sent == bytes);
        CHECK(with[i].sends.size() == static_cast<size_t>(9 * (n - 1)));
        CHECK(with[i].agreements == 5);  // the forward's, one per layer's backward, finish()'s: as in step 4
        CHECK(with[i].max_alive == 2);
        CHECK(without[i].max_alive == 1);
        if (n == 2) {
          // Each send in order: the forward's gathers of layers 0, 1 (prefetched), 2; the backward's gather of 2,
          // the prefetched gather of 1, 2's reduce-scatter, the prefetched gather of 0, 1's, then 0's.
          CHECK(with[i].sends == std::vector<int64_t>{pb * s[0], pb * s[1], pb * s[2], pb * s[2], pb * s[1], rb * s[2],
                                                      pb * s[0], rb * s[1], rb * s[0]});
        }
        if (mp.param_dtype != torch::kFloat) {
          CHECK(plain[i].sent == (n - 1) * 12 * (s[0] + s[1] + s[2]));  // float32 throughout: 4 + 4 + 4 bytes
          for (const auto& shard : with[i].shards) {
            CHECK((shard.scalar_type() == torch::kFloat));
            // The float32 master holds values that bfloat16 cannot: it was never rounded to the param dtype.
            CHECK_FALSE(torch::equal(shard, shard.to(torch::kBFloat16).to(torch::kFloat)));
          }
        }
      }
    }
  }
}

TEST_CASE("[step5] lesson 4's meter: a prefetching bfloat16 stack holds two layers' 16-bit buffers, half the bytes") {
  const std::vector<std::vector<torch::Tensor>> layers = wide_layers();
  const int n = 2;
  for (const bool prefetch : {true, false}) {
    std::vector<int64_t> peak(static_cast<size_t>(n)), compute(static_cast<size_t>(n));
    std::vector<int> alive(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const auto r = static_cast<size_t>(comm.rank());
      std::vector<fsdp::FlatParam> flats;
      for (const auto& layer : layers) flats.push_back(fsdp::flatten_and_shard(layer, comm.rank(), n));
      const torch::Tensor x = torch::randn({2, 64});
      {
        // What one layer's function allocates by itself in bfloat16, its parameters already there: the output,
        // and the temporaries of a bfloat16 matrix product on the CPU (larger than float32's).
        const fsdp::FlatParam whole = fsdp::flatten_and_shard(layers[0], 0, 1);
        const torch::Tensor full = whole.shard.detach().to(torch::kBFloat16);
        workshop::MemoryMeter meter(torch::kCPU, workshop::MeterScope::kThisThread);
        hidden(x.to(torch::kBFloat16), fsdp::unflatten(whole, full));
        compute[r] = meter.peak_bytes();
      }
      fsdp::ShardedStack stack(comm, flats, std::vector<fsdp::LayerFn>(layers.size(), fsdp::LayerFn(hidden)), prefetch,
                               kBf16);
      workshop::MemoryMeter meter(torch::kCPU, workshop::MeterScope::kThisThread);  // this rank's thread only
      stack.forward(x);
      peak[r] = meter.peak_bytes();
      alive[r] = stack.max_alive();
    });
    for (int r = 0; r < n; ++r) {
      const auto i = static_cast<size_t>(r);
      CAPTURE(prefetch);
      CAPTURE(r);
      CAPTURE(peak[i]);
      CAPTURE(compute[i]);
      // Gathered bfloat16 layers of 8320 bytes each (half of step 4's 16640), plus one layer's computation and
      // 2 KiB for the activations the stack passes on: less than one buffer more, and less than two float32 ones.
      const int64_t buffers = prefetch ? 2 : 1;
      CHECK(alive[i] == buffers);
      CHECK(peak[i] >= buffers * kWideLayerBytes / 2);
      CHECK(peak[i] <= buffers * kWideLayerBytes / 2 + compute[i] + 2048);
    }
  }
}

TEST_CASE("[step5] the stack: a bad or mismatched MixedPrecision fails every rank by name, no timeout") {
  const Problem p = make_problem();
  const int n = 2;
  // `mp_of(rank)` on each rank (none: a stack made without one), one forward of the problem's stack.
  const auto stack_with = [&](std::function<const fsdp::MixedPrecision*(int)> mp_of) {
    return [&p, mp_of](dist::Comm& comm) {
      std::vector<fsdp::FlatParam> flats = shard_layers(p, comm.rank(), n);
      const fsdp::MixedPrecision* mp = mp_of(comm.rank());
      const auto stack = mp ? std::make_unique<fsdp::ShardedStack>(comm, flats, kLayers, true, *mp)
                            : std::make_unique<fsdp::ShardedStack>(comm, flats, kLayers, true);
      stack->forward(rows(p.x, comm.rank(), n));
    };
  };
  static const fsdp::MixedPrecision kDouble{torch::kDouble, torch::kFloat}, kInt{torch::kInt, torch::kFloat},
      kHalfReduce{torch::kBFloat16, torch::kHalf};
  // The same bad precision on every rank: check_mixed_precision's words, on every rank.
  check_fails_on_every_rank(n, stack_with([](int) { return &kDouble; }),
                            "on rank 0: MixedPrecision: param_dtype must be float32, bfloat16 or float16");
  check_fails_on_every_rank(n, stack_with([](int) { return &kInt; }),
                            "param_dtype must be float32, bfloat16 or float16");
  check_fails_on_every_rank(n, stack_with([](int) { return &kHalfReduce; }),
                            "reduce_dtype must be float32 or the param_dtype");
  // A bad precision on rank 1 only: rank 0 must not wait for it.
  check_fails_on_every_rank(n, stack_with([](int r) { return r == 1 ? &kDouble : &kBf16; }),
                            "on rank 1: MixedPrecision: param_dtype must be float32, bfloat16 or float16");
  // Two valid precisions, but not the same (bfloat16 on rank 0, float32 on rank 1): the gathers would differ in
  // bytes.
  check_fails_on_every_rank(n, stack_with([](int r) { return r == 1 ? nullptr : &kBf16; }),
                            "the models differ across ranks in their layers' count, sizes, shapes or mixed precision");
}

namespace {

// One call of the scaler on `n` ranks, scale 4: every shard's gradient is 4 x (its position + 1) on every rank,
// then `edit(rank, flats)` changes some (an inf, a shard without a gradient ...). Per rank: what the scaler
// answered, its all-reduces, and its gradients after the call (undefined where a shard has none).
struct ScalerRun {
  std::vector<int> found;
  std::vector<int64_t> all_reduces;
  std::vector<std::vector<torch::Tensor>> grads;
};

ScalerRun scale_once(const Problem& p, int n, const std::function<void(int, std::vector<fsdp::FlatParam>&)>& edit) {
  ScalerRun run{std::vector<int>(static_cast<size_t>(n)), std::vector<int64_t>(static_cast<size_t>(n)),
                std::vector<std::vector<torch::Tensor>>(static_cast<size_t>(n))};
  const std::vector<dist::RankOutcome> outcomes = dist::run_ranks_collect(launch(n, 5000), [&](dist::Comm& comm) {
    const auto r = static_cast<size_t>(comm.rank());
    std::vector<fsdp::FlatParam> flats = shard_layers(p, comm.rank(), n);
    for (auto& flat : flats) {
      flat.shard.mutable_grad() = 4.0 * (torch::arange(flat.shard.numel(), torch::kFloat) + 1);
    }
    edit(comm.rank(), flats);
    comm.reset_stats();
    run.found[r] = fsdp::sharded_unscale_and_check(comm, flats, 4.0) ? 1 : 0;
    run.all_reduces[r] = comm.stats().all_reduce_calls;
    for (const auto& flat : flats) run.grads[r].push_back(flat.shard.grad());
  });
  for (size_t r = 0; r < outcomes.size(); ++r) {
    CAPTURE(r);
    INFO(outcomes[r].error);
    REQUIRE(outcomes[r].ok);  // no rank left waiting in the all-reduce
  }
  return run;
}

}  // namespace

TEST_CASE("[step5] inf, -inf or NaN in any layer's shard on one rank: every rank skips; large finite values do not") {
  const Problem p = make_problem();
  const int n = 3;
  const float kinds[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN()};
  for (const float bad : kinds) {
    for (int layer = 0; layer < 3; ++layer) {
      const int where = layer % n;  // the rank that sees it: another one per layer
      CAPTURE(bad);
      CAPTURE(layer);
      // The shard's last element (first for layer 1): the scaler must look at every element.
      const ScalerRun run = scale_once(p, n, [&](int r, std::vector<fsdp::FlatParam>& flats) {
        if (r != where) return;
        const torch::Tensor g = flats[static_cast<size_t>(layer)].shard.grad();
        g[layer == 1 ? 0 : g.numel() - 1] = bad;
      });
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        CHECK(run.found[static_cast<size_t>(r)] == 1);
        CHECK(run.all_reduces[static_cast<size_t>(r)] == 1);
      }
    }
  }
  // Finite values near float32's largest (their sum would overflow): no rank skips, and they are unscaled.
  const ScalerRun large = scale_once(p, n, [](int, std::vector<fsdp::FlatParam>& flats) {
    for (auto& flat : flats) flat.shard.grad().fill_(std::ldexp(1.0, 127));
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(large.found[static_cast<size_t>(r)] == 0);
    for (const auto& g : large.grads[static_cast<size_t>(r)])
      CHECK(torch::equal(g, torch::full_like(g, std::ldexp(1.0, 125))));
  }
}

TEST_CASE("[step5] a bad scale on one rank only: every rank fails by name, none waits for it") {
  const Problem p = make_problem();
  for (const double bad :
       {0.0, -1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(bad);
    check_fails_on_every_rank(
        2,
        [&](dist::Comm& comm) {
          std::vector<fsdp::FlatParam> flats = shard_layers(p, comm.rank(), 2);
          for (auto& flat : flats) flat.shard.mutable_grad() = torch::ones_like(flat.shard).detach();
          fsdp::sharded_unscale_and_check(comm, flats, comm.rank() == 1 ? bad : 1024.0);
        },
        "on rank 1: scale must be finite and > 0");
  }
}

TEST_CASE("[step5] valid scales that differ across ranks: every rank fails by name, none unscales silently") {
  const Problem p = make_problem();
  // Two scalers out of step: one rank grew or backed off its scale and another did not (or by a hair: a float32
  // comparison would take 1024 x (1 + 1e-12) for 1024). The odd rank is each rank in turn, on 3 ranks.
  for (const double other : {2048.0, 512.0, 1024.0 * (1 + 1e-12)}) {
    for (int odd = 0; odd < 3; ++odd) {
      CAPTURE(other);
      CAPTURE(odd);
      check_fails_on_every_rank(
          3,
          [&](dist::Comm& comm) {
            std::vector<fsdp::FlatParam> flats = shard_layers(p, comm.rank(), 3);
            for (auto& flat : flats) flat.shard.mutable_grad() = torch::ones_like(flat.shard).detach();
            fsdp::sharded_unscale_and_check(comm, flats, comm.rank() == odd ? other : 1024.0);
          },
          "the ranks passed different scales");
    }
  }
}

TEST_CASE("[step5] shards without a gradient: skipped by the scaler, the rank still joins the agreement") {
  const Problem p = make_problem();
  const int n = 2;
  // Rank 1's layer 1 got no gradient (its loss skipped that layer, say), and rank 1's layer 2 none either.
  const auto none_on_rank1 = [](int r, std::vector<fsdp::FlatParam>& flats) {
    if (r == 1) {
      flats[1].shard.mutable_grad() = torch::Tensor();
      flats[2].shard.mutable_grad() = torch::Tensor();
    }
  };
  const ScalerRun clean = scale_once(p, n, none_on_rank1);
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    const auto i = static_cast<size_t>(r);
    CHECK(clean.found[i] == 0);
    CHECK(clean.all_reduces[i] == 1);
    for (size_t l = 0; l < 3; ++l) {
      CAPTURE(l);
      const torch::Tensor& g = clean.grads[i][l];
      if (r == 1 && l > 0) {
        CHECK_FALSE(g.defined());  // still none: not made up as zeros
      } else {
        REQUIRE(g.defined());
        CHECK(torch::equal(g, torch::arange(g.numel(), torch::kFloat) + 1));  // unscaled once
      }
    }
  }
  // An inf on rank 0 while rank 1 has a shard without a gradient: both skip.
  const ScalerRun inf = scale_once(p, n, [&](int r, std::vector<fsdp::FlatParam>& flats) {
    none_on_rank1(r, flats);
    if (r == 0) flats[2].shard.grad()[0] = std::numeric_limits<float>::infinity();
  });
  CHECK(inf.found == std::vector<int>{1, 1});
  // No gradient anywhere on any rank (a step before any backward): no skip, one all-reduce each.
  const ScalerRun empty = scale_once(p, n, [](int, std::vector<fsdp::FlatParam>& flats) {
    for (auto& flat : flats) flat.shard.mutable_grad() = torch::Tensor();
  });
  CHECK(empty.found == std::vector<int>{0, 0});
  CHECK(empty.all_reduces == std::vector<int64_t>{1, 1});
}

TEST_CASE("[step5] a float32 reduce dtype reaches the optimizer unrounded; a bfloat16 one is bfloat16's values") {
  const Problem p = make_problem();
  const int n = 2;
  for (const Path path : {Path::kLayers, Path::kStack, Path::kStackNoPrefetch}) {
    for (const fsdp::MixedPrecision& mp : {kBf16, fsdp::MixedPrecision{torch::kBFloat16, torch::kBFloat16}}) {
      std::vector<torch::Tensor> grads(static_cast<size_t>(n));
      dist::run_ranks(launch(n), [&](dist::Comm& comm) {
        const int r = comm.rank();
        std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
        torch::Tensor h = rows(p.x, r, n);
        if (path == Path::kLayers) {
          for (size_t l = 0; l < flats.size(); ++l) h = fsdp::sharded_forward_mixed(comm, flats[l], kLayers[l], h, mp);
          torch::mse_loss(h.to(torch::kFloat), rows(p.y, r, n)).backward();
        } else {
          fsdp::ShardedStack stack(comm, flats, kLayers, path == Path::kStack, mp);
          torch::mse_loss(stack.forward(h).to(torch::kFloat), rows(p.y, r, n)).backward();
          stack.finish();
        }
        std::vector<torch::Tensor> all;
        for (const auto& flat : flats) all.push_back(flat.shard.grad());
        grads[static_cast<size_t>(r)] = torch::cat(all);
      });
      for (int r = 0; r < n; ++r) {
        CAPTURE(static_cast<int>(path));
        CAPTURE(mp.reduce_dtype);
        CAPTURE(r);
        const torch::Tensor& g = grads[static_cast<size_t>(r)];
        REQUIRE((g.scalar_type() == torch::kFloat));
        const bool representable = torch::equal(g, g.to(torch::kBFloat16).to(torch::kFloat));
        // Reduced in float32, the average of two ranks' bfloat16 gradients needs more than bfloat16's 8
        // significant bits almost everywhere; reduced in bfloat16, every value is a bfloat16 value.
        CHECK(representable == (mp.reduce_dtype == torch::kBFloat16));
      }
    }
  }
}

TEST_CASE("[step5] two backwards before one step accumulate the full batch's gradient, in every precision and path") {
  const Problem p = make_problem();
  const int n = 2;
  const std::vector<torch::Tensor> expected = full_batch_flat_grads(p, n);
  for (const Path path : {Path::kLayers, Path::kStack, Path::kStackNoPrefetch}) {
    for (const fsdp::MixedPrecision& mp : {kFloat32, kBf16, fsdp::MixedPrecision{torch::kBFloat16, torch::kBFloat16}}) {
      CAPTURE(static_cast<int>(path));
      CAPTURE(mp.param_dtype);
      CAPTURE(mp.reduce_dtype);
      std::vector<std::vector<torch::Tensor>> got(static_cast<size_t>(n));
      dist::run_ranks(launch(n), [&](dist::Comm& comm) {
        const int r = comm.rank();
        std::vector<fsdp::FlatParam> flats = shard_layers(p, r, n);
        std::unique_ptr<fsdp::ShardedStack> stack;
        if (path != Path::kLayers) {
          stack = std::make_unique<fsdp::ShardedStack>(comm, flats, kLayers, path == Path::kStack, mp);
        }
        for (int m = 0; m < 2; ++m) {  // each micro-batch is half the rank's rows: its loss counts half
          torch::Tensor h = micro_rows(p.x, r, n, m, 2);
          if (stack) {
            h = stack->forward(h);
          } else {
            for (size_t l = 0; l < flats.size(); ++l)
              h = fsdp::sharded_forward_mixed(comm, flats[l], kLayers[l], h, mp);
          }
          (torch::mse_loss(h.to(torch::kFloat), micro_rows(p.y, r, n, m, 2)) / 2).backward();
          if (stack) stack->finish();
        }
        for (const auto& flat : flats) got[static_cast<size_t>(r)].push_back(flat.shard.grad());
      });
      // float32: step 3's tolerance; bfloat16 layers: their rounding (8 significant bits) through three layers.
      check_full_batch_grads(got, expected, mp.param_dtype == torch::kFloat ? 1e-6 : std::ldexp(1.0, -5));
    }
  }
}
