#include "tests/torch_doctest.h"
#include <torch/types.h>
TEST_CASE("smoke") { CHECK(torch::ones({2}).sum().item<float>() == 2.0f); }
GPU_TEST_CASE("gpu smoke") { CHECK(true); }
