// Checks workshop::median (common/device.h), the one median of the demos, checks and bench.
#include "tests/torch_doctest.h"

#include <cmath>
#include <vector>

#include "common/device.h"

using doctest::Contains;

TEST_CASE("median of an odd count is the middle value, of an even count the mean of the two middle values") {
  CHECK(workshop::median({3.0}) == 3.0);
  CHECK(workshop::median({5.0, 1.0, 3.0}) == 3.0);
  CHECK(workshop::median({4.0, 1.0, 3.0, 2.0}) == 2.5);  // not 3 (the upper median) nor 2 (the lower)
  CHECK(workshop::median({2.0, 2.0, 9.0, -1.0}) == 2.0);
}

TEST_CASE("median refuses no values and NaN with a clear message") {
  CHECK_THROWS_WITH_AS(workshop::median({}), Contains("median: no values"), c10::Error);
  CHECK_THROWS_WITH_AS(workshop::median({1.0, NAN}), Contains("median: the values hold a NaN"), c10::Error);
}

TEST_CASE("time_repeated reports the median of its samples") {
  const auto t = workshop::time_repeated(
      c10::Device(c10::kCPU), [] {}, 0, 4);
  REQUIRE(t.samples_ms.size() == 4);
  CHECK(t.median_ms == workshop::median(t.samples_ms));
  CHECK(t.min_ms <= t.median_ms);
  CHECK(t.median_ms <= t.max_ms);
}
