// Lesson 3's bench case: the planted training loop (syncs, data prepared in the step, tiny ops) before and after
// the fix, beside the same loop in Python (bench/peer.py "l3"); and the planted loop's ops as the lesson's profiler
// records them beside torch.profiler's table of the same loop, same sizes and seed: names and calls per step.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "bench/harness.h"
#include "bench/registry.h"
#include "common/compat/compat_profiler.h"
#include "common/report.h"
#include "lesson3_profiling/bottleneck.h"
#include "lesson3_profiling/profiler.h"

namespace bench {

using workshop::fixed;

namespace {

constexpr int64_t kProfiledSteps = 8;
constexpr size_t kShownOps = 16;

// The lesson profiler's calls per step of every op of the planted loop (the same in every round: counts).
std::map<std::string, double>& our_calls() {
  static std::map<std::string, double> calls;
  return calls;
}

prof::TrainerOptions trainer_options(const Context& c) {
  prof::TrainerOptions options;
  if (c.device.is_cuda()) {
    options.samples = 65536;
    options.batch = 4096;
    options.features = 256;
    options.hidden = 1024;
  }
  return options;
}

}  // namespace

void lesson3(Context& c) {
  const prof::TrainerOptions options = trainer_options(c);
  std::cout << "lesson 3: planted loop vs fixed loop, batch " << options.batch << std::endl;
  prof::Trainer slow(options, c.device), fast(options, c.device);
  fast.prepare();
  const int warmup = 3, repeats = c.quick ? 5 : 20;
  const auto t_slow = workshop::time_repeated(
      c.device, [&] { slow.slow_step(); }, warmup, repeats);
  const auto t_fast = workshop::time_repeated(
      c.device, [&] { fast.fast_step(); }, warmup, repeats);
  const double flops = 6.0 * options.batch * (options.features * options.hidden + options.hidden * options.classes);
  c.rows.push_back(Row{"lesson 3: training loop", "planted problems (sync, data in step, tiny ops)", t_slow, flops, 0,
                       "", 1.0, "", "l3.slow", -1});
  c.rows.push_back(Row{"lesson 3: training loop", "fixed", t_fast, flops, 0, "", t_slow.median_ms / t_fast.median_ms,
                       "", "l3.fixed", -1});

  // The planted loop under the lesson's profiler (a fresh trainer: the same batches as the peer's).
  prof::Trainer profiled(options, c.device);
  const prof::Profile profile = prof::profile_steps(kProfiledSteps, [&] { profiled.slow_step(); });
  our_calls().clear();
  for (const prof::Row& r : profile.table()) our_calls()[r.name] = static_cast<double>(r.calls) / kProfiledSteps;

  c.peer->run("l3", "samples=" + std::to_string(options.samples) + ",batch=" + std::to_string(options.batch) +
                        ",features=" + std::to_string(options.features) + ",hidden=" + std::to_string(options.hidden) +
                        ",classes=" + std::to_string(options.classes) + ",lr=" + fixed(options.learning_rate, 6) +
                        ",seed=" + std::to_string(options.seed) + ",warmup=" + std::to_string(warmup) +
                        ",repeats=" + std::to_string(repeats) + ",steps=" + std::to_string(kProfiledSteps));
}

// After the rounds: the two profilers' tables of the planted loop side by side, the ops with the most calls first.
void lesson3_finish(Context& c) {
  const std::map<std::string, double>& ours = our_calls();
  if (ours.empty()) return;
  const std::string backend = workshop::compat::profiler_backend();
  const auto peer_profiler = c.peer->info().find("l3.profiler");
  const std::string theirs_name = peer_profiler == c.peer->info().end() ? "torch.profiler" : peer_profiler->second;
  Section s{"bench_l3_profiler",
            "Lesson 3: the planted loop's ops, the lesson's profiler beside torch.profiler.",
            "",
            {"op", "calls / step (lesson, " + backend + ")", "calls / step (torch.profiler)", "same"}};
  s.columns[2] = "calls / step (" + theirs_name + ")";
  std::vector<std::pair<double, std::string>> order;
  for (const auto& op : ours) order.push_back({-op.second, op.first});
  std::sort(order.begin(), order.end());
  int same = 0, compared = 0;
  for (size_t i = 0; i < order.size() && i < kShownOps; ++i) {
    const std::string& name = order[i].second;
    const PeerRow* theirs = c.peer->find("l3.calls." + name);
    const std::string their_calls = theirs ? fixed(theirs->median_ms, 2) : "-";
    std::string verdict = "-";
    if (theirs) {
      ++compared;
      const bool equal = std::abs(theirs->median_ms - ours.at(name)) < 1e-9;
      same += equal ? 1 : 0;
      verdict = equal ? "yes" : "NO";
    }
    s.rows.push_back({name, fixed(ours.at(name), 2), their_calls, verdict});
  }
  s.text = "The planted loop, " + std::to_string(kProfiledSteps) +
           " profiled steps after one warm-up, recorded by the lesson's profiler (" + backend +
           ") and, in Python, by " + theirs_name +
           " over the same loop written op for op (bench/peer.py, "
           "PlantedTrainer), same sizes and seed. Calls are counted, not timed: they are the same on every run. " +
           (c.peer->available() ? std::to_string(same) + " of the " + std::to_string(compared) +
                                      " ops compared have the same calls per step."
                                : "torch.profiler: not run here (" + c.peer->missing() + ").");
  c.sections.push_back(s);
}

namespace {
const Registered registered(3, Case{"l3", lesson3, /*once=*/false, lesson3_finish});
}  // namespace

}  // namespace bench
