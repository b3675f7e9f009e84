// Benchmarks, side by side: each case runs its baseline and its improved variants in one process on one
// device, warmed up, repeated, synchronised, on random (non-zero) inputs, and reports medians, spread and
// ratios — never a bare time. Beside each, the napkin math: FLOPs and bytes of the workload, the device's
// ceilings measured in the same run the way the workload runs, and the fraction achieved (never above 100%).
//
//   bazel run //bench -- [--device=best|cpu|cuda] [--quick] [--out_dir=DIR] [--cases=l1,l2,l3,l4,scaler,l5,l6]
//                        [--world_sizes=2,4]
//                        [--peer=on|off] [--peer_python=PATH] [--threads=N] [--rounds=N]
//
// Beside our rows, the same run times PyTorch's own implementations from Python (bench/peer.py, a subprocess
// given the same sizes, seed, thread count and device): torch.autocast and its GradScaler, the accumulation
// loop, torch.utils.checkpoint.checkpoint_sequential, the GradScaler's own cost, DistributedDataParallel and
// ZeroRedundancyOptimizer on gloo with the same ranks, and torch.optim.AdamW (also fused where the version has
// it for the device). The interpreter is --peer_python, else
// $WORKSHOP_PEER_PYTHON, else /usr/bin/python3 (Debian's python3-torch); without torch there the bench says so
// and runs our rows alone.
//
// With --out_dir it writes DIR/bench_<device kind>.csv (machine-readable) and DIR/bench_<device kind>.md
// (Markdown tables headed by device, LibTorch and PyTorch versions, load, date and command), which docs/results/
// keeps. CSV: one line per implementation and workload; impl is ours or pytorch; ratio is ours' speed-up over
// the benchmark's first variant (ours lines), ours_over_pytorch_time is our median over PyTorch's (pytorch
// lines); peak_or_bytes is our meter's peak (or the napkin bytes of the scaler and lesson 5),
// same_way_peak_bytes the peak both sides measure the same way (bench/peer_runner.h).
//
// The cases register themselves (bench/registry.h): each lesson's in its solution's folder
// (solutions/lessonN_*/bench_case.cc, the manifest's `bench`), the scaler's in bench/scaler.cc; the rounds,
// ceilings and report are bench/harness.cc.
#include "bench/registry.h"

int main(int argc, char** argv) { return bench::run_bench(argc, argv, bench::registered_cases()); }
