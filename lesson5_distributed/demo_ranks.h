// Lesson 5 — the demo's measurements, shared by //lesson5_distributed:demo and //bench (header only, so it
// is compiled against whichever implementation of ddp.h the binary links: the reference or yours).
//
// The binary starts its ranks as separate PROCESSES of itself (process_ranks.h: fork + exec of /proc/self/exe
// with --l5_rank flags), the way torchrun does: the parent opens a TCPStore server, every rank connects to it and
// joins one Gloo group, and rank 0 sends its measurements back through the store. On a (simulated) real network
// (lesson5_distributed/netns/netns_run.sh), `Network` names one namespace and one address per rank.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>

#include "common/device.h"
#include "common/memory_meter.h"
#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/ddp.h"
#include "lesson5_distributed/process_ranks.h"

namespace l5demo {

/// What every rank runs.
struct Config {
  int world_size = 4;
  int64_t width = 256;  ///< MLP width
  int64_t depth = 16;   ///< Linear layers (2 parameters each)
  int64_t batch = 256;  ///< items per step, all ranks together
  int64_t bucket_bytes = 1 << 20;
  int steps = 10;                  ///< timed steps per variant (after one warm-up step)
  int64_t probe_bytes = 16 << 20;  ///< one large all-reduce: the loopback ceiling of this machine
  int rounds = 1;                  ///< every variant once per round, in turn (rounds > 1: is the ranking stable?)
  int64_t sim_delay_us = 0;        ///< SIMULATED latency per collective (dist::Comm::set_simulated_delay), 0: none
};

/// Where the ranks run (process_ranks.h). Empty: every rank on 127.0.0.1 in this network namespace.
using Network = ranks::Network;

/// Extra measurements of one run (rank 0's), for the napkin math of the "On a real network" runs.
constexpr int kBurst = 16;  ///< calls per burst when measuring a call's own cost

struct Extras {
  /// Gloo's and the machine's own cost of one call, less its wire time, as the steps make them: a burst of
  /// kBurst small collectives back to back (no simulated delay), per call; the median over the rounds.
  double reduce_call_ms = 0;  ///< per all-reduce
  double bcast_call_ms = 0;   ///< per broadcast, the roots in blocks as ZeRO-1's owners
  double tiny_bytes = 0;      ///< the payload of each call in the bursts (16 KiB: little time on the wire)
  double forward_ms = 0;      ///< one step's parts with no communication, every rank busy at once (median of rounds)
  double backward_ms = 0;
  double optimizer_ms = 0;
};

inline Config config_for(bool quick, int world_size) {
  Config c;
  c.world_size = world_size;
  if (quick) {
    c.width = 128, c.depth = 8, c.batch = 64, c.bucket_bytes = 256 << 10, c.steps = 5, c.probe_bytes = 4 << 20;
  }
  return c;
}

/// One row of the demo's table (rank 0's measurements).
struct Result {
  std::string variant;
  int64_t collectives_per_step = 0;
  double payload_bytes_per_step = 0;  ///< handed to all-reduce + broadcast, per rank
  double napkin_bytes_per_step = 0;   ///< ring all-reduce 2(N-1)/N + broadcast (N-1)/N, sent per rank
  double median_ms = 0;
  double min_ms = 0, max_ms = 0;
  int64_t optimizer_state_bytes = 0;                  ///< per rank: workshop::cpu_bytes_kept_by(step 1)
  double rel_diff = 0;                                ///< parameters after the steps vs the per-parameter variant
  double all_reduce_calls = 0, all_reduce_bytes = 0;  ///< per step (payload, not wire bytes)
  double broadcast_calls = 0, broadcast_bytes = 0;    ///< per step
  double all_gather_calls = 0;                        ///< per step (check_gradients_ready's: 32 bytes each)
  std::vector<double> round_ms;  ///< the median step of each round (median_ms: the median of these)
};

// [napkin]
// The napkin figure of one variant's step (results[kind]: 0 per-parameter, 1 bucketed, 2 bucketed + overlap,
// 3 ZeRO-1) on a link that carries `bytes_per_s` out of each rank, with `sim_delay_ms` of SIMULATED latency per
// collective (dist::Comm adds it once per call) and `link_delay_ms` of latency on the link itself (netem), which a
// collective pays once per step of its algorithm:
//   all-reduce:  ring; 2 (N - 1) / N of the payload out of every rank -> wire / bandwidth; 2 (N - 1) link delays;
//   broadcast:   Gloo's binomial tree, ceil(log2 N) steps, the payload out of the root in each -> steps x bytes / bw;
//                ceil(log2 N) link delays;
//   all-gather:  the agreement before the after-backward paths send (32 bytes: its wire time is left out); a ring,
//                N - 1 link delays; its own cost taken as an all-reduce's (not measured apart); it runs before
//                the all-reduces, never under backward;
//   every call:  its delays + its own cost (Gloo, the kernel, waking the peers' threads: measured per kind of call
//                in `e`, in the same run, from bursts of small calls back to back, as the variants make them);
//   compute:     forward, backward and the optimizer step measured with no communication (ZeRO-1: 1/N of it);
//   overlap:     the all-reduces run under backward: forward + max(backward, all-reduce) + optimizer. They are in
//                flight together, so their own costs overlap one another (one counted); their simulated delays
//                do not (one link, one message at a time: dist::Comm::set_simulated_delay).
struct Napkin {
  double compute_ms = 0, wire_ms = 0, calls_ms = 0, total_ms = 0;
};

// A call's own cost (Extras: measured per call of a burst), less the wire time of the burst's payload.
struct CallCost {
  double all_reduce_ms = 0, broadcast_ms = 0;
};
inline CallCost call_cost(const Extras& e, int n, double bytes_per_s) {
  const double tree_steps = std::ceil(std::log2(std::max(1, n)));
  CallCost out;
  out.all_reduce_ms =
      std::max(0.0, e.reduce_call_ms - dist::ring_allreduce_wire_bytes(e.tiny_bytes, n) / bytes_per_s * 1e3);
  out.broadcast_ms = std::max(0.0, e.bcast_call_ms - tree_steps * e.tiny_bytes / bytes_per_s * 1e3);
  return out;
}

inline Napkin napkin(int kind, const Result& r, const Extras& e, int n, double bytes_per_s, double sim_delay_ms,
                     double link_delay_ms = 0) {
  const CallCost own = call_cost(e, n, bytes_per_s);
  const double tree_steps = std::ceil(std::log2(std::max(1, n)));
  const double reduce_delay_ms = sim_delay_ms + 2.0 * (n - 1) * link_delay_ms;
  const double bcast_delay_ms = sim_delay_ms + tree_steps * link_delay_ms;
  const double gather_delay_ms = sim_delay_ms + (n - 1) * link_delay_ms;
  const double reduce_wire_ms = dist::ring_allreduce_wire_bytes(r.all_reduce_bytes, n) / bytes_per_s * 1e3;
  const double bcast_wire_ms = tree_steps * r.broadcast_bytes / bytes_per_s * 1e3;
  const bool overlap = kind >= 2;
  const double reduce_own_ms = (overlap ? std::min(1.0, r.all_reduce_calls) : r.all_reduce_calls) * own.all_reduce_ms;
  const double reduce_calls_ms = r.all_reduce_calls * reduce_delay_ms + reduce_own_ms;
  const double bcast_calls_ms = r.broadcast_calls * (bcast_delay_ms + own.broadcast_ms);
  const double gather_calls_ms = r.all_gather_calls * (gather_delay_ms + own.all_reduce_ms);
  const double optimizer_ms = kind == 3 ? e.optimizer_ms / n : e.optimizer_ms;
  const double reduce_ms = reduce_wire_ms + reduce_calls_ms;
  Napkin out;
  out.compute_ms = e.forward_ms + e.backward_ms + optimizer_ms;
  out.wire_ms = reduce_wire_ms + bcast_wire_ms;
  out.calls_ms = reduce_calls_ms + bcast_calls_ms + gather_calls_ms;
  out.total_ms = e.forward_ms + gather_calls_ms +
                 (overlap ? std::max(e.backward_ms, reduce_ms) : e.backward_ms + reduce_ms) + optimizer_ms +
                 bcast_wire_ms + bcast_calls_ms;
  return out;
}
// [napkin]

inline std::string serialize(const std::vector<Result>& results, double probe_ms, int64_t probe_bytes,
                             const Extras& extras = {}) {
  std::ostringstream out;
  out.precision(17);
  out << probe_ms << " " << probe_bytes << " " << extras.reduce_call_ms << " " << extras.forward_ms << " "
      << extras.backward_ms << " " << extras.optimizer_ms << " " << extras.tiny_bytes << " " << extras.bcast_call_ms
      << "\n";
  for (const auto& r : results) {
    out << r.variant << "\t" << r.collectives_per_step << "\t" << r.payload_bytes_per_step << "\t"
        << r.napkin_bytes_per_step << "\t" << r.median_ms << "\t" << r.min_ms << "\t" << r.max_ms << "\t"
        << r.optimizer_state_bytes << "\t" << r.rel_diff << "\t" << r.all_reduce_calls << "\t" << r.all_reduce_bytes
        << "\t" << r.broadcast_calls << "\t" << r.broadcast_bytes << "\t" << r.all_gather_calls << "\t"
        << r.round_ms.size();
    for (double ms : r.round_ms) out << "\t" << ms;
    out << "\n";
  }
  return out.str();
}

inline std::vector<Result> deserialize(const std::string& text, double* probe_ms, int64_t* probe_bytes,
                                       Extras* extras = nullptr) {
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  Extras e;
  std::istringstream(line) >> *probe_ms >> *probe_bytes >> e.reduce_call_ms >> e.forward_ms >> e.backward_ms >>
      e.optimizer_ms >> e.tiny_bytes >> e.bcast_call_ms;
  if (extras) *extras = e;
  std::vector<Result> out;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    Result r;
    std::getline(fields, r.variant, '\t');
    fields >> r.collectives_per_step >> r.payload_bytes_per_step >> r.napkin_bytes_per_step >> r.median_ms >>
        r.min_ms >> r.max_ms >> r.optimizer_state_bytes >> r.rel_diff;
    size_t rounds = 0;
    fields >> r.all_reduce_calls >> r.all_reduce_bytes >> r.broadcast_calls >> r.broadcast_bytes >>
        r.all_gather_calls >> rounds;
    r.round_ms.resize(rounds);
    for (double& ms : r.round_ms) fields >> ms;
    out.push_back(r);
  }
  return out;
}

inline torch::nn::Sequential mlp(const Config& c) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int64_t i = 0; i < c.depth; ++i) {
    model->push_back(torch::nn::Linear(c.width, c.width));
    if (i + 1 < c.depth) model->push_back(torch::nn::Tanh());
  }
  return model;
}

using workshop::median;  // the workshop's one median (common/device.h)

/// Milliseconds per call of `call`, as the median over `repeats` bursts of `calls` calls back to back, each burst
/// after a barrier; one more burst first, not counted (it connects and warms up).
inline double ms_per_call(dist::Comm& comm, int repeats, int calls, const std::function<void(int)>& call) {
  std::vector<double> ms;
  for (int repeat = 0; repeat <= repeats; ++repeat) {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call(i);
    const double burst = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (repeat > 0) ms.push_back(burst / calls);
  }
  return median(ms);
}

/// The step's parts with no communication, every rank computing at the same time, in every round (the machine's
/// load moves): the compute part of the napkin figures, one median per part appended.
inline void compute_only(dist::Comm& comm, const Config& c, const at::Tensor& xs, const at::Tensor& ys,
                         std::vector<double>* forward, std::vector<double>* backward, std::vector<double>* optimizer) {
  auto model = mlp(c);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  std::vector<double> f, b, o;
  for (int s = 0; s <= c.steps; ++s) {
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor loss = torch::nn::functional::mse_loss(model->forward(xs), ys);
    const auto t1 = std::chrono::steady_clock::now();
    loss.backward();
    const auto t2 = std::chrono::steady_clock::now();
    adam.step();
    const auto t3 = std::chrono::steady_clock::now();
    if (s == 0) continue;  // warm-up (Adam's state appears)
    f.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    b.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    o.push_back(std::chrono::duration<double, std::milli>(t3 - t2).count());
  }
  forward->push_back(median(f)), backward->push_back(median(b)), optimizer->push_back(median(o));
}

/// One round of a variant into its row: the communicator's counts per step, this round's step times.
inline void add_round(Result& r, const dist::CommStats& st, const std::vector<double>& ms, int steps, int n,
                      bool first_round) {
  r.all_reduce_calls = static_cast<double>(st.all_reduce_calls) / steps;
  r.all_reduce_bytes = static_cast<double>(st.all_reduce_bytes) / steps;
  r.broadcast_calls = static_cast<double>(st.broadcast_calls) / steps;
  r.broadcast_bytes = static_cast<double>(st.broadcast_bytes) / steps;
  r.all_gather_calls = static_cast<double>(st.all_gather_calls) / steps;
  r.round_ms.push_back(median(ms));
  r.collectives_per_step = (st.all_reduce_calls + st.broadcast_calls + st.all_gather_calls) / steps;
  r.payload_bytes_per_step = static_cast<double>(st.all_reduce_bytes + st.broadcast_bytes) / steps;
  r.napkin_bytes_per_step = (dist::ring_allreduce_wire_bytes(static_cast<double>(st.all_reduce_bytes), n) +
                             static_cast<double>(st.broadcast_bytes) * (n - 1) / n) /
                            steps;
  r.median_ms = median(r.round_ms);
  const double lo = *std::min_element(ms.begin(), ms.end()), hi = *std::max_element(ms.begin(), ms.end());
  r.min_ms = first_round ? lo : std::min(r.min_ms, lo);
  r.max_ms = first_round ? hi : std::max(r.max_ms, hi);
}

/// `steps` steps, each after a barrier (the ranks start together), in milliseconds.
inline std::vector<double> timed_steps(dist::Comm& comm, int steps, const std::function<void()>& step) {
  std::vector<double> ms;
  for (int s = 0; s < steps; ++s) {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return ms;
}

/// How far `now` is from `first`: the largest absolute difference over the largest magnitude of `first`.
inline double max_rel_diff(const std::vector<at::Tensor>& now, const std::vector<at::Tensor>& first) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < now.size(); ++i) {
    diff = std::max(diff, (now[i] - first[i]).abs().max().item<double>());
    scale = std::max(scale, first[i].abs().max().item<double>());
  }
  return diff / scale;
}

/// Everything one rank measures; rank 0's results are the table.
inline std::vector<Result> run_rank(dist::Comm& comm, const Config& c, double* probe_ms, Extras* extras = nullptr) {
  const int n = comm.world_size();
  TORCH_CHECK(c.batch % n == 0, "--batch must divide evenly into the world size");
  torch::manual_seed(1);
  const at::Tensor x = at::randn({c.batch, c.width}), y = at::randn({c.batch, c.width});
  const at::Tensor xs = ddp::shard(x, comm.rank(), n), ys = ddp::shard(y, comm.rank(), n);

  // [demo_probe]
  // The loopback ceiling: one large all-reduce, timed (median of 5), as algorithm bandwidth.
  {
    at::Tensor big = at::ones({c.probe_bytes / 4});
    *probe_ms = ms_per_call(comm, 5, 1, [&](int) { comm.all_reduce(big); });
  }
  // [demo_probe]
  Extras local;
  at::Tensor tiny = at::zeros({4096});  // zeros: sums of the bursts stay finite
  local.tiny_bytes = static_cast<double>(tiny.nbytes());
  std::vector<double> round_forward, round_backward, round_optimizer, round_reduce_call, round_bcast_call;

  std::vector<Result> results(4);
  std::vector<at::Tensor> first_params;
  enum Kind { kPerParameter, kBucketed, kOverlap, kZero };
  const char* names[] = {"per-parameter all-reduce", "bucketed", "bucketed + overlap", "ZeRO-1 (+ overlap)"};
  for (int round = 0; round < std::max(1, c.rounds); ++round) {  // each round: every variant, in turn
    compute_only(comm, c, xs, ys, &round_forward, &round_backward, &round_optimizer);
    {
      // [demo_call_cost]
      // The per-call cost of Gloo, the kernel and the machine, in every round: bursts of small calls back to back
      // (as the per-parameter variant's all-reduces and ZeRO-1's broadcasts go), with no simulated delay, per call,
      // less the wire time of its bytes. An isolated call after a barrier costs more (every peer wakes up for it);
      // a burst is what the steps make.
      comm.set_simulated_delay(std::chrono::microseconds(0));
      round_reduce_call.push_back(ms_per_call(comm, 3, kBurst, [&](int) { comm.all_reduce(tiny); }));
      round_bcast_call.push_back(  // roots in blocks, as ZeRO-1's owners
          ms_per_call(comm, 3, kBurst, [&](int i) { comm.broadcast(tiny, i * n / kBurst); }));
      comm.set_simulated_delay(std::chrono::microseconds(c.sim_delay_us));  // for the steps (0: none)
      // [demo_call_cost]
    }
    for (int kind = kPerParameter; kind <= kZero; ++kind) {
      auto model = mlp(c);
      const std::vector<at::Tensor> params = model->parameters();
      std::unique_ptr<ddp::Reducer> reducer;
      if (kind == kOverlap || kind == kZero) {
        ddp::ReducerOptions options;
        options.bucket_bytes = c.bucket_bytes;
        options.first_bucket_bytes = c.bucket_bytes;  // the bucketed row's buckets (and the bench peer's DDP cap)
        reducer = std::make_unique<ddp::Reducer>(comm, params, options);
      }
      const std::vector<ddp::Bucket> buckets = ddp::make_buckets(params, c.bucket_bytes);
      torch::optim::Adam adam(params, torch::optim::AdamOptions(1e-3));
      std::unique_ptr<ddp::ZeroOptimizer> zero;
      if (kind == kZero) {
        zero = std::make_unique<ddp::ZeroOptimizer>(comm, params, [](std::vector<at::Tensor> mine) {
          return std::unique_ptr<torch::optim::Optimizer>(
              new torch::optim::Adam(mine, torch::optim::AdamOptions(1e-3)));
        });
      }
      int64_t state_bytes = 0;
      // [demo_step]
      auto step = [&](bool first) {
        for (const auto& p : params) p.mutable_grad() = at::Tensor();
        torch::nn::functional::mse_loss(model->forward(xs), ys).backward();
        if (kind == kPerParameter) ddp::average_gradients(comm, params);                // one call per parameter
        if (kind == kBucketed) ddp::average_gradients_bucketed(comm, params, buckets);  // one per bucket
        if (reducer) reducer->finish();  // buckets went out during backward; wait for them
        // The optimizer state appears at step 1: measured on a fresh thread (cpu_bytes_kept_by), since a meter of
        // this process also saw Gloo's threads free the buffers they held during the step (a 1 MiB bucket).
        auto optimizer_step = [&] {
          if (zero) {
            zero->step_local();
          } else {
            adam.step();
          }
        };
        if (first) {
          state_bytes = workshop::cpu_bytes_kept_by(optimizer_step);
        } else {
          optimizer_step();
        }
        if (zero) zero->sync_parameters();
      };
      // [demo_step]
      step(true);
      comm.reset_stats();
      const std::vector<double> ms = timed_steps(comm, c.steps, [&] { step(false); });
      Result& r = results[static_cast<size_t>(kind)];
      r.variant = names[kind];
      add_round(r, comm.stats(), ms, c.steps, n, round == 0);
      r.optimizer_state_bytes = state_bytes;
      std::vector<at::Tensor> now;
      for (const auto& p : params) now.push_back(p.detach().clone());
      if (kind == kPerParameter) first_params = now;
      r.rel_diff = std::max(round == 0 ? 0.0 : r.rel_diff, max_rel_diff(now, first_params));
    }
  }
  local.forward_ms = median(round_forward), local.backward_ms = median(round_backward);
  local.optimizer_ms = median(round_optimizer);
  local.reduce_call_ms = median(round_reduce_call), local.bcast_call_ms = median(round_bcast_call);
  if (extras) *extras = local;
  return results;
}

/// In a child started by launch(): runs this rank and returns its exit code. -1 when argv is not a child's.
inline int maybe_run_as_rank(int argc, char** argv) {
  return ranks::run_as_rank("l5", argc, argv, [](dist::Comm& comm, const std::vector<std::string>& args) {
    bool quick = false;
    Config c;
    c.steps = 0;  // 0: the config's own
    for (const std::string& a : args) {
      auto value = [&](const char* name) { return a.substr(std::strlen(name)); };
      if (a.rfind("--l5_rounds=", 0) == 0) c.rounds = std::stoi(value("--l5_rounds="));
      if (a.rfind("--l5_steps=", 0) == 0) c.steps = std::stoi(value("--l5_steps="));
      if (a.rfind("--l5_delay_us=", 0) == 0) c.sim_delay_us = std::stoll(value("--l5_delay_us="));
      if (a == "--l5_quick") quick = true;
    }
    Config config = config_for(quick, comm.world_size());
    config.rounds = c.rounds, config.sim_delay_us = c.sim_delay_us;
    if (c.steps > 0) config.steps = c.steps;
    double probe_ms = 0;
    Extras extras;
    const std::vector<Result> results = run_rank(comm, config, &probe_ms, &extras);
    return serialize(results, probe_ms, config.probe_bytes, extras);
  });
}

/// Starts `config.world_size` ranks as processes of this binary (ranks::launch), waits (at most `deadline`), and
/// returns rank 0's results. Any rank still running at the deadline is killed; a failed rank is an error.
/// `exit_rank` >= 0: that rank exits right after joining the group (a fault drill: the others must fail fast).
/// `network`: namespaces and addresses per rank (see Network; nullptr: loopback). `extras`: filled when given.
inline std::vector<Result> launch(const Config& config, bool quick, std::chrono::seconds deadline, double* probe_ms,
                                  int64_t* probe_bytes, int exit_rank = -1, const Network* network = nullptr,
                                  Extras* extras = nullptr) {
  ranks::Launch l;
  l.prefix = "l5", l.who = "lesson 5 demo", l.world_size = config.world_size;
  l.args = {"--l5_rounds=" + std::to_string(config.rounds), "--l5_steps=" + std::to_string(config.steps),
            "--l5_delay_us=" + std::to_string(config.sim_delay_us)};
  if (quick) l.args.push_back("--l5_quick");
  l.exit_rank = exit_rank, l.network = network, l.deadline = deadline;
  return deserialize(ranks::launch(l), probe_ms, probe_bytes, extras);
}

}  // namespace l5demo
