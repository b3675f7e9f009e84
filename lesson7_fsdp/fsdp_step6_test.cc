// Checks for lesson 7, step 6: sharded checkpoints that outlive the world size.
// Run: bazel test //lesson7_fsdp:fsdp_step6_test
#include "lesson7_fsdp/fsdp_test_problem.h"

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "lesson5_distributed/comm.h"
#include "lesson7_fsdp/fsdp.h"

using namespace fsdp_checks;  // NOLINT: the shared problem (fsdp_test_problem.h)

namespace {

// A fresh, empty folder under the test's TEST_TMPDIR (Bazel sets it; /tmp outside Bazel).
std::string fresh_dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir = std::filesystem::path(tmp != nullptr ? tmp : "/tmp") / ("l7_ckpt_" + name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

// The model's fingerprint: per layer, its parameters' shapes.
std::vector<std::vector<std::vector<int64_t>>> shapes_of(const std::vector<std::vector<torch::Tensor>>& layers) {
  std::vector<std::vector<std::vector<int64_t>>> out;
  for (const auto& layer : layers) {
    out.emplace_back();
    for (const auto& t : layer) out.back().push_back(t.sizes().vec());
  }
  return out;
}

// The key of a shard's state in the C++ Adam's map: the TensorImpl's address as text in LibTorch 1.13 (what
// c10::guts::to_string wrote), the address itself in 2.x. The map's key type says which.
template <typename StateMap>
typename StateMap::key_type key_of(const StateMap& /*state*/, const torch::Tensor& t) {
  if constexpr (std::is_same_v<typename StateMap::key_type, std::string>) {
    std::ostringstream text;
    text << t.unsafeGetTensorImpl();
    return text.str();
  } else {
    return static_cast<typename StateMap::key_type>(t.unsafeGetTensorImpl());
  }
}

// `steps` sharded Adam steps from `ckpt` (its state restored into a new Adam); returns the checkpoint after them.
fsdp::ShardedCheckpoint train(dist::Comm& comm, const Problem& p, fsdp::ShardedCheckpoint ckpt, int steps) {
  const int r = comm.rank(), n = comm.world_size();
  std::vector<torch::Tensor> shards = master_shards(ckpt.flats);
  torch::optim::Adam adam(shards, torch::optim::AdamOptions(0.01));
  for (size_t l = 0; l < shards.size() && ckpt.step > 0; ++l) {
    auto state = std::make_unique<torch::optim::AdamParamState>();
    state->step(ckpt.step);
    state->exp_avg(ckpt.optim_state[l].at(0).clone());
    state->exp_avg_sq(ckpt.optim_state[l].at(1).clone());
    adam.state()[key_of(adam.state(), shards[l])] = std::move(state);
  }
  for (int s = 0; s < steps; ++s) {
    adam.zero_grad();
    torch::Tensor h = rows(p.x, r, n);
    for (size_t l = 0; l < ckpt.flats.size(); ++l) h = fsdp::sharded_forward(comm, ckpt.flats[l], kLayers[l], h);
    torch::mse_loss(h, rows(p.y, r, n)).backward();
    adam.step();
  }
  ckpt.optim_state.clear();
  for (const auto& shard : shards) {
    const auto& state = static_cast<const torch::optim::AdamParamState&>(*adam.state().at(key_of(adam.state(), shard)));
    ckpt.optim_state.push_back({state.exp_avg(), state.exp_avg_sq()});
    ckpt.step = state.step();
  }
  return ckpt;
}

fsdp::ShardedCheckpoint fresh(const Problem& p, int r, int n) {
  fsdp::ShardedCheckpoint ckpt;
  ckpt.flats = shard_layers(p, r, n);
  ckpt.optim_state.resize(ckpt.flats.size());  // no optimizer state yet
  return ckpt;
}

// K Adam steps on `a` ranks, save, load on `b` ranks, K more steps: every rank's gathered parameters.
std::vector<std::vector<torch::Tensor>> save_then_resume(const Problem& p, int a, int b, int k,
                                                         const std::string& dir) {
  dist::run_ranks(launch(a), [&](dist::Comm& comm) {
    fsdp::save_sharded(comm, dir, train(comm, p, fresh(p, comm.rank(), a), k));
  });
  std::vector<std::vector<torch::Tensor>> got(static_cast<size_t>(b));
  dist::run_ranks(launch(b), [&](dist::Comm& comm) {
    fsdp::ShardedCheckpoint ckpt = fsdp::load_sharded(comm, dir, shapes_of(p.layers));
    ckpt = train(comm, p, std::move(ckpt), k);
    got[static_cast<size_t>(comm.rank())] = gathered_params(comm, ckpt.flats);
  });
  return got;
}

}  // namespace

TEST_CASE("[step6] train K steps on N = a, save, load on N = b, K more steps: an uninterrupted run's parameters") {
  const Problem p = make_problem();
  const std::vector<torch::Tensor> reference = full_batch(p, Opt::kAdam, 4);
  REQUIRE(rel_error(full_batch(p, Opt::kAdam, 2), reference) > 1e-3);  // the second half moves them too
  for (const auto& [a, b] : std::vector<std::pair<int, int>>{{4, 2}, {2, 3}, {3, 3}}) {
    const auto got = save_then_resume(p, a, b, 2, fresh_dir("resume_" + std::to_string(a) + std::to_string(b)));
    for (int r = 0; r < b; ++r) {
      CAPTURE(a);
      CAPTURE(b);
      CAPTURE(r);
      const double rel = rel_error(got[static_cast<size_t>(r)], reference);
      CAPTURE(rel);
      CHECK(rel <= 1e-6);  // step 3's tolerance: Adam is elementwise, only the gradient sums change order
    }
  }
}

TEST_CASE("[step6] a resharded load holds exactly the saved elements, new padding zero, one file per rank") {
  const Problem p = make_problem();
  const std::string dir = fresh_dir("exact");
  std::vector<std::vector<torch::Tensor>> saved(4);
  dist::run_ranks(launch(4), [&](dist::Comm& comm) {
    fsdp::ShardedCheckpoint ckpt = fresh(p, comm.rank(), 4);
    for (size_t l = 0; l < ckpt.flats.size(); ++l) {  // state that tells every element apart: 1000 x l + position
      const fsdp::FlatParam& flat = ckpt.flats[l];
      const int64_t size = flat.padded_numel / 4;
      // Non-zero in the old padding too: a load must drop it, not carry it into the new shards.
      const at::Tensor pos = torch::arange(comm.rank() * size, (comm.rank() + 1) * size, torch::kFloat) + 1;
      ckpt.optim_state[l] = {pos + 1000 * static_cast<double>(l), -pos};
    }
    ckpt.step = 7;
    fsdp::save_sharded(comm, dir, ckpt);
  });
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files += entry.is_regular_file() ? 1 : 0;
  CHECK(files == 4);
  for (const int n : {2, 3}) {
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const int r = comm.rank();
      const fsdp::ShardedCheckpoint ckpt = fsdp::load_sharded(comm, dir, shapes_of(p.layers));
      CHECK(ckpt.step == 7);
      REQUIRE(ckpt.flats.size() == 3);
      for (size_t l = 0; l < 3; ++l) {
        CAPTURE(n);
        CAPTURE(l);
        const fsdp::FlatParam expected = fsdp::flatten_and_shard(p.layers[l], r, n);
        const fsdp::FlatParam& flat = ckpt.flats[l];
        CHECK(flat.rank == r);
        CHECK(flat.world_size == n);
        CHECK(flat.numel == expected.numel);
        CHECK(flat.padded_numel == expected.padded_numel);
        CHECK(flat.offsets == expected.offsets);
        CHECK(flat.shapes == expected.shapes);
        CHECK(flat.shard.is_leaf());
        CHECK(flat.shard.requires_grad());
        CHECK(torch::equal(flat.shard.detach(), expected.shard.detach()));  // bit for bit: copies, no arithmetic
        const int64_t size = flat.padded_numel / n;
        const at::Tensor padding = torch::arange(r * size, (r + 1) * size) >= flat.numel;
        const at::Tensor pos = torch::arange(r * size, (r + 1) * size, torch::kFloat) + 1;
        REQUIRE(ckpt.optim_state[l].size() == 2);
        CHECK(torch::equal(ckpt.optim_state[l][0], (pos + 1000 * static_cast<double>(l)).masked_fill(padding, 0)));
        CHECK(torch::equal(ckpt.optim_state[l][1], (-pos).masked_fill(padding, 0)));  // new padding: zeros
      }
    });
  }
}

TEST_CASE("[step6] the full state on rank 0 equals the unsharded parameters; the other ranks get none") {
  const Problem p = make_problem();
  for (const int n : {2, 3}) {
    std::vector<std::vector<torch::Tensor>> got(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      got[static_cast<size_t>(comm.rank())] = fsdp::full_state(comm, fresh(p, comm.rank(), n).flats);
    });
    CAPTURE(n);
    std::vector<torch::Tensor> expected;
    for (const auto& layer : p.layers) expected.insert(expected.end(), layer.begin(), layer.end());
    REQUIRE(got[0].size() == expected.size());
    for (size_t i = 0; i < expected.size(); ++i) CHECK(torch::equal(got[0][i], expected[i]));
    for (int r = 1; r < n; ++r) CHECK(got[static_cast<size_t>(r)].empty());
  }
}

namespace {

// The oracle of Adam's state: one process, the full batch, `steps` Adam steps as full_batch takes them; per
// parameter (in full_state's order) {exp_avg, exp_avg_sq}.
std::vector<std::vector<torch::Tensor>> full_batch_moments(const Problem& p, int steps) {
  std::vector<std::vector<torch::Tensor>> layers;
  std::vector<torch::Tensor> all;
  for (const auto& layer : p.layers) {
    layers.emplace_back();
    for (const auto& t : layer) {
      layers.back().push_back(t.clone().requires_grad_(true));
      all.push_back(layers.back().back());
    }
  }
  torch::optim::Adam adam(all, torch::optim::AdamOptions(0.01));
  for (int s = 0; s < steps; ++s) {
    adam.zero_grad();
    torch::Tensor h = p.x;
    for (size_t l = 0; l < layers.size(); ++l) h = kLayers[l](h, layers[l]);
    torch::mse_loss(h, p.y).backward();
    adam.step();
  }
  std::vector<std::vector<torch::Tensor>> out;
  for (const auto& t : all) {
    const auto& state = static_cast<const torch::optim::AdamParamState&>(*adam.state().at(key_of(adam.state(), t)));
    out.push_back({state.exp_avg().clone(), state.exp_avg_sq().clone()});
  }
  return out;
}

}  // namespace

TEST_CASE("[step6] Adam's moments in full on rank 0 equal one process's; the other ranks get none") {
  const Problem p = make_problem();
  const std::vector<std::vector<torch::Tensor>> reference = full_batch_moments(p, 2);
  for (const int n : {2, 3}) {
    std::vector<std::vector<std::vector<torch::Tensor>>> got(static_cast<size_t>(n));
    std::vector<int64_t> sent(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const fsdp::ShardedCheckpoint ckpt = train(comm, p, fresh(p, comm.rank(), n), 2);
      comm.reset_stats();
      got[static_cast<size_t>(comm.rank())] = fsdp::full_optim_state(comm, ckpt.flats, ckpt.optim_state);
      sent[static_cast<size_t>(comm.rank())] = comm.stats().send_bytes;
    });
    CAPTURE(n);
    REQUIRE(got[0].size() == reference.size());  // one list per parameter: 3 weights and 3 biases
    for (size_t k = 0; k < 2; ++k) {
      CAPTURE(k);  // 0: exp_avg, 1: exp_avg_sq
      std::vector<torch::Tensor> mine, theirs;
      for (size_t i = 0; i < reference.size(); ++i) {
        REQUIRE(got[0][i].size() == 2);
        mine.push_back(got[0][i][k]);
        theirs.push_back(reference[i][k]);
      }
      const double rel = rel_error(mine, theirs);  // the shapes too: rel_error requires them equal
      CAPTURE(rel);
      CHECK(rel <= 1e-6);  // the gradients' float32 sums in another order, as in step 3; the gathers only copy
    }
    int64_t bytes = 0;  // per layer, two gathers of its padded state: (N - 1) x S floats each
    for (int l = 0; l < 3; ++l) bytes += 2 * (n - 1) * shard_of(kLayerNumel[l], n) * 4;
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(sent[static_cast<size_t>(r)] == bytes);
      if (r > 0) CHECK(got[static_cast<size_t>(r)].empty());
    }
  }
}

TEST_CASE("[step6] Adam's full state: a bad state on one rank is refused on every rank, by name") {
  const Problem p = make_problem();
  // Every layer's state: `k` tensors of zeros, the shard's length (one element more in layer 1's first on
  // rank 1 when `long_on_rank1`).
  const auto run = [&](bool long_on_rank1, size_t k_on_rank1) {
    return [&p, long_on_rank1, k_on_rank1](dist::Comm& comm) {
      fsdp::ShardedCheckpoint ckpt = fresh(p, comm.rank(), 2);
      const size_t k = comm.rank() == 1 ? k_on_rank1 : 2;
      for (size_t l = 0; l < ckpt.flats.size(); ++l) {
        for (size_t i = 0; i < k; ++i) ckpt.optim_state[l].push_back(torch::zeros({ckpt.flats[l].shard.numel()}));
      }
      if (comm.rank() == 1 && long_on_rank1) ckpt.optim_state[1][0] = torch::zeros({ckpt.flats[1].shard.numel() + 1});
      fsdp::full_optim_state(comm, ckpt.flats, ckpt.optim_state);
    };
  };
  check_fails_on_every_rank(2, run(true, 2), "on rank 1: a state tensor of layer 1 has 105 elements, but");
  check_fails_on_every_rank(2, run(false, 1), "the ranks disagree on the state they gather");
}

TEST_CASE("[step6] a checkpoint of another model is refused by name on every rank") {
  const Problem p = make_problem();
  const std::string dir = fresh_dir("other_model");
  dist::run_ranks(launch(2), [&](dist::Comm& comm) { fsdp::save_sharded(comm, dir, fresh(p, comm.rank(), 2)); });
  auto shapes = shapes_of(p.layers);
  shapes[1][0] = {13, 16};  // one weight of another shape: the same layer count, a different model
  check_fails_on_every_rank(
      3, [&](dist::Comm& comm) { fsdp::load_sharded(comm, dir, shapes); }, "was saved for another model");
  shapes = shapes_of(p.layers);
  shapes.pop_back();  // one layer fewer
  check_fails_on_every_rank(
      2, [&](dist::Comm& comm) { fsdp::load_sharded(comm, dir, shapes); }, "was saved for another model");
}

TEST_CASE("[step6] a file that is not a sharded checkpoint is refused by name on every rank") {
  const Problem p = make_problem();
  const std::string dir = fresh_dir("foreign");
  std::filesystem::create_directories(dir);
  torch::save(std::vector<torch::Tensor>{torch::zeros({6}, torch::kLong)}, dir + "/rank_0.pt");  // no format number
  check_fails_on_every_rank(
      2, [&](dist::Comm& comm) { fsdp::load_sharded(comm, dir, shapes_of(p.layers)); }, "is not a sharded checkpoint");
  // A checkpoint of this layout whose format number is another (the header's first element, one more): another
  // version of the format, refused by its number even where every size agrees.
  const std::string other = fresh_dir("other_format");
  dist::run_ranks(launch(1), [&](dist::Comm& comm) { fsdp::save_sharded(comm, other, fresh(p, 0, 1)); });
  std::vector<torch::Tensor> file;
  torch::load(file, other + "/rank_0.pt");
  REQUIRE_FALSE(file.empty());
  file[0] = file[0].clone();
  file[0][0] += 1;
  torch::save(file, other + "/rank_0.pt");
  check_fails_on_every_rank(
      2, [&](dist::Comm& comm) { fsdp::load_sharded(comm, other, shapes_of(p.layers)); },
      "is not a sharded checkpoint");
}

TEST_CASE("[step6] a missing rank file is refused by name on every rank, not a hang") {
  const Problem p = make_problem();
  const std::string dir = fresh_dir("missing");
  dist::run_ranks(launch(3), [&](dist::Comm& comm) { fsdp::save_sharded(comm, dir, fresh(p, comm.rank(), 3)); });
  std::filesystem::remove(std::filesystem::path(dir) / "rank_2.pt");
  check_fails_on_every_rank(
      2, [&](dist::Comm& comm) { fsdp::load_sharded(comm, dir, shapes_of(p.layers)); }, "missing rank file");
  check_fails_on_every_rank(
      2, [&](dist::Comm& comm) { fsdp::load_sharded(comm, fresh_dir("empty"), shapes_of(p.layers)); },
      "missing rank file");
}

TEST_CASE("[step6] full_state and full_optim_state: a fault or another model on rank 1 only fails every rank") {
  const Problem p = make_problem();
  // Rank 1's layers: `layers_on_rank1` sharded for (rank, world size) = `made_for`; rank 0's are the problem's.
  // Each rank passes two state tensors of its own shards' length to full_optim_state.
  const auto run = [&p](std::vector<std::vector<torch::Tensor>> layers_on_rank1, std::pair<int, int> made_for,
                        bool optim) {
    return [&p, layers_on_rank1, made_for, optim](dist::Comm& comm) {
      const bool one = comm.rank() == 1;
      std::vector<fsdp::FlatParam> flats;
      std::vector<std::vector<torch::Tensor>> state;
      for (const auto& layer : one ? layers_on_rank1 : p.layers) {
        flats.push_back(fsdp::flatten_and_shard(layer, one ? made_for.first : 0, one ? made_for.second : 2));
        state.push_back({torch::zeros({flats.back().shard.numel()}), torch::ones({flats.back().shard.numel()})});
      }
      if (optim) {
        fsdp::full_optim_state(comm, flats, state);
      } else {
        fsdp::full_state(comm, flats);
      }
    };
  };
  std::vector<std::vector<torch::Tensor>> fewer(p.layers.begin(), p.layers.end() - 1), transposed = p.layers,
                                                                                       wider = p.layers;
  transposed[1][0] = transposed[1][0].t().contiguous();     // the same sizes, another shape
  wider[1] = {torch::zeros({14, 15}), torch::zeros({14})};  // 224 elements instead of 208
  for (const bool optim : {false, true}) {
    CAPTURE(optim);
    const std::string op = optim ? "full_optim_state: " : "full_state: ";
    const std::string disagree = op + (optim ? "the ranks disagree on the state" : "the ranks disagree on the layers");
    // Rank 0's FlatParams on rank 1, or FlatParams made for 3 ranks: rank 1 alone would throw in its first gather.
    check_fails_on_every_rank(2, run(p.layers, {0, 2}, optim), op + "on rank 1: FlatParam 0 was made for rank 0 of 2");
    check_fails_on_every_rank(2, run(p.layers, {1, 3}, optim), op + "on rank 1: FlatParam 0 was made for rank 1 of 3");
    // A layer fewer (rank 0 would wait in its third gather), a layer of another size (gathers of different
    // sizes: Gloo aborts the process), a weight of another shape (the gathers match, the result is wrong).
    check_fails_on_every_rank(2, run(fewer, {1, 2}, optim), disagree);
    check_fails_on_every_rank(2, run(wider, {1, 2}, optim), disagree);
    check_fails_on_every_rank(2, run(transposed, {1, 2}, optim), disagree);
  }
}

TEST_CASE("[step6] save_sharded: a fault or another checkpoint on rank 1 only fails every rank; nothing written") {
  const Problem p = make_problem();
  // Every rank saves the problem's layers at step 3 with two state tensors per layer; `spoil` changes rank 1's.
  using Spoil = std::function<void(fsdp::ShardedCheckpoint&)>;
  const auto run = [&p](const std::string& dir, const Spoil& spoil) {
    return [&p, dir, spoil](dist::Comm& comm) {
      fsdp::ShardedCheckpoint ckpt = fresh(p, comm.rank(), 2);
      ckpt.step = 3;
      for (size_t l = 0; l < ckpt.flats.size(); ++l) {
        const int64_t s = ckpt.flats[l].shard.numel();
        ckpt.optim_state[l] = {torch::zeros({s}), torch::ones({s})};
      }
      if (comm.rank() == 1) spoil(ckpt);
      fsdp::save_sharded(comm, dir, ckpt);
    };
  };
  std::vector<torch::Tensor> transposed = p.layers[1];
  transposed[0] = transposed[0].t().contiguous();  // the same sizes, another shape
  const std::vector<std::pair<Spoil, std::string>> faults{
      {[&p](fsdp::ShardedCheckpoint& c) { c.flats[0] = fsdp::flatten_and_shard(p.layers[0], 0, 2); },
       "on rank 1: FlatParam 0 was made for rank 0 of 2"},
      {[&p](fsdp::ShardedCheckpoint& c) { c.flats[2] = fsdp::flatten_and_shard(p.layers[2], 1, 3); },
       "on rank 1: FlatParam 2 was made for rank 1 of 3"},
      {[](fsdp::ShardedCheckpoint& c) { c.optim_state.pop_back(); },
       "on rank 1: one state list per FlatParam: 3 FlatParams, 2 state lists"},
      {[](fsdp::ShardedCheckpoint& c) { c.optim_state[1].pop_back(); },
       "on rank 1: layer 1 has 1 state tensors, but layer 0 has 2"},
      {[](fsdp::ShardedCheckpoint& c) { c.optim_state[2][1] = torch::zeros({c.flats[2].shard.numel() + 1}); },
       "on rank 1: a state tensor of layer 2 has " + std::to_string(shard_of(kLayerNumel[2], 2) + 1) + " elements"},
      {[](fsdp::ShardedCheckpoint& c) { c.optim_state[0][0] = torch::Tensor(); },
       "on rank 1: a state tensor of layer 0 has 0 elements"},
      {[](fsdp::ShardedCheckpoint& c) { c.step = 4; }, "the ranks disagree on the checkpoint they save"},
      {[](fsdp::ShardedCheckpoint& c) {
         c.flats.pop_back();
         c.optim_state.pop_back();
       },
       "the ranks disagree on the checkpoint they save"},
      {[&transposed](fsdp::ShardedCheckpoint& c) { c.flats[1] = fsdp::flatten_and_shard(transposed, 1, 2); },
       "the ranks disagree on the checkpoint they save"},
      {[](fsdp::ShardedCheckpoint& c) {
         for (auto& state : c.optim_state) state.clear();
       },
       "the ranks disagree on the checkpoint they save"},
  };
  for (size_t f = 0; f < faults.size(); ++f) {
    CAPTURE(f);
    const std::string dir = fresh_dir("save_fault_" + std::to_string(f));
    check_fails_on_every_rank(2, run(dir, faults[f].first), "save_sharded: " + faults[f].second);
    // Refused before anyone wrote: no rank file of a checkpoint that could not be whole.
    CHECK_FALSE(std::filesystem::exists(std::filesystem::path(dir) / "rank_0.pt"));
    CHECK_FALSE(std::filesystem::exists(std::filesystem::path(dir) / "rank_1.pt"));
  }
}

TEST_CASE("[step6] save_sharded: a write that fails on one rank only fails every rank, by name") {
  const Problem p = make_problem();
  for (const int bad : {0, 1, 2}) {
    CAPTURE(bad);
    const std::string dir = fresh_dir("unwritable_" + std::to_string(bad));
    const std::string file = dir + "/rank_" + std::to_string(bad) + ".pt";
    std::filesystem::create_directories(file);  // a folder where that rank's file goes: its write fails, no other
    check_fails_on_every_rank(
        3, [&](dist::Comm& comm) { fsdp::save_sharded(comm, dir, fresh(p, comm.rank(), 3)); },
        "save_sharded: on rank " + std::to_string(bad) + ": could not write " + file);
  }
}

namespace {

// Saves `layers` sharded on `n` ranks into `dir` at optimizer step `step`, with two state tensors per layer.
void save_model(const std::vector<std::vector<torch::Tensor>>& layers, int n, int64_t step, const std::string& dir) {
  dist::run_ranks(launch(n), [&](dist::Comm& comm) {
    fsdp::ShardedCheckpoint ckpt;
    for (const auto& layer : layers) {
      ckpt.flats.push_back(fsdp::flatten_and_shard(layer, comm.rank(), n));
      const int64_t size = ckpt.flats.back().shard.numel();
      ckpt.optim_state.push_back({torch::full({size}, 0.5), torch::full({size}, 0.25)});
    }
    ckpt.step = step;
    fsdp::save_sharded(comm, dir, ckpt);
  });
}

}  // namespace

TEST_CASE("[step6] a leftover rank file of another run is refused on every rank, whatever files a rank reads") {
  const Problem p = make_problem();
  const std::vector<std::vector<torch::Tensor>> fewer(p.layers.begin(), p.layers.end() - 1);
  std::vector<std::vector<torch::Tensor>> transposed = p.layers;
  transposed[1][0] = transposed[1][0].t().contiguous();  // the same sizes, another shape
  struct Leftover {
    std::string name;
    std::function<void(const std::string& dir, const std::string& other)> make;  // writes other/rank_1.pt
    std::string expected;
  };
  const std::vector<Leftover> leftovers{
      {"another step", [&](const auto&, const auto& other) { save_model(p.layers, 2, 3, other); },
       "rank_1.pt does not belong to the checkpoint of"},
      {"another world size", [&](const auto&, const auto& other) { save_model(p.layers, 3, 7, other); },
       "rank_1.pt does not belong to the checkpoint of"},
      {"another model", [&](const auto&, const auto& other) { save_model(fewer, 2, 7, other); },
       "rank_1.pt does not belong to the checkpoint of"},
      {"another model of as many layers and elements",
       [&](const auto&, const auto& other) { save_model(transposed, 2, 7, other); },
       "rank_1.pt does not belong to the checkpoint of"},
      {"rank 0's file renamed",
       [](const auto& dir, const auto& other) {
         std::filesystem::create_directories(other);
         std::filesystem::copy_file(dir + "/rank_0.pt", other + "/rank_1.pt");
       },
       "rank_1.pt is not rank 1"},
      {"a shard of another length",
       [&](const auto&, const auto& other) {
         dist::run_ranks(launch(2), [&](dist::Comm& comm) {
           fsdp::ShardedCheckpoint ckpt;
           ckpt.flats = shard_layers(p, comm.rank(), 2);
           ckpt.flats[1].shard = torch::zeros({ckpt.flats[1].shard.numel() + 1});
           ckpt.optim_state.resize(3);
           for (size_t l = 0; l < 3; ++l) {
             const int64_t size = ckpt.flats[l].padded_numel / 2;
             ckpt.optim_state[l] = {torch::full({size}, 0.5), torch::full({size}, 0.25)};
           }
           ckpt.step = 7;
           fsdp::save_sharded(comm, other, ckpt);
         });
       },
       "layer 1 of rank file 1 has 105 elements, but 2 ranks need 104"},
  };
  for (const Leftover& leftover : leftovers) {
    CAPTURE(leftover.name);
    const std::string dir = fresh_dir("leftover"), other = fresh_dir("leftover_other");
    save_model(p.layers, 2, 7, dir);
    leftover.make(dir, other);
    std::filesystem::copy_file(other + "/rank_1.pt", dir + "/rank_1.pt",
                               std::filesystem::copy_options::overwrite_existing);
    // On 2 ranks each reads only its own old file's range; on 1 and 3, others: every rank must see the fault.
    for (const int n : {1, 2, 3}) {
      CAPTURE(n);
      check_fails_on_every_rank(
          n, [&](dist::Comm& comm) { fsdp::load_sharded(comm, dir, shapes_of(p.layers)); }, leftover.expected);
    }
  }
}

TEST_CASE("[step6] reshards at the extremes: N = 1 on either side, new ranks whose shard is all padding, 7 on 3 -> 5") {
  // A layer of 7 elements ([2, 3] and [1]) and one of a single element: on 5 ranks the first pads 7 to 10 (rank
  // 3 holds one element and a zero, rank 4 only padding), the second leaves ranks 1 to 4 with padding only.
  torch::manual_seed(3);
  const std::vector<std::vector<torch::Tensor>> layers{{torch::randn({2, 3}), torch::randn({1})}, {torch::randn({1})}};
  for (const auto& [a, b] : std::vector<std::pair<int, int>>{{3, 5}, {5, 3}, {1, 3}, {3, 1}, {1, 5}, {5, 1}, {2, 7}}) {
    CAPTURE(a);
    CAPTURE(b);
    const std::string dir = fresh_dir("extremes");
    dist::run_ranks(launch(a), [&](dist::Comm& comm) {
      fsdp::ShardedCheckpoint ckpt;
      for (size_t l = 0; l < layers.size(); ++l) {
        ckpt.flats.push_back(fsdp::flatten_and_shard(layers[l], comm.rank(), a));
        const int64_t size = ckpt.flats.back().padded_numel / a;
        // State that tells every element apart (non-zero in the old padding too: a load must drop it).
        const at::Tensor pos = torch::arange(comm.rank() * size, (comm.rank() + 1) * size, torch::kFloat) + 1;
        ckpt.optim_state.push_back({pos + 100 * static_cast<double>(l)});
      }
      ckpt.step = 5;
      fsdp::save_sharded(comm, dir, ckpt);
    });
    dist::run_ranks(launch(b), [&](dist::Comm& comm) {
      const int r = comm.rank();
      const fsdp::ShardedCheckpoint ckpt = fsdp::load_sharded(comm, dir, shapes_of(layers));
      CHECK(ckpt.step == 5);
      REQUIRE(ckpt.flats.size() == layers.size());
      for (size_t l = 0; l < layers.size(); ++l) {
        CAPTURE(r);
        CAPTURE(l);
        const fsdp::FlatParam expected = fsdp::flatten_and_shard(layers[l], r, b);
        const fsdp::FlatParam& flat = ckpt.flats[l];
        CHECK(flat.padded_numel == expected.padded_numel);
        CHECK(torch::equal(flat.shard.detach(), expected.shard.detach()));  // new padding: zeros
        const int64_t size = flat.padded_numel / b;
        const at::Tensor padding = torch::arange(r * size, (r + 1) * size) >= flat.numel;
        const at::Tensor pos = torch::arange(r * size, (r + 1) * size, torch::kFloat) + 1;
        REQUIRE(ckpt.optim_state[l].size() == 1);
        CHECK(torch::equal(ckpt.optim_state[l][0], (pos + 100 * static_cast<double>(l)).masked_fill(padding, 0)));
      }
    });
  }
}

TEST_CASE("[step6] parameters straight from torch::nn modules: sharded, saved on 2 ranks, loaded on 3, in full again") {
  torch::manual_seed(5);
  const torch::nn::Linear first(8, 15), second(15, 13);  // their parameters require grad
  const std::vector<std::vector<torch::Tensor>> layers{first->parameters(), second->parameters()};
  const std::string dir = fresh_dir("modules");
  dist::run_ranks(launch(2), [&](dist::Comm& comm) {
    fsdp::ShardedCheckpoint ckpt;
    for (const auto& layer : layers) ckpt.flats.push_back(fsdp::flatten_and_shard(layer, comm.rank(), 2));
    ckpt.optim_state.resize(ckpt.flats.size());
    fsdp::save_sharded(comm, dir, ckpt);
  });
  std::vector<torch::Tensor> got;
  dist::run_ranks(launch(3), [&](dist::Comm& comm) {
    const fsdp::ShardedCheckpoint ckpt = fsdp::load_sharded(comm, dir, shapes_of(layers));
    std::vector<torch::Tensor> full = fsdp::full_state(comm, ckpt.flats);
    if (comm.rank() == 0) got = std::move(full);
  });
  std::vector<torch::Tensor> expected;
  for (const auto& layer : layers) expected.insert(expected.end(), layer.begin(), layer.end());
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(i);
    CHECK(torch::equal(got[i], expected[i].detach()));
  }
}
