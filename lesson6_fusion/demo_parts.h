// Lesson 6's demo: what its files share. //lesson6_fusion:demo (the reference solution) and :my_demo (your
// fused_adamw.cc) compile them into one binary:
//   demo.cc        main: the single-tensor table, the lesson's goals, the many-parameters table
//   demo_pages.cc  timing the variants with the page faults each call takes, and what a fresh page costs here
//                  (docs/pages/lesson6_in_depth.md, "Fresh pages": why torch::optim::AdamW's 64 MiB step takes
//                  80 ms on one machine and 500 ms on another)
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Device.h>

namespace l6demo {

/// One row of a table: a step (or a copy) and what the rounds measured of it.
struct Variant {
  Variant(std::string name_, int64_t passes_, int64_t napkin_bytes_, std::function<void()> step_, bool is_copy_ = false)
      : name(std::move(name_)),
        passes(passes_),
        napkin_bytes(napkin_bytes_),
        step(std::move(step_)),
        is_copy(is_copy_) {}
  std::string name;
  int64_t passes;
  int64_t napkin_bytes;         // bytes read + written by the napkin of step 1
  std::function<void()> step;   // one step (or one copy)
  std::vector<double> samples;  // milliseconds, over all rounds
  int64_t allocated_bytes = 0;  // peak bytes one call allocates (counting CPU allocator)
  bool is_copy = false;
  double faults = 0;  // minor page faults per timed call (the whole process's, getrusage)
};

/// Warm-up excluded: `rounds` rounds of `repeats` timed calls of every variant in turn, interleaved; counts each
/// variant's minor page faults over its timed calls.
void time_rounds(std::vector<Variant>& variants, c10::Device device, int rounds, int repeats);

/// Minor page faults of this process so far (getrusage RUSAGE_SELF: every thread of it).
int64_t minor_faults();

/// The kernel's transparent huge page mode: the bracketed word of /sys/kernel/mm/transparent_hugepage/enabled
/// ("always", "madvise", "never"), or "unknown" where the file is missing.
std::string thp_setting();

/// What a fresh page costs here: map `bytes` of anonymous memory, write one byte of each 4 KiB page, unmap; the
/// fastest of `repeats`, in microseconds per fault, with the faults it took per 4 KiB page (1, or about 1/512
/// with transparent huge pages).
struct FreshPages {
  double us_per_fault = 0;
  double faults_per_page = 0;
};
FreshPages fresh_page_cost(int64_t bytes, int repeats);

/// The lines under the single-tensor table: the faults per call of torch::optim::AdamW (whose two temporaries are
/// `temporary_bytes` each) and of the fused step, this machine's cost of a fault, what share of torch's median
/// those faults explain, THP and GLIBC_TUNABLES.
void print_page_costs(double torch_faults, double torch_ms, double fused_faults, int64_t temporary_bytes);

}  // namespace l6demo
