// The single doctest main of the repository. Before running, it names the device and lists the GPU-only test
// cases that will be skipped here, with the reason, so a green run on a CPU machine never hides them.
#define DOCTEST_CONFIG_IMPLEMENT
#include "tests/torch_doctest.h"

#include <cstring>
#include <iostream>
#include <set>

#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/version.h>

namespace doctest {
namespace detail {
std::set<TestCase>& getRegisteredTests();  // defined by DOCTEST_CONFIG_IMPLEMENT above
}  // namespace detail
}  // namespace doctest

// LibTorch's c10::Error::what() carries a C++ backtrace; the message alone is what a learner needs.
REGISTER_EXCEPTION_TRANSLATOR(const c10::Error& error) { return doctest::String(error.what_without_backtrace()); }

int main(int argc, char** argv) {
  doctest::Context context;
  context.applyCommandLine(argc, argv);

  bool quiet = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strstr(argv[i], "list-test") || std::strstr(argv[i], "-ltc") || std::strstr(argv[i], "reporters=xml") ||
        std::strstr(argv[i], "-r=xml") || std::strstr(argv[i], "reporters=junit") || std::strstr(argv[i], "-r=junit")) {
      quiet = true;  // keep machine-readable output clean
    }
  }
  if (!quiet) {
    std::cout << "[workshop] LibTorch " << TORCH_VERSION << ", "
              << (workshop::testing::cuda_usable()
                      ? "CUDA devices: " + std::to_string(torch::cuda::device_count())
                      : std::string("CPU only"))
              << "\n";
    const std::string reason = workshop::testing::gpu_skip_reason();
    for (const auto& test : doctest::detail::getRegisteredTests()) {
      if (test.m_skip && std::strcmp(test.m_test_suite, "gpu") == 0) {
        std::cout << "[workshop] SKIPPED (GPU case): " << test.m_name << "\n"
                  << "           reason: " << reason << "\n";
      }
      if (test.m_skip && std::strcmp(test.m_test_suite, "multi_gpu") == 0) {
        // Not a "GPU case" skip: one GPU is a complete GPU machine for every other check (tools/gpu_check.sh).
        std::cout << "[workshop] SKIPPED (multi-GPU case): " << test.m_name << "\n"
                  << "           reason: needs at least 2 CUDA devices and NCCL; this machine has "
                  << (workshop::testing::cuda_usable() ? torch::cuda::device_count() : 0) << " CUDA device(s)\n";
      }
    }
  }
  return context.run();
}
