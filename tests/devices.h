// Device helpers for the checks: which devices this machine has, and GPU-only test cases that are reported
// as skipped, with the reason, where CUDA is missing.
#pragma once

#include <string>
#include <vector>

#include <c10/core/Device.h>

namespace workshop {
namespace testing {

/// True when LibTorch has CUDA and a CUDA device is visible.
bool cuda_usable();

/// Why GPU cases do not run here ("" when they do).
std::string gpu_skip_reason();

/// CPU always, then CUDA where usable: for SUBCASEs that repeat a check on every device present.
std::vector<c10::Device> devices_present();

}  // namespace testing
}  // namespace workshop

/// A test case that needs a CUDA device. Where there is none, doctest counts it as skipped and the test
/// binary prints the reason before running (tests/main.cc). Test-suite "gpu": run only these with
/// --test-suite=gpu.
#define GPU_TEST_CASE(name) \
  TEST_CASE(name* doctest::test_suite("gpu") * doctest::skip(!::workshop::testing::cuda_usable()))
