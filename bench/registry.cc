#include "bench/registry.h"

#include <algorithm>
#include <utility>

#include <c10/util/Exception.h>

namespace bench {
namespace {

// A function's static: built on first use, whatever order the case files' registrations run in.
std::vector<std::pair<double, Case>>& registry() {
  static std::vector<std::pair<double, Case>> cases;
  return cases;
}

}  // namespace

Registered::Registered(double order, Case bench_case) { registry().emplace_back(order, std::move(bench_case)); }

std::vector<Case> registered_cases() {
  std::vector<std::pair<double, Case>> sorted = registry();
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second.name < b.second.name;
  });
  std::vector<Case> cases;
  for (const auto& entry : sorted) {
    for (const Case& seen : cases) {
      TORCH_CHECK(seen.name != entry.second.name, "bench: two cases are registered as '", seen.name,
                  "' (case names must be unique)");
    }
    cases.push_back(entry.second);
  }
  return cases;
}

}  // namespace bench
