// Lesson 7's demo: what its files share. //lesson7_fsdp:demo (the reference solution) and :my_demo (your fsdp.cc)
// compile them all into one binary, one mode per file:
//   demo.cc             main, and the default mode: 2 ranks as threads (the rings, one training step)
//   demo_processes.cc   --world_size=N: N ranks as processes, on loopback or on shaped links (netns_run.sh)
//   demo_ranks.cc       what each of those rank processes measures, and the text it sends back
//   demo_what_fits.cc   --what_fits: step 7's table (arithmetic, nothing runs)
//   demo_step.cc        one rank's training step, DDP-style, ZeRO-1 or fully sharded, and what it kept and sent
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/demo.h"
#include "lesson5_distributed/comm.h"

namespace l7demo {

// ---- demo_step.cc: one rank's training step.

/// The model: `layers` square Linear layers of `width` with tanh between; every rank gets the same initial values
/// (seed 3).
std::vector<std::vector<torch::Tensor>> make_layers(int layers, int64_t width);

/// One layer: tanh(linear(x, weight, bias)).
torch::Tensor layer_fn(const torch::Tensor& x, const std::vector<torch::Tensor>& p);

/// Rank 0's figures of a run of steps.
struct StepFigures {
  int64_t persistent = 0;      ///< after the steps: parameters, gradients, optimizer state
  int64_t sent = 0;            ///< in one step (the last)
  int64_t agreement_sent = 0;  ///< in one step: the stack's agreement records (all_gather)
  int64_t link_bytes = 0;      ///< in one step: the bytes the napkin puts through the link one after another
  int64_t calls = 0;           ///< communicator calls in one step (the last)
  double median_ms = 0;
  std::vector<double> ms;  ///< every timed step
  /// Whole-process figures, for --world_size (a process per rank; the default mode's ranks are threads of one
  /// process): the most tensor bytes held during a timed step, counted from before this row's model existed (so:
  /// parameters, gradients, optimizer state, activations, gathered layers, buffers; only with train_rank's `peak`),
  /// and the CPU ms per timed step (getrusage: user + system of every thread).
  int64_t peak = 0;
  double cpu_ms = 0;
};

/// kSharded: layer by layer (step 3); kStack / kPrefetch: the ShardedStack (step 4) without / with prefetch;
/// kZero1: replicated parameters and gradients, Adam's state sharded (lesson 5's step 5, ddp::ZeroOptimizer).
enum class Mode { kDdp, kZero1, kSharded, kStack, kPrefetch };

bool is_sharded(Mode mode);

/// One rank's `steps` steps on its slice `xr`, `yr` of the batch. `warm_up`: one untimed step first. `peak`: measure
/// the peak bytes (a rank per process only: the meter counts the whole process, and its counting allocator costs a
/// lock per allocation, which the default mode's timings go without).
StepFigures train_rank(dist::Comm& comm, Mode mode, const std::vector<std::vector<torch::Tensor>>& init,
                       const torch::Tensor& xr, const torch::Tensor& yr, int steps, bool warm_up = false,
                       bool peak = false);

// ---- demo_ranks.cc: the rank processes of --world_size.

/// What every rank runs.
struct ProcConfig {
  int rounds = 1;
  int steps = 10;
  int layers = 8;
  int64_t width = 512;
  int64_t items = 256;   ///< per rank
  int64_t delay_us = 0;  ///< SIMULATED latency per collective (dist::Comm::set_simulated_delay)
};

/// The rows, in order: DDP-style, ZeRO-1, fully sharded without and with prefetch.
constexpr int kProcModes = 4;
constexpr int kNoPrefetchRow = 2, kPrefetchRow = 3;
inline constexpr Mode kProcMode[kProcModes] = {Mode::kDdp, Mode::kZero1, Mode::kStack, Mode::kPrefetch};
inline constexpr const char* kProcName[kProcModes] = {"DDP-style: replicated, one all-reduce",
                                                      "ZeRO-1: replicated, Adam's state sharded",
                                                      "fully sharded, no prefetch", "fully sharded + prefetch"};

/// The flags that hand `c` to every rank.
std::vector<std::string> proc_args(const ProcConfig& c);

/// Rank 0's figures, read back from its text.
struct ProcResults {
  double probe_ms = 0, probe_sent = 0, forward = 0, backward = 0, optimizer = 0;
  struct Row {
    double kept = 0, peak = 0, peak_any = 0, sent = 0, link_bytes = 0, calls = 0;
    std::vector<double> round_ms, round_cpu_ms;
  };
  std::vector<Row> rows = std::vector<Row>(kProcModes);
};

ProcResults parse_results(const std::string& text);

/// In a rank process started by run_processes: runs the rank and returns its exit code; elsewhere -1.
int run_as_rank(int argc, char** argv);

// ---- demo_processes.cc and demo_what_fits.cc: the other modes.

/// --world_size's flags (and the shaped links'), name -> help.
workshop::FlagHelp process_flags();

/// --world_size=N: the step four ways with N ranks as processes; on namespaces with --netns and --hosts.
int run_processes(const workshop::Demo& demo);

/// --what_fits: step 7's table, one per model, on 8 to 64 H200s.
void print_what_fits(const std::string& csv_dir);

}  // namespace l7demo
