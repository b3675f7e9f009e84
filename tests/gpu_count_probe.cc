// A probe for tools/gpu_log_test.py, not a check of its own: two cases in doctest's "gpu" suite that run on any
// machine (one passes, one fails on purpose) and one that is skipped, so that the test sees the line tests/main.cc
// prints for tools/gpu_check.sh ("[workshop] 2 GPU case(s) RUN here: 1 passed, 1 failed").
#include "tests/torch_doctest.h"

TEST_CASE("probe: a GPU-suite case that passes" * doctest::test_suite("gpu")) { CHECK(1 + 1 == 2); }

TEST_CASE("probe: a GPU-suite case that fails" * doctest::test_suite("gpu")) { CHECK(1 + 1 == 3); }

TEST_CASE("probe: a skipped GPU-suite case" * doctest::test_suite("gpu") * doctest::skip(true)) { CHECK(false); }

TEST_CASE("probe: a CPU case") { CHECK(true); }
