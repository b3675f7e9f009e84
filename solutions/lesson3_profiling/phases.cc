// Lesson 3, reference solution of part 2: the RAII profiler range.
#include "lesson3_profiling/phases.h"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include "common/compat/compat_profiler.h"

namespace prof {

// [range_open]
ScopedRange::ScopedRange(std::string name) : name_(std::move(name)) {
  TORCH_CHECK(!name_.empty(), "ScopedRange: the range name is empty");
  // USER_SCOPE marks it as the user's own range (not an op). The RecordFunction is only active when some
  // observer (a profiler) is listening; otherwise nothing is kept and the range costs almost nothing.
  auto record = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (record->isActive()) {
    record->before(name_);
    record_ = std::move(record);
  }
  if (workshop::compat::nvtx_available()) {
    workshop::compat::nvtx_range_push(name_.c_str());
    nvtx_open_ = true;
  }
}
// [range_open]

// [range_close]
ScopedRange::~ScopedRange() {
  if (nvtx_open_) workshop::compat::nvtx_range_pop();
  // Destroying the RecordFunction runs the observers' end callbacks: the range closes here.
  record_.reset();
}
// [range_close]

}  // namespace prof
