// Lesson 5's checks share these: the seeded problems (a small MLP and its data, replicas, the full-batch oracle)
// and the ways a check starts ranks and expects them to fail. One check file per step includes it
// (ddp_step1_test.cc ... ddp_step5_test.cc); run them all with bazel test //lesson5_distributed:all.
//
// How the ranks start: dist::run_ranks runs N threads in this test process, each with its OWN
// ProcessGroupGloo; the groups meet in one FileStore and then talk over Gloo's TCP transport on 127.0.0.1,
// exactly as N processes would (the demo starts real processes). Every rank's model is built here from the
// same seed before the threads start, so every run is deterministic. The reference is one process doing one
// full-batch step on the same model; parameters are compared with rel_error = max|a - b| / max|b| (float32).
#pragma once

#include "tests/torch_doctest.h"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/ddp.h"
#include "tests/check_helpers.h"
#include "tests/rank_checks.h"

namespace ddp_checks {

using doctest::Contains;

// [problem]
// A small MLP regression problem: 8 -> 16 -> 16 -> 4, six parameters, 484 float32 elements (1936 bytes).
inline torch::nn::Sequential make_model(uint64_t seed = 5) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16),
                               torch::nn::Tanh(), torch::nn::Linear(16, 4));
}
inline constexpr int64_t kModelBytes = 1936;

struct Data {
  torch::Tensor x, y;  // [items, 8], [items, 4]
  explicit Data(int64_t items, uint64_t seed = 7) {
    torch::manual_seed(seed);
    x = torch::randn({items, 8});
    y = torch::randn({items, 4});
  }
};
// [problem]

using workshop::test::rel_error;
using workshop::test::values_of;

// Rank r's loss on its shard of `data` (of n ranks): the mean over its items.
inline torch::Tensor shard_loss(torch::nn::Sequential& model, const Data& data, int r, int n) {
  return torch::mse_loss(model->forward(ddp::shard(data.x, r, n)), ddp::shard(data.y, r, n));
}

// How a check starts its ranks and expects them to fail (shared with lesson 7's checks).
using rank_checks::check_every_rank_failed_with;
using rank_checks::check_fails_on_every_rank;
using rank_checks::launch;

// N identical copies of the model, one per rank, built before the ranks start.
inline std::vector<torch::nn::Sequential> replicas(int n, uint64_t seed = 5) {
  std::vector<torch::nn::Sequential> out;
  for (int r = 0; r < n; ++r) out.push_back(make_model(seed));
  return out;
}

// The oracle: `steps` full-batch steps of one process.
inline std::vector<torch::Tensor> full_batch_sgd(const Data& data, int steps = 1, double lr = 0.1) {
  auto model = make_model();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(lr));
  for (int s = 0; s < steps; ++s) {
    sgd.zero_grad();
    torch::mse_loss(model->forward(data.x), data.y).backward();
    sgd.step();
  }
  return values_of(model->parameters());
}

// Whether this LibTorch's Gloo reduces and broadcasts bfloat16 tensors: 1.13's refuses them on every rank ("Invalid
// scalar type"), later ones take them. The checks of mixed dtypes expect either the right average or that refusal.
inline bool gloo_takes_bfloat16() {
  static const bool takes = [] {
    const auto outcomes = dist::run_ranks_collect(launch(2), [](dist::Comm& comm) {
      const torch::Tensor t = torch::ones({2}, torch::kBFloat16);
      comm.broadcast(t, 0);
      comm.all_reduce(t);
    });
    return outcomes[0].ok && outcomes[1].ok;
  }();
  return takes;
}

// The rank groups' FileStore folders left in the test's temporary folder.
inline int leftover_store_folders() {
  const char* base = std::getenv("TEST_TMPDIR");
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(base && *base ? base : "/tmp")) {
    if (entry.path().filename().string().rfind("workshop_ranks_", 0) == 0) ++count;
  }
  return count;
}

}  // namespace ddp_checks
