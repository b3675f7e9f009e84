#include "common/cuda_memory.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

namespace workshop {
namespace cuda_memory {
namespace {

int resolve(int index) { return index < 0 ? static_cast<int>(c10::cuda::current_device()) : index; }

}  // namespace

Bytes allocated_bytes(int index) {
  const int device = resolve(index);
  c10::cuda::device_synchronize();
  // The stats type moved between LibTorch versions (c10::cuda::CUDACachingAllocator::DeviceStats, later
  // c10::CachingDeviceAllocator::DeviceStats); `auto` and the index of StatType::AGGREGATE (0) work in both.
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  const auto& aggregate = stats.allocated_bytes[0];
  return Bytes{aggregate.current, aggregate.peak};
}

int64_t reset_peak_and_get_current(int index) {
  const int device = resolve(index);
  c10::cuda::device_synchronize();
  c10::cuda::CUDACachingAllocator::resetPeakStats(device);
  return allocated_bytes(device).current;
}

}  // namespace cuda_memory
}  // namespace workshop
