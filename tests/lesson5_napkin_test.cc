// Checks of lesson 5's napkin math (l5demo::napkin in lesson5_distributed/demo_ranks.h), which the demo prints
// beside its measured steps: every collective of a step is charged, and a link's own latency once per step of
// each collective's algorithm, the simulated one once per call.
#include "tests/torch_doctest.h"

#include "lesson5_distributed/demo_ranks.h"

TEST_CASE("lesson 5's napkin charges the agreement all-gather, and a link's delay per step of each collective") {
  l5demo::Result bucketed;  // 4 all-reduces (buckets) and the all-gather of check_gradients_ready, no payload
  bucketed.all_reduce_calls = 4;
  bucketed.all_gather_calls = 1;
  const l5demo::Extras free_calls;  // no compute and no call cost of its own: only the delays remain
  const int n = 4;
  // Kernel latency of 1 ms on the link: 2 (N - 1) = 6 steps per all-reduce, N - 1 = 3 for the all-gather.
  CHECK(l5demo::napkin(1, bucketed, free_calls, n, 1e9, 0.0, 1.0).calls_ms == doctest::Approx(4 * 6 + 3));
  // Simulated latency of 1 ms: once per call, 5 calls.
  CHECK(l5demo::napkin(1, bucketed, free_calls, n, 1e9, 1.0, 0.0).calls_ms == doctest::Approx(5));
  l5demo::Result zero;  // ZeRO-1's broadcasts: ceil(log2 4) = 2 steps each
  zero.broadcast_calls = 8;
  CHECK(l5demo::napkin(3, zero, free_calls, n, 1e9, 0.0, 1.0).calls_ms == doctest::Approx(8 * 2));
  // The all-gather runs before the all-reduces, not under backward: it adds to the step even with overlap.
  l5demo::Extras compute;
  compute.backward_ms = 100;
  l5demo::Result overlap = bucketed;
  CHECK(l5demo::napkin(2, overlap, compute, n, 1e9, 1.0, 0.0).total_ms == doctest::Approx(101));
}
