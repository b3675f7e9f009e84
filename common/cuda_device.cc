#include "common/cuda_device.h"

#include <ATen/cuda/CUDAContext.h>

namespace workshop {
namespace cuda_device {

std::string name(int index) { return at::cuda::getDeviceProperties(index)->name; }

}  // namespace cuda_device
}  // namespace workshop
