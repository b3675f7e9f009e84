// Checks for lesson 7, step 3: gather on demand, reduce-scatter in the backward, sharded optimizer steps.
// Run: bazel test //lesson7_fsdp:fsdp_step3_test
#include "lesson7_fsdp/fsdp_test_helpers.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/torch.h>

#include "lesson5_distributed/comm.h"
#include "lesson7_fsdp/fsdp.h"

using fsdp_checks::Contains;
using fsdp_checks::launch;

namespace {

// [problem]
// A small MLP regression problem: 8 -> 15 -> 13 -> 4 (tanh between), three layers of 135, 208 and 56 floats, so
// that N = 2 and N = 3 both need padding; 12 items, so that every rank of 2 or 3 gets an equal slice.
constexpr int64_t kItems = 12;
const std::vector<int64_t> kLayerNumel{8 * 15 + 15, 15 * 13 + 13, 13 * 4 + 4};

struct Problem {
  std::vector<std::vector<torch::Tensor>> layers;  // each layer's {weight, bias}, as initialised
  torch::Tensor x, y;                              // [12, 8], [12, 4]
};

Problem make_problem(uint64_t seed = 11) {
  torch::manual_seed(seed);
  Problem p;
  for (const auto& [in, out] : std::vector<std::pair<int64_t, int64_t>>{{8, 15}, {15, 13}, {13, 4}}) {
    torch::nn::Linear layer(in, out);
    p.layers.push_back({layer->weight.detach().clone(), layer->bias.detach().clone()});
  }
  p.x = torch::randn({kItems, 8});
  p.y = torch::randn({kItems, 4});
  return p;
}

torch::Tensor hidden(const torch::Tensor& x, const std::vector<torch::Tensor>& p) {
  return torch::tanh(torch::nn::functional::linear(x, p[0], p[1]));
}
torch::Tensor last(const torch::Tensor& x, const std::vector<torch::Tensor>& p) {
  return torch::nn::functional::linear(x, p[0], p[1]);
}
const std::vector<fsdp::LayerFn> kLayers{hidden, hidden, last};
// [problem]

enum class Opt { kSgd, kAdam };

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<torch::Tensor>& params, Opt opt) {
  if (opt == Opt::kSgd) return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1));
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
}

// The oracle: one process, the full batch, the same layers and optimizer. The parameters after `steps` steps.
std::vector<torch::Tensor> full_batch(const Problem& p, Opt opt, int steps) {
  std::vector<std::vector<torch::Tensor>> layers;
  std::vector<torch::Tensor> all;
  for (const auto& layer : p.layers) {
    layers.emplace_back();
    for (const auto& t : layer) {
      layers.back().push_back(t.clone().requires_grad_(true));
      all.push_back(layers.back().back());
    }
  }
  auto optimizer = make_optimizer(all, opt);
  for (int s = 0; s < steps; ++s) {
    optimizer->zero_grad();
    torch::Tensor h = p.x;
    for (size_t l = 0; l < layers.size(); ++l) h = kLayers[l](h, layers[l]);
    torch::mse_loss(h, p.y).backward();
    optimizer->step();
  }
  std::vector<torch::Tensor> out;
  for (const auto& t : all) out.push_back(t.detach().clone());
  return out;
}

// One rank's slice of the batch: rows [r * B / n, (r + 1) * B / n).
torch::Tensor rows(const torch::Tensor& t, int r, int n) { return t.narrow(0, r * kItems / n, kItems / n); }

// `steps` sharded steps on this rank; returns every parameter gathered back (in the oracle's order).
std::vector<torch::Tensor> sharded_training(dist::Comm& comm, const Problem& p, Opt opt, int steps) {
  const int r = comm.rank(), n = comm.world_size();
  std::vector<fsdp::FlatParam> flats;
  for (const auto& layer : p.layers) flats.push_back(fsdp::flatten_and_shard(layer, r, n));
  std::vector<torch::Tensor> shards;
  for (auto& flat : flats) shards.push_back(flat.shard);
  auto optimizer = make_optimizer(shards, opt);  // the optimizer sees only this rank's slices
  for (int s = 0; s < steps; ++s) {
    optimizer->zero_grad();
    torch::Tensor h = rows(p.x, r, n);
    for (size_t l = 0; l < flats.size(); ++l) h = fsdp::sharded_forward(comm, flats[l], kLayers[l], h);
    torch::mse_loss(h, rows(p.y, r, n)).backward();
    optimizer->step();
  }
  std::vector<torch::Tensor> out;
  for (const auto& flat : flats) {
    for (const auto& v : fsdp::unflatten(flat, fsdp::gather_full(comm, flat))) out.push_back(v.clone());
  }
  return out;
}

// max |a - b| / max |b| over every element of the lists.
double rel_error(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].sizes() == b[i].sizes());
    diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
    scale = std::max(scale, b[i].abs().max().item<double>());
  }
  return diff / scale;
}

int64_t shard_of(int64_t numel, int n) { return fsdp::padded_numel(numel, n) / n; }

}  // namespace

TEST_CASE("[step3] K sharded steps on N ranks equal K full-batch steps of one process (SGD and Adam)") {
  const Problem p = make_problem();
  for (const Opt opt : {Opt::kSgd, Opt::kAdam}) {
    const std::vector<torch::Tensor> reference = full_batch(p, opt, 3);
    const std::vector<torch::Tensor> start = full_batch(p, opt, 0);
    REQUIRE(rel_error(start, reference) > 1e-3);  // the steps move the parameters, far beyond the tolerance
    for (const int n : {2, 3}) {
      std::vector<std::vector<torch::Tensor>> got(static_cast<size_t>(n));
      dist::run_ranks(launch(n), [&](dist::Comm& comm) {
        got[static_cast<size_t>(comm.rank())] = sharded_training(comm, p, opt, 3);
      });
      for (int r = 0; r < n; ++r) {
        CAPTURE(n);
        CAPTURE(r);
        CAPTURE(opt == Opt::kSgd ? "SGD" : "Adam");
        const double rel = rel_error(got[static_cast<size_t>(r)], reference);
        CAPTURE(rel);
        CHECK(rel <= 1e-6);  // float32 sums in another order: a few units of 2^-23 (the page says why)
      }
    }
  }
}

TEST_CASE("[step3] per layer and step: one all-gather in the forward, one in the backward, one reduce-scatter") {
  const Problem p = make_problem();
  for (const int n : {2, 3}) {
    std::vector<std::vector<std::string>> forward_log(static_cast<size_t>(n)), step_log(static_cast<size_t>(n));
    std::vector<dist::CommStats> stats(static_cast<size_t>(n));
    dist::run_ranks(launch(n), [&](dist::Comm& comm) {
      const int r = comm.rank();
      std::vector<fsdp::FlatParam> flats;
      for (const auto& layer : p.layers) flats.push_back(fsdp::flatten_and_shard(layer, r, n));
      comm.reset_stats();
      torch::Tensor h = rows(p.x, r, n);
      for (size_t l = 0; l < flats.size(); ++l) h = fsdp::sharded_forward(comm, flats[l], kLayers[l], h);
      forward_log[static_cast<size_t>(r)] = comm.log();
      torch::mse_loss(h, rows(p.y, r, n)).backward();
      step_log[static_cast<size_t>(r)] = comm.log();
      stats[static_cast<size_t>(r)] = comm.stats();
      for (const auto& flat : flats) {  // the gradient of each slice, and nothing bigger
        REQUIRE(flat.shard.grad().defined());
        CHECK(flat.shard.grad().numel() == flat.padded_numel / n);
      }
    });
    // Each ring is N - 1 sends of one shard: the sends of the forward, then of the backward, layer by layer.
    const auto sends = [&](const std::vector<int>& layers) {
      std::vector<std::string> out;
      for (const int l : layers) {
        for (int i = 0; i < n - 1; ++i) out.push_back("send " + std::to_string(4 * shard_of(kLayerNumel[l], n)));
      }
      return out;
    };
    const auto only_sends = [](const std::vector<std::string>& log) {
      std::vector<std::string> out;
      for (const auto& entry : log) {
        if (entry.rfind("send ", 0) == 0) out.push_back(entry);
      }
      return out;
    };
    int64_t bytes = 0;
    for (int l = 0; l < 3; ++l) bytes += 3 * (n - 1) * shard_of(kLayerNumel[l], n) * 4;
    for (int r = 0; r < n; ++r) {
      CAPTURE(n);
      CAPTURE(r);
      // Forward: layer 0, 1, 2 gathered in turn. Backward: layer 2 gathered then reduce-scattered, then 1, then 0.
      CHECK(only_sends(forward_log[static_cast<size_t>(r)]) == sends({0, 1, 2}));
      CHECK(only_sends(step_log[static_cast<size_t>(r)]) == sends({0, 1, 2, 2, 2, 1, 1, 0, 0}));
      const dist::CommStats& s = stats[static_cast<size_t>(r)];
      CHECK(s.send_calls == 9 * (n - 1));
      CHECK(s.send_bytes == bytes);  // 3 (N - 1) / N x the padded bytes of every layer
      CHECK(s.all_reduce_calls == 0);
    }
  }
}

TEST_CASE("[step3] a layer's full parameters are freed as soon as the forward, and the backward, are done") {
  const Problem p = make_problem();
  const int n = 2;
  dist::run_ranks(launch(n), [&](dist::Comm& comm) {
    fsdp::FlatParam flat = fsdp::flatten_and_shard(p.layers[1], comm.rank(), n);
    // The layer function sees the parameters it is given: note their storage (weakly: the note keeps nothing).
    std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> seen;
    std::vector<size_t> seen_bytes;
    const fsdp::LayerFn watched = [&](const torch::Tensor& x, const std::vector<torch::Tensor>& params) {
      seen.push_back(params[0].storage().getWeakStorageImpl());
      seen_bytes.push_back(params[0].storage().nbytes());
      return hidden(x, params);
    };
    const torch::Tensor x = torch::randn({4, 15}).requires_grad_(true);
    const torch::Tensor y = fsdp::sharded_forward(comm, flat, watched, x);
    REQUIRE(seen.size() == 1);
    CHECK(seen_bytes[0] == static_cast<size_t>(flat.padded_numel * 4));  // views of the whole gathered buffer
    CHECK(seen[0].expired());                                            // ... gone once the forward returned
    y.sum().backward();
    REQUIRE(seen.size() == 2);  // gathered again for the backward
    CHECK(seen_bytes[1] == static_cast<size_t>(flat.padded_numel * 4));
    CHECK(seen[1].expired());  // ... and gone again
    CHECK(x.grad().defined());
    CHECK(x.grad().sizes() == x.sizes());
  });
}

TEST_CASE("[step3] a shard that does not require grad is refused by name") {
  const Problem p = make_problem();
  const std::vector<dist::RankOutcome> outcomes = dist::run_ranks_collect(launch(1), [&](dist::Comm& comm) {
    fsdp::FlatParam flat = fsdp::flatten_and_shard(p.layers[0], 0, 1);
    flat.shard = flat.shard.detach();
    fsdp::sharded_forward(comm, flat, kLayers[0], p.x);
  });
  REQUIRE(outcomes.size() == 1);
  CHECK_FALSE(outcomes[0].ok);
  CHECK(outcomes[0].error.find("requires grad") != std::string::npos);
}
