// Lesson 7's training problem, shared by the checks of steps 3 and 4: a seeded MLP, its data, the full-batch
// oracle of one process, and one rank's sharded training loop.
#pragma once

#include "lesson7_fsdp/fsdp_test_helpers.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "lesson5_distributed/comm.h"
#include "lesson7_fsdp/fsdp.h"

namespace fsdp_checks {

// [problem]
// A small MLP regression problem: 8 -> 15 -> 13 -> 4 (tanh between), three layers of 135, 208 and 56 floats, so
// that N = 2 and N = 3 both need padding; 12 items, so that every rank of 2 or 3 gets an equal slice.
constexpr int64_t kItems = 12;
const std::vector<int64_t> kLayerNumel{8 * 15 + 15, 15 * 13 + 13, 13 * 4 + 4};

struct Problem {
  std::vector<std::vector<torch::Tensor>> layers;  // each layer's {weight, bias}, as initialised
  torch::Tensor x, y;                              // [12, 8], [12, 4]
};

inline Problem make_problem(uint64_t seed = 11) {
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

inline torch::Tensor hidden(const torch::Tensor& x, const std::vector<torch::Tensor>& p) {
  return torch::tanh(torch::nn::functional::linear(x, p[0], p[1]));
}
inline torch::Tensor last(const torch::Tensor& x, const std::vector<torch::Tensor>& p) {
  return torch::nn::functional::linear(x, p[0], p[1]);
}
inline const std::vector<fsdp::LayerFn> kLayers{hidden, hidden, last};
// [problem]

// A middle layer that ignores its parameters (an expert no item was routed to, say): its parameters get no
// gradient through it, so the rank that runs it must send zeros as its share.
inline torch::Tensor ignores_params(const torch::Tensor& x, const std::vector<torch::Tensor>&) {
  return torch::tanh(x.narrow(1, 0, 13));
}

enum class Opt { kSgd, kAdam };

// The optimizer's name, for a check's message (CAPTURE(name_of(opt)) prints the text, not a pointer).
inline std::string name_of(Opt opt) { return opt == Opt::kSgd ? "SGD" : "Adam"; }

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<torch::Tensor>& params, Opt opt) {
  if (opt == Opt::kSgd) return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1));
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
}

// The oracle: one process, the full batch, the same layers and optimizer. The parameters after `steps` steps.
inline std::vector<torch::Tensor> full_batch(const Problem& p, Opt opt, int steps) {
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

// The oracle's gradient at the initial parameters: one process, the full batch. Per layer, its parameters'
// gradients laid end to end and padded with zeros to padded_numel(numel, n): a FlatParam's layout on n ranks.
inline std::vector<torch::Tensor> full_batch_flat_grads(const Problem& p, int n) {
  std::vector<std::vector<torch::Tensor>> layers;
  for (const auto& layer : p.layers) {
    layers.emplace_back();
    for (const auto& t : layer) layers.back().push_back(t.clone().requires_grad_(true));
  }
  torch::Tensor h = p.x;
  for (size_t l = 0; l < layers.size(); ++l) h = kLayers[l](h, layers[l]);
  torch::mse_loss(h, p.y).backward();
  std::vector<torch::Tensor> out;
  for (const auto& layer : layers) {
    std::vector<torch::Tensor> pieces;
    int64_t numel = 0;
    for (const auto& t : layer) {
      pieces.push_back(t.grad().reshape({-1}));
      numel += t.numel();
    }
    pieces.push_back(torch::zeros({fsdp::padded_numel(numel, n) - numel}));
    out.push_back(torch::cat(pieces));
  }
  return out;
}

// Rank r's flat, padded shard of every layer of `p` (step 2), and the master shards they hold: the tensors the
// rank's optimizer steps on.
inline std::vector<fsdp::FlatParam> shard_layers(const Problem& p, int r, int n) {
  std::vector<fsdp::FlatParam> flats;
  for (const auto& layer : p.layers) flats.push_back(fsdp::flatten_and_shard(layer, r, n));
  return flats;
}
inline std::vector<torch::Tensor> master_shards(const std::vector<fsdp::FlatParam>& flats) {
  std::vector<torch::Tensor> shards;
  for (const auto& flat : flats) shards.push_back(flat.shard);
  return shards;
}

// One rank's slice of the batch: rows [r * B / n, (r + 1) * B / n).
inline torch::Tensor rows(const torch::Tensor& t, int r, int n) { return t.narrow(0, r * kItems / n, kItems / n); }
// Micro-batch m of `micro` of rank r's rows (rank r's rows split in equal parts).
inline torch::Tensor micro_rows(const torch::Tensor& t, int r, int n, int m, int micro) {
  const int64_t size = kItems / n / micro;
  return rows(t, r, n).narrow(0, m * size, size);
}

// Whether every rank's accumulated shard gradients equal their slices of the full batch's (full_batch_flat_grads):
// per rank and layer, max |got - expected| / max |expected of the layer| <= tolerance.
inline void check_full_batch_grads(const std::vector<std::vector<torch::Tensor>>& got,
                                   const std::vector<torch::Tensor>& expected, double tolerance) {
  const int n = static_cast<int>(got.size());
  for (int r = 0; r < n; ++r) {
    REQUIRE(got[static_cast<size_t>(r)].size() == expected.size());
    for (size_t l = 0; l < expected.size(); ++l) {
      CAPTURE(n);
      CAPTURE(r);
      CAPTURE(l);
      const int64_t size = expected[l].numel() / n;
      const torch::Tensor& g = got[static_cast<size_t>(r)][l];
      REQUIRE(g.defined());
      const double err = (g - expected[l].narrow(0, r * size, size)).abs().max().item<double>() /
                         expected[l].abs().max().item<double>();
      CAPTURE(err);
      CHECK(err <= tolerance);
    }
  }
}

// Every parameter of `flats` gathered back (in the oracle's order).
inline std::vector<torch::Tensor> gathered_params(dist::Comm& comm, const std::vector<fsdp::FlatParam>& flats) {
  std::vector<torch::Tensor> out;
  for (const auto& flat : flats) {
    for (const auto& v : fsdp::unflatten(flat, fsdp::gather_full(comm, flat))) out.push_back(v.clone());
  }
  return out;
}

// max |a - b| / max |b| over every element of the lists.
inline double rel_error(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].sizes() == b[i].sizes());
    diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
    scale = std::max(scale, b[i].abs().max().item<double>());
  }
  return diff / scale;
}

inline int64_t shard_of(int64_t numel, int n) { return fsdp::padded_numel(numel, n) / n; }

// For lesson 4's meter: 8 layers of Linear(64, 64) + tanh (4160 floats each: 16640 bytes, a multiple of 2 and
// 4 ranks, so no padding) and 2 items per rank, so that parameters, not activations, dominate a step's bytes.
constexpr int64_t kWideLayerBytes = 4 * (64 * 64 + 64);
inline std::vector<std::vector<torch::Tensor>> wide_layers() {
  torch::manual_seed(13);
  std::vector<std::vector<torch::Tensor>> out;
  for (int l = 0; l < 8; ++l) {
    torch::nn::Linear layer(64, 64);
    out.push_back({layer->weight.detach().clone(), layer->bias.detach().clone()});
  }
  return out;
}

}  // namespace fsdp_checks
