// CUDA device facts (compiled only with a CUDA LibTorch).
#pragma once

#include <string>

namespace workshop {
namespace cuda_device {

/// The product name of CUDA device `index`, e.g. "NVIDIA H200".
std::string name(int index);

}  // namespace cuda_device
}  // namespace workshop
