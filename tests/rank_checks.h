// How the distributed lessons' checks (lessons 5 and 7) start their ranks and expect them to fail. Their helper
// headers (lesson5_distributed/ddp_test_helpers.h, lesson7_fsdp/fsdp_test_helpers.h) bring these into their own
// namespaces.
//
// dist::run_ranks (lesson 5's communicator) runs N threads in the test process, each with its own
// ProcessGroupGloo; the groups meet in one FileStore and then talk over Gloo's TCP transport on 127.0.0.1, as N
// processes would.
#pragma once

#include "tests/torch_doctest.h"

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "lesson5_distributed/comm.h"

namespace rank_checks {

// Launch options for `world_size` ranks (threads of this process) that give up after `timeout_ms`.
inline dist::LaunchOptions launch(int world_size, int timeout_ms = 10000) {
  dist::LaunchOptions options;
  options.world_size = world_size;
  options.timeout = std::chrono::milliseconds(timeout_ms);
  return options;
}

// Every rank failed, each with an error naming `expected` (and none of them a timeout: the ranks agreed on the
// error instead of waiting for each other).
inline void check_every_rank_failed_with(const std::vector<dist::RankOutcome>& outcomes, const std::string& expected) {
  REQUIRE_FALSE(outcomes.empty());
  for (size_t r = 0; r < outcomes.size(); ++r) {
    CAPTURE(r);
    CAPTURE(expected);  // what the error must name, printed beside the error itself when the check fails
    INFO(outcomes[r].error);
    CHECK_FALSE(outcomes[r].ok);
    CHECK(outcomes[r].error.find(expected) != std::string::npos);
    CHECK(outcomes[r].error.find("timed out") == std::string::npos);
  }
}

// Runs `fn` on `n` ranks with a 5 s timeout and checks that every rank failed with `expected` at once: found by
// the ranks agreeing on the fault (or refusing bad input before any traffic), not after the timeout (a rank that
// throws alone leaves its peers waiting).
inline void check_fails_on_every_rank(int n, const std::function<void(dist::Comm&)>& fn, const std::string& expected) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<dist::RankOutcome> outcomes = dist::run_ranks_collect(launch(n, 5000), fn);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(outcomes.size() == static_cast<size_t>(n));
  check_every_rank_failed_with(outcomes, expected);
  CAPTURE(seconds);
  CHECK(seconds < 5.0);
}

}  // namespace rank_checks
