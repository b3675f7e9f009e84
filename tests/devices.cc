#include "tests/devices.h"

#include <torch/cuda.h>

namespace workshop {
namespace testing {

bool cuda_usable() {
  static const bool usable = torch::cuda::is_available();
  return usable;
}

std::string gpu_skip_reason() {
  if (cuda_usable()) return "";
#if WORKSHOP_HAS_CUDA
  return "this LibTorch has CUDA, but no CUDA device is visible (driver, CUDA_VISIBLE_DEVICES?)";
#else
  return "this LibTorch was built without CUDA (Debian's libtorch-dev is CPU-only); "
         "see README: 'Using a CUDA LibTorch'";
#endif
}

std::vector<c10::Device> devices_present() {
  std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
  if (cuda_usable()) devices.emplace_back(c10::kCUDA, 0);
  return devices;
}

}  // namespace testing
}  // namespace workshop
