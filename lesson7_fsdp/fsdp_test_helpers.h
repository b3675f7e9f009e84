// Lesson 7's checks share these: how a check starts its ranks and expects them to fail. One check file per step
// includes it (fsdp_step1_test.cc ...); run them all with bazel test //lesson7_fsdp:all.
//
// How the ranks start: dist::run_ranks (lesson 5's communicator) runs N threads in this test process, each with
// its OWN ProcessGroupGloo; the groups meet in one FileStore and then talk over Gloo's TCP transport on 127.0.0.1,
// exactly as N processes would. Every tensor a rank starts from is made from a seed, so every run is the same.
#pragma once

#include "tests/torch_doctest.h"

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "lesson5_distributed/comm.h"

namespace fsdp_checks {

using doctest::Contains;

// Launch options for `world_size` ranks (threads of this process) that give up after `timeout_ms`.
inline dist::LaunchOptions launch(int world_size, int timeout_ms = 10000) {
  dist::LaunchOptions options;
  options.world_size = world_size;
  options.timeout = std::chrono::milliseconds(timeout_ms);
  return options;
}

// Runs `fn` on `n` ranks with a 5 s timeout and checks that every rank failed with `expected`, at once (not a
// timeout: bad input is refused before any traffic, so no rank is left waiting for another).
inline void check_fails_on_every_rank(int n, const std::function<void(dist::Comm&)>& fn, const std::string& expected) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<dist::RankOutcome> outcomes = dist::run_ranks_collect(launch(n, 5000), fn);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(outcomes.size() == static_cast<size_t>(n));
  for (size_t r = 0; r < outcomes.size(); ++r) {
    CAPTURE(r);
    INFO(outcomes[r].error);
    CHECK_FALSE(outcomes[r].ok);
    CHECK(outcomes[r].error.find(expected) != std::string::npos);
    CHECK(outcomes[r].error.find("timed out") == std::string::npos);
  }
  CAPTURE(seconds);
  CHECK(seconds < 5.0);
}

}  // namespace fsdp_checks
