// Lesson 7's checks share these: how a check starts its ranks and expects them to fail. One check file per step
// includes it (fsdp_step1_test.cc ...); run them all with bazel test //lesson7_fsdp:all.
//
// How the ranks start: dist::run_ranks (lesson 5's communicator) runs N threads in this test process, each with
// its OWN ProcessGroupGloo; the groups meet in one FileStore and then talk over Gloo's TCP transport on 127.0.0.1,
// exactly as N processes would. Every tensor a rank starts from is made from a seed, so every run is the same.
#pragma once

#include "tests/torch_doctest.h"

#include "lesson5_distributed/comm.h"
#include "tests/rank_checks.h"

namespace fsdp_checks {

using doctest::Contains;

// How a check starts its ranks and expects them to fail (shared with lesson 5's checks).
using rank_checks::check_every_rank_failed_with;
using rank_checks::check_fails_on_every_rank;
using rank_checks::launch;

}  // namespace fsdp_checks
