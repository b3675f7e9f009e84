#include "bench/peer_runner.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <sys/wait.h>
#include <vector>

#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include "common/device.h"
#include "common/memory_meter.h"

namespace bench {
namespace {

std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (char ch : text) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> fields;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, '\t')) fields.push_back(field);
  return fields;
}

bool is_file(const std::string& path) { return !path.empty() && access(path.c_str(), R_OK) == 0; }

constexpr const char* kMarker = "bench_peak_window";  // the same name as peer.py's MARKER

}  // namespace

std::string install_hint();

std::string default_peer_python(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("WORKSHOP_PEER_PYTHON");
  if (env != nullptr && *env != '\0') return env;
  return "/usr/bin/python3";
}

std::string find_peer_script(const char* argv0, const std::string& flag) {
  if (!flag.empty()) return flag;
  const std::string relative = "torch_perf_workshop/bench/peer.py";
  const char* runfiles = std::getenv("RUNFILES_DIR");
  if (runfiles != nullptr && is_file(std::string(runfiles) + "/" + relative))
    return std::string(runfiles) + "/" + relative;
  if (argv0 != nullptr && is_file(std::string(argv0) + ".runfiles/" + relative)) {
    return std::string(argv0) + ".runfiles/" + relative;
  }
  return "bench/peer.py";  // `bazel run` and `bazel test` start in the runfiles folder of the workspace
}

Peer::Peer(PeerOptions options) : options_(std::move(options)) {
  if (!options_.enabled) {
    missing_ = "turned off (--peer=off)";
  } else if (access(options_.python.c_str(), X_OK) != 0) {
    missing_ = "no Python interpreter at " + options_.python + ". " + install_hint();
  } else if (!is_file(options_.script)) {
    failure_ = "the peer script " + options_.script + " is missing (it should be in //bench's runfiles)";
  }
}

void Peer::run(const std::string& case_name, const std::string& spec) {
  if (!missing_.empty() || !failure_.empty()) return;
  const std::string device =
      options_.device.is_cuda() ? "cuda:" + std::to_string(std::max<int>(0, options_.device.index())) : "cpu";
  const std::string command = shell_quote(options_.python) + " " + shell_quote(options_.script) +
                              " --device=" + device + " --threads=" + std::to_string(options_.threads) +
                              " --case=" + shell_quote(case_name) + " --spec=" + shell_quote(spec);
  std::cout << "PyTorch peer: " << case_name << " ..." << std::endl;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    failure_ = "could not start " + command;
    return;
  }
  std::string output, missing;
  char buffer[4096];
  while (fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
  const int status = pclose(pipe);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;

  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    const std::vector<std::string> f = split_tabs(line);
    if (f.empty()) continue;
    if (f[0] == "missing" && f.size() >= 2) {
      missing = f[1];
    } else if (f[0] == "info" && f.size() >= 3) {
      info_[f[1]] = f[2];
      if (f[1] == "torch") torch_version_ = f[2];
    } else if (f[0] == "row" && f.size() >= 7) {
      PeerRow row;
      row.median_ms = std::stod(f[2]);
      row.min_ms = std::stod(f[3]);
      row.max_ms = std::stod(f[4]);
      row.peak_bytes = f[5] == "-" ? -1 : std::stoll(f[5]);
      row.what = f[6];
      history_[f[1]].push_back(row);
    } else if (f[0] == "na" && f.size() >= 3) {
      PeerRow row;
      row.unavailable = f[2];
      history_[f[1]].push_back(row);
    }
  }
  for (const auto& entry : history_) {
    const std::vector<PeerRow>& runs = entry.second;
    PeerRow summary = runs.front();
    summary.rounds = static_cast<int>(runs.size());
    std::vector<double> medians;
    for (const PeerRow& r : runs) {
      if (!r.unavailable.empty()) summary.unavailable = r.unavailable;
      if (std::isfinite(r.median_ms)) medians.push_back(r.median_ms);
      summary.min_ms = std::min(summary.min_ms, r.min_ms);
      summary.max_ms = std::max(summary.max_ms, r.max_ms);
    }
    if (!medians.empty()) summary.median_ms = workshop::median(medians);
    rows_[entry.first] = summary;
  }
  if (code == 3) {
    missing_ = (missing.empty() ? options_.python + " cannot import torch" : missing) + ". " + install_hint();
    torch_version_.clear();
    std::cout << "PyTorch peer: NOT RUN: " << missing_ << " Our rows only." << std::endl;
  } else if (code != 0) {
    failure_ = "bench/peer.py --case=" + case_name + " exited with status " + std::to_string(code) +
               " (its error is printed above)";
  }
}

std::string install_hint() {
  return "Install PyTorch for the peer with `bash tools/setup.sh --bench-peer` (Debian: python3-torch), or point "
         "--peer_python (or WORKSHOP_PEER_PYTHON) at a Python that has it.";
}

const PeerRow* Peer::find(const std::string& key) const {
  const auto it = rows_.find(key);
  return it == rows_.end() ? nullptr : &it->second;
}

int64_t same_way_peak_bytes(c10::Device device, const std::function<void()>& work,
                            const std::function<void()>& between) {
  if (device.is_cuda()) {
    if (between) between();
    workshop::synchronize(device);
    workshop::MemoryMeter meter(device);  // the caching allocator's statistics, as torch.cuda.max_memory_allocated
    work();
    workshop::synchronize(device);
    return meter.peak_bytes();
  }
  namespace legacy = torch::autograd::profiler;
  legacy::enableProfilerLegacy(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU,
                                                                     /*report_input_shapes=*/false,
                                                                     /*profile_memory=*/true));
  try {
    work();  // primes: every block the measured run frees is then one the profiler saw allocated
    if (between) between();
    RECORD_USER_SCOPE(kMarker);
    work();
  } catch (...) {
    legacy::disableProfilerLegacy();
    throw;
  }
  const legacy::thread_event_lists lists = legacy::disableProfilerLegacy();
  // A pop event carries its push's handle, not always its name: find the marker's handle first.
  bool found_marker = false;
  at::RecordFunctionHandle marker = 0;
  for (const auto& list : lists) {
    for (const auto& event : list) {
      if (event.kind() == legacy::EventKind::PushRange && std::string(event.name()) == kMarker) {
        marker = event.handle();
        found_marker = true;
      }
    }
  }
  TORCH_CHECK(found_marker, "same_way_peak_bytes: the profiler did not record the measured range");
  std::vector<const legacy::LegacyEvent*> events;
  for (const auto& list : lists) {
    for (const auto& event : list) {
      const bool range = event.kind() == legacy::EventKind::PushRange || event.kind() == legacy::EventKind::PopRange;
      if (event.kind() == legacy::EventKind::MemoryAlloc || (range && event.handle() == marker))
        events.push_back(&event);
    }
  }
  TORCH_CHECK(!events.empty(), "same_way_peak_bytes: the profiler recorded no event");
  const legacy::LegacyEvent* origin = events.front();
  std::stable_sort(events.begin(), events.end(), [origin](const legacy::LegacyEvent* a, const legacy::LegacyEvent* b) {
    return origin->cpuElapsedUs(*a) < origin->cpuElapsedUs(*b);
  });
  int64_t current = 0, base = 0, peak = 0;
  bool inside = false;
  for (const legacy::LegacyEvent* event : events) {
    if (event->kind() == legacy::EventKind::PushRange) {
      inside = true;
      base = current;
    } else if (event->kind() == legacy::EventKind::PopRange) {
      inside = false;
    } else {
      current += event->cpuMemoryUsage();
      if (inside) peak = std::max(peak, current - base);
    }
  }
  return peak;
}

std::string same_way_peak_method(c10::Device device) {
  return device.is_cuda() ? "CUDA allocator stats (peak minus start), both sides"
                          : "legacy profiler's CPU allocation events (running sum, peak minus start), both sides";
}

}  // namespace bench
