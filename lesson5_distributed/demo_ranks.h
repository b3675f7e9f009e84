// Lesson 5 — the demo's measurements, shared by //lesson5_distributed:demo and //bench (header only, so it
// is compiled against whichever implementation of ddp.h the binary links: the reference or yours).
//
// The binary starts its ranks as separate PROCESSES of itself (fork + exec of /proc/self/exe with --l5_rank
// flags), the way torchrun does: the parent opens a TCPStore server on 127.0.0.1 at a port the system picks,
// every rank connects to it and joins one Gloo group, and rank 0 sends its measurements back through the store.
// The parent waits with a deadline and kills (by pid) any rank that outlives it.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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

#include "common/memory_meter.h"
#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/ddp.h"

extern char** environ;

namespace l5demo {

/// What every rank runs.
struct Config {
  int world_size = 4;
  int64_t width = 256;         ///< MLP width
  int64_t depth = 16;          ///< Linear layers (2 parameters each)
  int64_t batch = 256;         ///< items per step, all ranks together
  int64_t bucket_bytes = 1 << 20;
  int steps = 10;              ///< timed steps per variant (after one warm-up step)
  int64_t probe_bytes = 16 << 20;  ///< one large all-reduce: the loopback ceiling of this machine
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
  int64_t optimizer_state_bytes = 0;  ///< per rank, counted by workshop::MemoryMeter in this rank's process
  double rel_diff = 0;                ///< parameters after the steps vs the per-parameter variant
};

inline std::string serialize(const std::vector<Result>& results, double probe_ms, int64_t probe_bytes) {
  std::ostringstream out;
  out.precision(17);
  out << probe_ms << " " << probe_bytes << "\n";
  for (const auto& r : results) {
    out << r.variant << "\t" << r.collectives_per_step << "\t" << r.payload_bytes_per_step << "\t"
        << r.napkin_bytes_per_step << "\t" << r.median_ms << "\t" << r.min_ms << "\t" << r.max_ms << "\t" << r.optimizer_state_bytes << "\t" << r.rel_diff
        << "\n";
  }
  return out.str();
}

inline std::vector<Result> deserialize(const std::string& text, double* probe_ms, int64_t* probe_bytes) {
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  std::istringstream(line) >> *probe_ms >> *probe_bytes;
  std::vector<Result> out;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    Result r;
    std::getline(fields, r.variant, '\t');
    fields >> r.collectives_per_step >> r.payload_bytes_per_step >> r.napkin_bytes_per_step >> r.median_ms >>
        r.min_ms >> r.max_ms >>
        r.optimizer_state_bytes >> r.rel_diff;
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

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// Everything one rank measures; rank 0's results are the table.
inline std::vector<Result> run_rank(dist::Comm& comm, const Config& c, double* probe_ms) {
  const int n = comm.world_size();
  TORCH_CHECK(c.batch % n == 0, "--batch must divide evenly into the world size");
  torch::manual_seed(1);
  const at::Tensor x = at::randn({c.batch, c.width}), y = at::randn({c.batch, c.width});
  const at::Tensor xs = ddp::shard(x, comm.rank(), n), ys = ddp::shard(y, comm.rank(), n);

  // [demo_probe]
  // The loopback ceiling: one large all-reduce, timed (median of 5), as algorithm bandwidth.
  {
    at::Tensor big = at::ones({c.probe_bytes / 4});
    std::vector<double> ms;
    for (int i = 0; i < 6; ++i) {
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      comm.all_reduce(big);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    ms.erase(ms.begin());  // the first one connects and warms up
    *probe_ms = median(ms);
  }
  // [demo_probe]

  std::vector<Result> results;
  std::vector<at::Tensor> first_params;
  enum Kind { kPerParameter, kBucketed, kOverlap, kZero };
  const char* names[] = {"per-parameter all-reduce", "bucketed", "bucketed + overlap", "ZeRO-1 (+ overlap)"};
  for (int kind = kPerParameter; kind <= kZero; ++kind) {
    auto model = mlp(c);
    const std::vector<at::Tensor> params = model->parameters();
    std::unique_ptr<ddp::Reducer> reducer;
    if (kind == kOverlap || kind == kZero) {
      ddp::ReducerOptions options;
      options.bucket_bytes = c.bucket_bytes;
      reducer = std::make_unique<ddp::Reducer>(comm, params, options);
    }
    const std::vector<ddp::Bucket> buckets = ddp::make_buckets(params, c.bucket_bytes);
    torch::optim::Adam adam(params, torch::optim::AdamOptions(1e-3));
    std::unique_ptr<ddp::ZeroOptimizer> zero;
    if (kind == kZero) {
      zero = std::make_unique<ddp::ZeroOptimizer>(comm, params, [](std::vector<at::Tensor> mine) {
        return std::unique_ptr<torch::optim::Optimizer>(new torch::optim::Adam(mine, torch::optim::AdamOptions(1e-3)));
      });
    }
    int64_t state_bytes = 0;
    // [demo_step]
    auto step = [&](bool first) {
      for (const auto& p : params) p.mutable_grad() = at::Tensor();
      torch::nn::functional::mse_loss(model->forward(xs), ys).backward();
      if (kind == kPerParameter) ddp::average_gradients(comm, params);          // one call per parameter
      if (kind == kBucketed) ddp::average_gradients_bucketed(comm, params, buckets);  // one per bucket
      if (reducer) reducer->finish();  // buckets went out during backward; wait for them
      workshop::MemoryMeter meter;     // this process = this rank: its optimizer state appears at step 1
      if (zero) {
        zero->step_local();
        if (first) state_bytes = meter.current_bytes();
        zero->sync_parameters();
      } else {
        adam.step();
        if (first) state_bytes = meter.current_bytes();
      }
    };
    // [demo_step]
    step(true);
    comm.reset_stats();
    std::vector<double> ms;
    for (int s = 0; s < c.steps; ++s) {
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      step(false);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    const dist::CommStats& st = comm.stats();
    Result r;
    r.variant = names[kind];
    r.collectives_per_step = (st.all_reduce_calls + st.broadcast_calls + st.all_gather_calls) / c.steps;
    r.payload_bytes_per_step = static_cast<double>(st.all_reduce_bytes + st.broadcast_bytes) / c.steps;
    r.napkin_bytes_per_step =
        (dist::ring_allreduce_wire_bytes(static_cast<double>(st.all_reduce_bytes), n) +
         static_cast<double>(st.broadcast_bytes) * (n - 1) / n) / c.steps;
    r.median_ms = median(ms);
    r.min_ms = *std::min_element(ms.begin(), ms.end());
    r.max_ms = *std::max_element(ms.begin(), ms.end());
    r.optimizer_state_bytes = state_bytes;
    std::vector<at::Tensor> now;
    for (const auto& p : params) now.push_back(p.detach().clone());
    if (first_params.empty()) first_params = now;
    double diff = 0, scale = 0;
    for (size_t i = 0; i < now.size(); ++i) {
      diff = std::max(diff, (now[i] - first_params[i]).abs().max().item<double>());
      scale = std::max(scale, first_params[i].abs().max().item<double>());
    }
    r.rel_diff = diff / scale;
    results.push_back(r);
  }
  return results;
}

/// In a child started by launch(): runs this rank and returns its exit code. -1 when argv is not a child's.
inline int maybe_run_as_rank(int argc, char** argv) {
  int rank = -1, port = -1;
  bool quick = false, exit_after_join = false;
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) { return a.substr(std::strlen(name)); };
    if (a.rfind("--l5_rank=", 0) == 0) rank = std::stoi(value("--l5_rank="));
    if (a.rfind("--l5_port=", 0) == 0) port = std::stoi(value("--l5_port="));
    if (a.rfind("--l5_world=", 0) == 0) c.world_size = std::stoi(value("--l5_world="));
    if (a == "--l5_quick") quick = true;
    if (a == "--l5_exit_after_join") exit_after_join = true;
  }
  if (rank < 0) return -1;
  try {
    const Config config = config_for(quick, c.world_size);
    dist::TcpRendezvous store("127.0.0.1", port, /*is_server=*/false, std::chrono::seconds(120));
    std::unique_ptr<dist::Comm> comm = store.join(rank, config.world_size);
    if (exit_after_join) std::_Exit(0);  // the fault drill: leave without a word, sockets closed by the kernel
    double probe_ms = 0;
    const std::vector<Result> results = run_rank(*comm, config, &probe_ms);
    comm->barrier();
    if (rank == 0) store.set("l5/results", serialize(results, probe_ms, config.probe_bytes));
    store.get("l5/done");  // the parent says when it has read the results: keep the store's clients alive
    return 0;
  } catch (const c10::Error& error) {
    const std::string message = error.what_without_backtrace();
    std::cerr << (message.rfind("rank ", 0) == 0 ? "" : "rank " + std::to_string(rank) + ": ") << message << "\n";
    return 1;
  } catch (const std::exception& error) {
    std::cerr << "rank " << rank << ": " << error.what() << "\n";
    return 1;
  }
}

/// Starts `config.world_size` ranks as processes of this binary, waits (at most `deadline`), and returns
/// rank 0's results. Any rank still running at the deadline is killed; a failed rank is an error.
/// `exit_rank` >= 0: that rank exits right after joining the group (a fault drill: the others must fail fast).
inline std::vector<Result> launch(const Config& config, bool quick, std::chrono::seconds deadline, double* probe_ms,
                                  int64_t* probe_bytes, int exit_rank = -1) {
  dist::TcpRendezvous store("127.0.0.1", 0, /*is_server=*/true, deadline);
  const int port = store.port();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < config.world_size; ++rank) {
    std::vector<std::string> args = {"/proc/self/exe", "--l5_rank=" + std::to_string(rank),
                                     "--l5_world=" + std::to_string(config.world_size),
                                     "--l5_port=" + std::to_string(port)};
    if (quick) args.push_back("--l5_quick");
    if (rank == exit_rank) args.push_back("--l5_exit_after_join");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(&a[0]);
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int error = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ);
    TORCH_CHECK(error == 0, "could not start rank ", rank, ": ", std::strerror(error));
    pids.push_back(pid);
  }
  // Wait for rank 0's results while watching the ranks: a rank that fails ends the wait at once.
  std::string failure;
  std::vector<bool> exited(pids.size(), false);
  const auto give_up = std::chrono::steady_clock::now() + deadline;
  while (!store.has("l5/results") && failure.empty()) {
    for (size_t r = 0; r < pids.size(); ++r) {
      int status = 0;
      if (!exited[r] && waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        exited[r] = true;
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) failure = "rank " + std::to_string(r) + " failed (see above)";
      }
    }
    if (std::chrono::steady_clock::now() > give_up) failure = "no results from rank 0 within the deadline";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string text = failure.empty() ? store.get("l5/results") : "";
  store.set("l5/done", "1");
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(failure.empty() ? 30 : 1);
  for (size_t r = 0; r < pids.size(); ++r) {
    if (exited[r]) continue;
    int status = 0;
    while (waitpid(pids[r], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > until) {
        kill(pids[r], SIGKILL);  // only the ranks this function started, by pid
        waitpid(pids[r], &status, 0);
        if (failure.empty()) failure = "rank " + std::to_string(r) + " did not exit and was killed";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (failure.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      failure = "rank " + std::to_string(r) + " failed (see above)";
    }
  }
  TORCH_CHECK(failure.empty(), "lesson 5 demo: ", failure);
  return deserialize(text, probe_ms, probe_bytes);
}

}  // namespace l5demo
