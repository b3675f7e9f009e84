// Lesson 7's demo: one rank's training step, DDP-style, ZeRO-1 (lesson 5's ddp::ZeroOptimizer) or fully sharded
// (steps 2 to 4), and what the rank kept, sent and spent. Every mode of the demo trains with it: demo.cc's threads
// and demo_ranks.cc's processes (the files are listed in demo_parts.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <sys/resource.h>

#include <torch/torch.h>

#include "common/device.h"
#include "common/memory_meter.h"
#include "common/report.h"
#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/ddp.h"
#include "lesson7_fsdp/demo_parts.h"
#include "lesson7_fsdp/fsdp.h"

namespace l7demo {

std::vector<std::vector<torch::Tensor>> make_layers(int layers, int64_t width) {
  torch::manual_seed(3);
  std::vector<std::vector<torch::Tensor>> out;
  for (int l = 0; l < layers; ++l) {
    torch::nn::Linear layer(width, width);
    out.push_back({layer->weight.detach().clone(), layer->bias.detach().clone()});
  }
  return out;
}

torch::Tensor layer_fn(const torch::Tensor& x, const std::vector<torch::Tensor>& p) {
  return torch::tanh(torch::nn::functional::linear(x, p[0], p[1]));
}

bool is_sharded(Mode mode) { return mode == Mode::kSharded || mode == Mode::kStack || mode == Mode::kPrefetch; }

namespace {

// Bytes of the parameters and their gradients that `params` hold, plus `state_bytes` of optimizer state.
int64_t persistent_bytes(const std::vector<torch::Tensor>& params, int64_t state_bytes) {
  int64_t bytes = state_bytes;
  for (const auto& p : params) {
    bytes += static_cast<int64_t>(p.nbytes());
    if (p.grad().defined()) bytes += static_cast<int64_t>(p.grad().nbytes());
  }
  return bytes;
}

// CPU seconds this process has used so far, user + system, every thread (Gloo's included).
double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * t.tv_usec; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// One rank's model and optimizer in one mode. Not movable: the stack keeps a reference to `flats`.
struct RankModel {
  RankModel() = default;
  RankModel(const RankModel&) = delete;
  RankModel& operator=(const RankModel&) = delete;
  std::vector<std::vector<torch::Tensor>> replicas;  // DDP-style, ZeRO-1: every parameter on every rank
  std::vector<fsdp::FlatParam> flats;                // sharded: a slice of each layer's flat buffer
  std::vector<torch::Tensor> params;                 // every parameter this rank holds
  std::vector<fsdp::LayerFn> fns;
  std::unique_ptr<torch::optim::Adam> adam;   // all but ZeRO-1
  std::unique_ptr<ddp::ZeroOptimizer> zero;   // ZeRO-1: Adam over this rank's share only
  std::unique_ptr<fsdp::ShardedStack> stack;  // kStack, kPrefetch
};

std::unique_ptr<RankModel> make_rank_model(dist::Comm& comm, Mode mode,
                                           const std::vector<std::vector<torch::Tensor>>& init) {
  auto m = std::make_unique<RankModel>();
  for (const auto& layer : init) {
    if (is_sharded(mode)) {
      m->flats.push_back(fsdp::flatten_and_shard(layer, comm.rank(), comm.world_size()));
      m->params.push_back(m->flats.back().shard);
    } else {
      m->replicas.emplace_back();
      for (const auto& t : layer) m->replicas.back().push_back(t.clone().requires_grad_(true));
      m->params.insert(m->params.end(), m->replicas.back().begin(), m->replicas.back().end());
    }
  }
  m->fns.assign(init.size(), fsdp::LayerFn(layer_fn));
  const torch::optim::AdamOptions options(1e-3);
  if (mode == Mode::kZero1) {
    m->zero = std::make_unique<ddp::ZeroOptimizer>(comm, m->params, [&](std::vector<at::Tensor> mine) {
      return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::Adam(std::move(mine), options));
    });
  } else {
    m->adam = std::make_unique<torch::optim::Adam>(m->params, options);
  }
  if (mode == Mode::kStack || mode == Mode::kPrefetch) {
    m->stack = std::make_unique<fsdp::ShardedStack>(comm, m->flats, m->fns, mode == Mode::kPrefetch);
  }
  return m;
}

// DDP-style and ZeRO-1: one all-reduce of every gradient (flattened into one buffer), then the average.
void all_reduce_gradients(dist::Comm& comm, const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad().reshape({-1}));
  torch::Tensor flat = torch::cat(grads);
  comm.all_reduce(flat);
  flat.div_(comm.world_size());
  int64_t offset = 0;
  for (const auto& p : params) {
    p.grad().copy_(flat.narrow(0, offset, p.numel()).view_as(p));
    offset += p.numel();
  }
}

// One training step of `m` on this rank's slice `xr`, `yr` of the batch.
void one_step(dist::Comm& comm, RankModel& m, Mode mode, const torch::Tensor& xr, const torch::Tensor& yr) {
  if (m.zero) m.zero->zero_grad();
  if (m.adam) m.adam->zero_grad();
  torch::Tensor h = xr;
  if (m.stack) h = m.stack->forward(xr);
  for (size_t l = 0; l < m.fns.size() && !m.stack; ++l) {
    h = is_sharded(mode) ? fsdp::sharded_forward(comm, m.flats[l], m.fns[l], h) : layer_fn(h, m.replicas[l]);
  }
  torch::mse_loss(h, yr).backward();
  if (m.stack) m.stack->finish();
  if (!is_sharded(mode)) all_reduce_gradients(comm, m.params);
  if (m.zero) m.zero->step();  // Adam on this rank's share, then every parameter broadcast from its owner
  if (m.adam) m.adam->step();
}

// Rank 0's bytes of one step from the communicator's counts. Sharded: every byte it sent point-to-point. DDP-style:
// Gloo's all-reduce payload as a ring's 2 (N - 1) / N. ZeRO-1: that, plus the broadcasts' bytes (counted on every
// rank) x (N - 1) / N, what each rank sends of them on average (each broadcast reaches N - 1 ranks once). The link
// bytes (the napkin's communication): the same, except that ZeRO-1's broadcasts count ceil(log2 N) times (Gloo's
// binomial tree: the payload leaves a sender once per tree step, and the broadcasts run one after another), as
// lesson 5's napkin counts them.
void count_bytes(const dist::CommStats& stats, Mode mode, int n, StepFigures& out) {
  const double ring = dist::ring_allreduce_wire_bytes(static_cast<double>(stats.all_reduce_bytes), n);
  const double broadcast = static_cast<double>(stats.broadcast_bytes);
  const double tree_steps = std::ceil(std::log2(std::max(1, n)));
  out.sent = is_sharded(mode) ? stats.send_bytes : static_cast<int64_t>(ring + broadcast * (n - 1) / n);
  out.agreement_sent = stats.all_gather_bytes * (n - 1);  // the stack's agreement records (gathered to every peer)
  out.link_bytes =
      is_sharded(mode) ? out.sent + out.agreement_sent : static_cast<int64_t>(ring + tree_steps * broadcast);
  out.calls = stats.calls;
}

}  // namespace

StepFigures train_rank(dist::Comm& comm, Mode mode, const std::vector<std::vector<torch::Tensor>>& init,
                       const torch::Tensor& xr, const torch::Tensor& yr, int steps, bool warm_up, bool peak) {
  const int64_t before = peak ? workshop::cpu_allocated_bytes() : 0;  // before this row's model exists
  const std::unique_ptr<RankModel> m = make_rank_model(comm, mode, init);
  std::optional<workshop::MemoryMeter> meter;  // the whole process: with --world_size, this rank
  if (peak) meter.emplace();
  StepFigures out;
  double cpu_s = 0;
  for (int s = warm_up ? -1 : 0; s < steps; ++s) {
    comm.barrier();
    comm.reset_stats();
    if (meter) meter->reset();
    const int64_t at_start = meter ? workshop::cpu_allocated_bytes() - before : 0;
    const double cpu_start = cpu_seconds();
    const auto start = std::chrono::steady_clock::now();
    one_step(comm, *m, mode, xr, yr);
    const auto end = std::chrono::steady_clock::now();
    const double cpu_end = cpu_seconds();
    if (s < 0) continue;
    out.ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
    cpu_s += cpu_end - cpu_start;
    if (meter) out.peak = std::max(out.peak, at_start + meter->peak_bytes());
  }
  out.persistent = persistent_bytes(m->params, m->zero ? m->zero->state_bytes() : ddp::optimizer_state_bytes(*m->adam));
  count_bytes(comm.stats(), mode, comm.world_size(), out);
  out.median_ms = workshop::median(out.ms);
  out.cpu_ms = cpu_s * 1e3 / std::max(1, steps);
  return out;
}

}  // namespace l7demo
