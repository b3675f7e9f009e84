#include "common/device.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <thread>

#include <c10/util/Exception.h>
#include <torch/cuda.h>

#if WORKSHOP_HAS_CUDA
#include "common/cuda_device.h"
#endif

namespace workshop {

c10::Device best_device() {
  if (torch::cuda::is_available()) return c10::Device(c10::kCUDA, 0);
  return c10::Device(c10::kCPU);
}

c10::Device parse_device(const std::string& text) {
  if (text == "best") return best_device();
  c10::Device device(c10::kCPU);
  try {
    device = c10::Device(text);
  } catch (const c10::Error&) {
    TORCH_CHECK(false, "unknown device '", text, "': use cpu, cuda, cuda:N or best");
  }
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), "device '", text, "': only cpu and cuda are supported");
  if (device.is_cuda()) {
    TORCH_CHECK(torch::cuda::is_available(), "device '", text, "' requested, but CUDA is not available here");
    const int index = device.has_index() ? device.index() : 0;
    TORCH_CHECK(index < static_cast<int>(torch::cuda::device_count()), "device '", text, "': only ",
                torch::cuda::device_count(), " CUDA device(s)");
    device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  return device;
}

std::string device_name(c10::Device device) {
#if WORKSHOP_HAS_CUDA
  if (device.is_cuda()) return cuda_device::name(device.has_index() ? device.index() : 0);
#endif
  std::string model = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) model = line.substr(colon + 2);
      break;
    }
  }
  return model + " (" + std::to_string(std::thread::hardware_concurrency()) + " threads)";
}

void synchronize(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

Timing time_repeated(c10::Device device, const std::function<void()>& work, int warmup, int repeats) {
  TORCH_CHECK(warmup >= 0, "time_repeated: warmup must be >= 0, got ", warmup);
  TORCH_CHECK(repeats > 0, "time_repeated: repeats must be > 0, got ", repeats);
  for (int i = 0; i < warmup; ++i) work();
  Timing timing{};
  for (int i = 0; i < repeats; ++i) {
    synchronize(device);
    const auto start = std::chrono::steady_clock::now();
    work();
    synchronize(device);
    const auto stop = std::chrono::steady_clock::now();
    timing.samples_ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  timing.min_ms = *std::min_element(timing.samples_ms.begin(), timing.samples_ms.end());
  timing.max_ms = *std::max_element(timing.samples_ms.begin(), timing.samples_ms.end());
  timing.median_ms = median(timing.samples_ms);
  return timing;
}

double median(std::vector<double> values) {
  TORCH_CHECK(!values.empty(), "median: no values (empty vector)");
  for (double v : values) TORCH_CHECK(!std::isnan(v), "median: the values hold a NaN");
  const size_t n = values.size();
  std::nth_element(values.begin(), values.begin() + n / 2, values.end());
  const double upper = values[n / 2];
  if (n % 2) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + n / 2);
  return 0.5 * (lower + upper);
}

}  // namespace workshop
