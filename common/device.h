// Which device to run on, what it is called, and timing that is honest about asynchronous GPU work.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

namespace workshop {

/// CUDA device 0 where LibTorch has CUDA and a device is visible, else CPU.
c10::Device best_device();

/// Parses "cpu", "cuda", "cuda:1" or "best"; a clear error for anything else or an absent device.
c10::Device parse_device(const std::string& text);

/// A human name: the GPU's product name, or the CPU model and thread count.
std::string device_name(c10::Device device);

/// Waits until all queued work on `device` is done (no-op on CPU).
void synchronize(c10::Device device);

/// The median of `values`: the middle value, or the mean of the two middle values for an even count (the
/// workshop's one median; demos, checks and the bench use it). A clear error for no values or a NaN.
double median(std::vector<double> values);

/// Summary of repeated timings in milliseconds.
struct Timing {
  double median_ms;
  double min_ms;
  double max_ms;
  std::vector<double> samples_ms;
};

/// Runs `work` `warmup` times untimed, then `repeats` times, each time synchronising the device before
/// starting and before stopping the clock, so that GPU work is measured, not only its launch.
Timing time_repeated(c10::Device device, const std::function<void()>& work, int warmup, int repeats);

}  // namespace workshop
