// Lesson 3, given code: the phase names.
#include <c10/util/Exception.h>

#include "lesson3_profiling/phases.h"

namespace prof {

std::string phase_label(Phase phase) {
  switch (phase) {
    case Phase::kData:
      return "phase:data";
    case Phase::kForward:
      return "phase:forward";
    case Phase::kBackward:
      return "phase:backward";
    case Phase::kOptimizer:
      return "phase:optimizer";
  }
  TORCH_CHECK(false, "phase_label: unknown phase ", static_cast<int>(phase));
}

bool is_phase_label(const std::string& name) {
  return name == "phase:data" || name == "phase:forward" || name == "phase:backward" || name == "phase:optimizer";
}

ScopedRange::ScopedRange(Phase phase) : ScopedRange(phase_label(phase)) {}

}  // namespace prof
