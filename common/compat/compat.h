// One place for the API differences between LibTorch 1.13 (Debian, CPU) and LibTorch 2.x (PyTorch wheels,
// CUDA). Lesson and support code call these functions and never test TORCH_VERSION themselves.
#pragma once

#include <cstddef>

#include <c10/core/Allocator.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/macros/Export.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#define WORKSHOP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// The autocast switches, declared exactly as ATen/autocast_mode.h declares them. That header includes all of
// ATen/ATen.h (seconds of compile time per file); these declarations are all the lessons need.
namespace at {
namespace autocast {
#if WORKSHOP_TORCH_AT_LEAST(2, 4)
TORCH_API bool is_autocast_enabled(c10::DeviceType device_type);
TORCH_API void set_autocast_enabled(c10::DeviceType device_type, bool enabled);
TORCH_API c10::ScalarType get_autocast_dtype(c10::DeviceType device_type);
TORCH_API void set_autocast_dtype(c10::DeviceType device_type, c10::ScalarType dtype);
#else
TORCH_API bool is_enabled();
TORCH_API void set_enabled(bool enabled);
TORCH_API bool is_cpu_enabled();
TORCH_API void set_cpu_enabled(bool enabled);
TORCH_API c10::ScalarType get_autocast_gpu_dtype();
TORCH_API c10::ScalarType get_autocast_cpu_dtype();
TORCH_API void set_autocast_gpu_dtype(c10::ScalarType dtype);
TORCH_API void set_autocast_cpu_dtype(c10::ScalarType dtype);
#endif
TORCH_API void clear_cache();
TORCH_API bool is_autocast_cache_enabled();
TORCH_API void set_autocast_cache_enabled(bool enabled);
TORCH_API int increment_nesting();
TORCH_API int decrement_nesting();
}  // namespace autocast
}  // namespace at

namespace workshop {
namespace compat {

// ---- autocast -------------------------------------------------------------------------------------------
// <= 2.3: is_enabled()/set_enabled() (CUDA), is_cpu_enabled()/set_cpu_enabled(), get/set_autocast_{gpu,cpu}_dtype.
// >= 2.4: is_autocast_enabled(device)/set_autocast_enabled(device, on), get/set_autocast_dtype(device, dtype).

inline void check_autocast_device(c10::DeviceType device) {
  TORCH_CHECK(device == c10::DeviceType::CPU || device == c10::DeviceType::CUDA,
              "autocast: only CPU and CUDA are supported in this workshop, got ", device);
}

inline bool autocast_enabled(c10::DeviceType device) {
  check_autocast_device(device);
#if WORKSHOP_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType device, bool enabled) {
  check_autocast_device(device);
#if WORKSHOP_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(enabled);
  } else {
    at::autocast::set_cpu_enabled(enabled);
  }
#endif
}

inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
  check_autocast_device(device);
#if WORKSHOP_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                         : at::autocast::get_autocast_cpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
  check_autocast_device(device);
#if WORKSHOP_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(device, dtype);
#else
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

/// Whether CPU autocast accepts `dtype`: bfloat16 in every version; float16 from 2.3 on. CPU float16 autocast
/// arrived with pytorch/pytorch#112484 ("Add Half support for CPU autocast on eager mode", opened 2023-10-31):
/// 2.2's torch/amp/autocast_mode.py still lists `supported_dtype = [torch.bfloat16]` for CPU and its docs say
/// "for CPU, only ... torch.bfloat16 is supported for now"; 2.3 lists bfloat16 and float16.
inline bool cpu_autocast_supports(c10::ScalarType dtype) {
#if WORKSHOP_TORCH_AT_LEAST(2, 3)
  return dtype == c10::kBFloat16 || dtype == c10::kHalf;
#else
  return dtype == c10::kBFloat16;
#endif
}

// ---- fused AMP kernels ----------------------------------------------------------------------------------
// _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_ have CUDA kernels in every version and
// CPU kernels from 2.3 on.
inline bool has_fused_amp_kernels(c10::DeviceType device) {
  if (device == c10::DeviceType::CUDA) return true;
#if WORKSHOP_TORCH_AT_LEAST(2, 3)
  return device == c10::DeviceType::CPU;
#else
  return false;
#endif
}

// ---- allocators -----------------------------------------------------------------------------------------
// Until 2.2 Allocator::allocate is const; from 2.3 it is not, and subclasses must implement copy_data.
// Derive from WrappingAllocator and implement allocate_impl() to work with both.
class WrappingAllocator : public c10::Allocator {
 public:
#if WORKSHOP_TORCH_AT_LEAST(2, 3)
  c10::DataPtr allocate(size_t nbytes) override { return allocate_impl(nbytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#else
  c10::DataPtr allocate(size_t nbytes) const override { return allocate_impl(nbytes); }
#endif

 protected:
  virtual c10::DataPtr allocate_impl(size_t nbytes) const = 0;
};

}  // namespace compat
}  // namespace workshop
