// The bench's cases register themselves: each lesson's case lives in its solution's folder
// (solutions/lessonN_*/bench_case.cc, named by the manifest's `bench` field), the scaler's in bench/scaler.cc,
// and bench/BUILD links the ones the manifest lists. So a new lesson's case joins the bench without an edit
// outside the lesson's folders.
//
//   namespace { const bench::Registered registered(5, bench::Case{"l5", lesson5, /*once=*/true}); }
#pragma once

#include <vector>

#include "bench/harness.h"

namespace bench {

/// Registers `bench_case` at static initialisation. `order` places it in the run: a lesson's number (a case that
/// is not a lesson takes a number between, e.g. 4.5). The case's library must be alwayslink: nothing refers to
/// this object by name.
class Registered {
 public:
  Registered(double order, Case bench_case);
};

/// The registered cases in order (ties by name). Fails with the name on two cases that share one.
std::vector<Case> registered_cases();

}  // namespace bench
