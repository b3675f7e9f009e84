// Lesson 6's demo: timing the variants with their page faults, and what a fresh page costs (demo_parts.h).
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>

#include <c10/util/Exception.h>

#include "common/device.h"
#include "common/report.h"
#include "lesson6_fusion/demo_parts.h"

namespace l6demo {

void time_rounds(std::vector<Variant>& variants, c10::Device device, int rounds, int repeats) {
  for (int r = 0; r < rounds; ++r) {
    for (Variant& v : variants) {
      const int64_t before = minor_faults();
      const workshop::Timing t = workshop::time_repeated(device, v.step, 0, repeats);
      v.faults += static_cast<double>(minor_faults() - before) / (static_cast<double>(rounds) * repeats);
      v.samples.insert(v.samples.end(), t.samples_ms.begin(), t.samples_ms.end());
    }
  }
}

int64_t minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

std::string thp_setting() {
  std::ifstream file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(file, line)) return "unknown";
  const size_t open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "unknown";
  return line.substr(open + 1, close - open - 1);
}

FreshPages fresh_page_cost(int64_t bytes, int repeats) {
  constexpr int64_t kPage = 4096;
  const int64_t pages = bytes / kPage;
  FreshPages best{std::numeric_limits<double>::infinity(), 0};
  for (int r = 0; r < repeats; ++r) {
    const int64_t before = minor_faults();
    const auto start = std::chrono::steady_clock::now();
    void* mapped =
        mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(mapped != MAP_FAILED, "lesson 6 demo: mmap of ", bytes, " bytes failed");
    volatile char* bytes_of = static_cast<volatile char*>(mapped);
    for (int64_t i = 0; i < pages; ++i) bytes_of[i * kPage] = 1;
    munmap(mapped, static_cast<size_t>(bytes));
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
    const int64_t faults = std::max<int64_t>(1, minor_faults() - before);
    if (took.count() / faults < best.us_per_fault) best = {took.count() / faults, static_cast<double>(faults) / pages};
  }
  return best;
}

void print_page_costs(double torch_faults, double torch_ms, double fused_faults, int64_t temporary_bytes) {
  const FreshPages fresh = fresh_page_cost(int64_t{64} << 20, 3);
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  std::cout << "faults per call: the process's minor page faults (getrusage) over a row's timed calls. "
               "torch::optim::AdamW allocates two temporaries of "
            << workshop::mib(static_cast<double>(temporary_bytes))
            << " in every call, and glibc gives memory that large back to the kernel when it is freed (a block above "
               "its mmap threshold, 32 MiB at most, is a fresh mapping every time), so the call takes "
            << workshop::fixed(torch_faults, 0) << " faults (the fused op " << workshop::fixed(fused_faults, 0)
            << ").\nfresh pages here: " << workshop::fixed(fresh.us_per_fault, 2)
            << " us per fault (64 MiB mapped, one byte written per 4 KiB page, unmapped; fastest of 3; "
            << workshop::fixed(fresh.faults_per_page, 2) << " faults per page), so about "
            << workshop::fixed(torch_faults * fresh.us_per_fault * 1e-3, 0) << " ms of torch::optim::AdamW's "
            << workshop::fixed(torch_ms, 2) << " ms are page faults; transparent huge pages: " << thp_setting()
            << "; GLIBC_TUNABLES: " << (tunables != nullptr ? tunables : "unset") << "\n";
}

}  // namespace l6demo
