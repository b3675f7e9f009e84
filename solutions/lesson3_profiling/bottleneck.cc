// Lesson 3, reference solution of part 4: the diagnosis and the fixed training step.
#include "lesson3_profiling/bottleneck.h"

#include <algorithm>
#include <map>
#include <tuple>

#include <ATen/ATen.h>

#include "lesson3_profiling/phases.h"

namespace prof {

// [diagnose]
std::vector<Finding> diagnose(const Profile& profile, int64_t steps, const DiagnoseOptions& options) {
  TORCH_CHECK(steps >= 1, "diagnose: steps must be >= 1, got ", steps);
  const auto& events = profile.events();
  const double per_step = 1.0 / static_cast<double>(steps);

  // Per phase: its median share of a step, and how often each op ran directly inside it.
  std::map<std::string, double> phase_share;
  for (const auto& row : profile.phase_table()) phase_share[row.name] = 0;
  // On a GPU the host clock times the launches, not the work: rank by the kernels' time where there is one.
  const Clock clock = profile.has_device_time() ? Clock::kDevice : Clock::kHost;
  for (const auto phase : {Phase::kData, Phase::kForward, Phase::kBackward, Phase::kOptimizer}) {
    if (phase_share.count(phase_label(phase))) phase_share[phase_label(phase)] = profile.step_share(phase, clock);
  }
  TORCH_CHECK(!phase_share.empty(), "diagnose: the profile has no phase ranges (wrap the step's phases in ",
              "ScopedRange)");
  std::map<std::string, std::map<std::string, int64_t>> direct_calls;  // phase -> op -> calls
  std::map<std::string, int64_t> sync_calls;                           // phase -> calls of kSyncOp
  for (const auto& event : events) {
    if (event.parent >= 0 && is_phase_label(events[event.parent].name) && !is_phase_label(event.name)) {
      direct_calls[event.phase][event.name] += 1;
    }
    if (event.name == kSyncOp) sync_calls[event.phase] += 1;
  }
  auto most_called = [&](const std::string& phase) {
    std::pair<std::string, int64_t> best{"", 0};
    for (const auto& entry : direct_calls[phase]) {
      if (entry.second > best.second) best = entry;
    }
    return best;
  };

  std::vector<Finding> findings;
  for (const auto& entry : sync_calls) {
    const double calls = static_cast<double>(entry.second) * per_step;
    if (calls >= 1.0) {
      findings.push_back({Problem::kHostDeviceSync, entry.first, kSyncOp, calls, phase_share[entry.first]});
    }
  }
  const std::string data = phase_label(Phase::kData);
  if (phase_share.count(data) && phase_share[data] > options.data_share) {
    const auto op = most_called(data);
    findings.push_back(
        {Problem::kDataInStep, data, op.first, static_cast<double>(op.second) * per_step, phase_share[data]});
  }
  for (const auto& entry : direct_calls) {
    int64_t total = 0;
    for (const auto& op : entry.second) total += op.second;
    if (static_cast<double>(total) * per_step >= options.tiny_ops_per_step) {
      const auto op = most_called(entry.first);
      findings.push_back({Problem::kTinyOps, entry.first, op.first, static_cast<double>(op.second) * per_step,
                          phase_share[entry.first]});
    }
  }
  std::stable_sort(findings.begin(), findings.end(), [](const Finding& a, const Finding& b) {
    return std::make_tuple(-a.phase_share, static_cast<int>(a.problem)) <
           std::make_tuple(-b.phase_share, static_cast<int>(b.problem));
  });
  return findings;
}
// [diagnose]

// [prepare]
void Trainer::prepare() {
  // The statistics and the normalisation of slow_step(), once, for the whole dataset, in a few large ops.
  const auto all = raw_.to(at::kFloat).div(255);
  const auto mean = all.mean(0);
  const auto std = all.std(0);
  prepared_ = all.sub(mean).div(std).to(device_);  // [samples, features]
  prepared_labels_ = labels_.to(device_);          // [samples]
}
// [prepare]

// [fast_step]
void Trainer::fast_step() {
  TORCH_CHECK(prepared_.defined(), "fast_step: the data is not prepared; call prepare() first");
  const int64_t start = next_batch_start();
  at::Tensor x, y;
  {
    ScopedRange range(Phase::kData);
    x = prepared_.narrow(0, start, options_.batch);  // a view: no copy
    y = prepared_labels_.narrow(0, start, options_.batch);
  }
  at::Tensor loss;
  {
    ScopedRange range(Phase::kForward);
    loss = forward_loss(x, y);
    loss_sum_.add_(loss.detach());  // stays on the device; mean_loss() reads it once, after the loop
  }
  {
    ScopedRange range(Phase::kBackward);
    backward(loss);
  }
  {
    ScopedRange range(Phase::kOptimizer);
    sgd_update();
  }
}
// [fast_step]

}  // namespace prof
