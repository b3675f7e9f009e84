// CUDA caching-allocator statistics, behind a small interface (compiled only with a CUDA LibTorch).
#pragma once

#include <cstdint>

namespace workshop {
namespace cuda_memory {

struct Bytes {
  int64_t current;
  int64_t peak;
};

/// Allocated (not reserved) bytes on the CUDA device `index` (-1: the current device), after a synchronize.
Bytes allocated_bytes(int index);

/// Synchronizes, resets the peak statistic, returns the bytes allocated now.
int64_t reset_peak_and_get_current(int index);

}  // namespace cuda_memory
}  // namespace workshop
