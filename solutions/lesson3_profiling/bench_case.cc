// Lesson 3's bench case: the planted training loop (syncs, data prepared in the step, tiny ops) before and
// after the fix. No PyTorch peer: the planted problems are the lesson's own loop, not a library feature.
#include <iostream>

#include <torch/torch.h>

#include "bench/harness.h"
#include "bench/registry.h"
#include "lesson3_profiling/bottleneck.h"

namespace bench {

void lesson3(Context& c) {
  prof::TrainerOptions options;
  if (c.device.is_cuda()) {
    options.samples = 65536;
    options.batch = 4096;
    options.features = 256;
    options.hidden = 1024;
  }
  std::cout << "lesson 3: planted loop vs fixed loop, batch " << options.batch << std::endl;
  prof::Trainer slow(options, c.device), fast(options, c.device);
  fast.prepare();
  const int repeats = c.quick ? 5 : 20;
  const auto t_slow = workshop::time_repeated(
      c.device, [&] { slow.slow_step(); }, 3, repeats);
  const auto t_fast = workshop::time_repeated(
      c.device, [&] { fast.fast_step(); }, 3, repeats);
  const double flops = 6.0 * options.batch * (options.features * options.hidden + options.hidden * options.classes);
  c.rows.push_back(Row{"lesson 3: training loop", "planted problems (sync, data in step, tiny ops)", t_slow, flops, 0,
                       "", 1.0, "", "", -1});
  c.rows.push_back(
      Row{"lesson 3: training loop", "fixed", t_fast, flops, 0, "", t_slow.median_ms / t_fast.median_ms, "", "", -1});
}

namespace {
const Registered registered(3, Case{"l3", lesson3});
}  // namespace

}  // namespace bench
