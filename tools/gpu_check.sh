#!/usr/bin/env bash
# The one prepared script for a machine with an NVIDIA GPU (tested on CPU with ALLOW_CPU=1).
#
#   OUT=/some/folder bash tools/gpu_check.sh            # on the GPU machine
#   ALLOW_CPU=1 OUT=/tmp/cpu_check bash tools/gpu_check.sh   # rehearsal on a CPU machine
#   GPU_MUTANTS=1 OUT=... bash tools/gpu_check.sh        # also lesson 6's CUDA-kernel mutants (+ about 3 min)
#
# It builds the repository against the CUDA LibTorch inside the installed PyTorch (or $LIBTORCH), runs the
# reference solutions' checks with every GPU case (none may be skipped), the lesson demos on CUDA and the
# benchmarks, and writes into $OUT (at most 8 files, none deeper than $OUT/x/y):
#   env.txt        device, driver, compiler, PyTorch/LibTorch and Bazel versions
#   tests.log      the checks' full output;  tests_summary.txt  per-test and GPU-skip summary
#   demos.log      every demo's printed tables;  csv.tar.gz  their CSV files
#   bench_<kind>.md / bench_<kind>.csv   the benchmark tables (device, LibTorch version, date, command)
# Bazel: the system's `bazel`, or the self-contained one in .portable/ (tools/portable_bazel.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu_results}
mkdir -p "$out"
kind=cuda
[[ ${ALLOW_CPU:-0} == 1 ]] && kind=best
status=0
say() { printf '[gpu_check %s] %s\n' "$(date +%T)" "$*" | tee -a "$out/env.txt"; }

# ---- environment ------------------------------------------------------------------------------------------
: > "$out/env.txt"
say "host: $(uname -a)"
cxx=$(command -v g++ || command -v c++ || command -v clang++ || true)
[[ -n $cxx ]] || { say "no C++ compiler (g++/c++/clang++) on PATH"; exit 1; }
say "compiler: $cxx ($("$cxx" --version | head -1))"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  | while read -r line; do say "gpu: $line"; done
python3 - <<'PY' 2>&1 | while read -r line; do say "python: $line"; done
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
    print("libtorch at", torch.utils.cmake_prefix_path)
except Exception as e:  # no PyTorch: the workspace falls back to $LIBTORCH or Debian's libtorch
    print("no torch module:", e)
PY
if command -v bazel >/dev/null; then
  bazel=(bazel)
elif [[ -x .portable/bazel ]]; then
  bazel=(.portable/bazel)
  export RULES_JAVA=$PWD/.portable/rules_java DOCTEST_INCLUDE=$PWD/.portable/doctest
else
  say "no bazel and no .portable/bazel (make it with tools/portable_bazel.sh where there is a network)"; exit 1
fi
bazel+=(--output_base="${BAZEL_OUTPUT_BASE:-/tmp/gpu_check_bazel}")
say "bazel: $("${bazel[@]}" --version 2>/dev/null | tail -1)"
# Lesson 6's CUDA kernels: nvcc for this machine's GPU (NVCC_FLAGS reaches tools/cuda.bzl through @libtorch).
nvcc=$(command -v nvcc || { [[ -x /usr/local/cuda/bin/nvcc ]] && echo /usr/local/cuda/bin/nvcc; } || true)
if [[ -n $nvcc ]]; then
  say "nvcc: $nvcc ($("$nvcc" --version | tail -2 | head -1))"
  [[ $kind == cuda ]] && export NVCC_FLAGS=${NVCC_FLAGS:--arch=native}
else
  say "no nvcc: lesson 6's CUDA kernels are not built and its GPU cases fail"
fi
jobs=$(( $(nproc) > 2 ? $(nproc) : 2 ))
flags=(--jobs="$jobs" --local_ram_resources=HOST_RAM*.8)

# ---- checks ----------------------------------------------------------------------------------------------
say "building and testing (jobs=$jobs) ..."
"${bazel[@]}" test "${flags[@]}" --test_output=all --test_tag_filters=-exercise --local_test_jobs=1 \
  //solutions/... //tests:memory_meter_test //bench:bench_smoke_test > "$out/tests.log" 2>&1 || status=1
{
  grep -E '^(//|Executed)' "$out/tests.log" | sed 's/\x1b\[[0-9;]*m//g'
  # tests/main.cc prints "[workshop] N GPU case(s) SKIPPED here: <reason>" once per test binary that skips some.
  echo "GPU cases skipped: $(grep -F 'GPU case(s) SKIPPED here' "$out/tests.log" | awk '{n += $2} END {print n + 0}')"
  grep -E '^\[doctest\] test cases' "$out/tests.log"
} > "$out/tests_summary.txt"
say "$(tail -n +1 "$out/tests_summary.txt" | grep -E 'Executed|GPU cases')"
if [[ $kind == cuda ]] && grep -qF 'GPU case(s) SKIPPED here' "$out/tests.log"; then
  say "FAIL: GPU cases were skipped on the GPU machine:"; grep -F -A8 'GPU case(s) SKIPPED here' "$out/tests.log" | head -40
  status=1
fi

# ---- demos and benchmarks --------------------------------------------------------------------------------
csv=$(mktemp -d)
: > "$out/demos.log"
for dir in lesson*_*/; do  # every lesson's demo, lesson 6's CUDA kernels included
  demo=//${dir%/}:demo
  say "running $demo --device=$kind"
  extra=()
  [[ $kind == best ]] && extra=(--quick)
  "${bazel[@]}" run "${flags[@]}" "$demo" -- --device="$kind" --csv_dir="$csv" "${extra[@]}" >> "$out/demos.log" 2>&1 \
    || { say "FAIL: $demo"; status=1; }
done
tar czf "$out/csv.tar.gz" -C "$csv" . && rm -rf "$csv"
say "running the benchmarks"
extra=()
[[ $kind == best ]] && extra=(--quick)
# The PyTorch peer rows: the python3 whose PyTorch the build's LibTorch came from (not /usr/bin/python3, the
# bench's default, which on such a machine may have no torch).
command -v python3 >/dev/null && extra+=(--peer_python="$(command -v python3)")
"${bazel[@]}" run "${flags[@]}" //bench -- --device="$kind" --out_dir="$out" "${extra[@]}" >> "$out/demos.log" 2>&1 \
  || { say "FAIL: //bench"; status=1; }
# ---- optional: lesson 6's GPU mutants (bugs in the CUDA kernels; each one rebuilds lesson 6, about 30 s) -------
if [[ ${GPU_MUTANTS:-0} == 1 && $kind == cuda ]]; then
  say "lesson 6's GPU mutants (tools/mutants/run.sh --gpu 'l6_gpu_*')"
  wrapper=$(mktemp)
  printf '#!/bin/sh\nexec %s "$@"\n' "${bazel[*]}" > "$wrapper" && chmod +x "$wrapper"
  BAZEL=$wrapper MUTANTS_OUT=$out/mutants.txt bash tools/mutants/run.sh --gpu 'l6_gpu_*' >> "$out/demos.log" 2>&1 \
    || { say "FAIL: a GPU mutant survived or the runner failed (see demos.log)"; status=1; }
  rm -f "$wrapper"
fi
say "done, status $status; results in $out"
exit $status
