#!/usr/bin/env bash
# The one prepared script for a machine with an NVIDIA GPU, rehearsed on a CPU by tools/gpu_rehearsal.sh.
#
#   OUT=/some/folder bash tools/gpu_check.sh                 # on the GPU machine
#   bash tools/gpu_rehearsal.sh                               # the CPU rehearsal: this script, as the GPU machine
#                                                             # runs it (portable Bazel, LibTorch through python3)
#   GPU_MUTANTS=1 OUT=... bash tools/gpu_check.sh             # also lesson 6's CUDA-kernel mutants (+ about 3 min)
#   ALLOW_CPU=1 ...                                           # CPU settings: --device=best, --quick (rehearsal)
#
# It builds the repository against the CUDA LibTorch inside the installed PyTorch (or $LIBTORCH), runs the
# reference solutions' checks with every GPU case (none may be skipped), every lesson's demo through the tour
# (recorded) and the benchmarks, and writes into $OUT (8 files at most, the device tool's limit):
#   env.txt            device, driver, compiler, PyTorch/LibTorch, nvcc and Bazel versions; each phase's time
#   tests.log          the checks' full output;  tests_summary.txt  the verdict and a row per test binary
#                      (doctest counts, GPU cases run/failed/skipped), from tools/gpu_log.py
#   demos.log          the tour's and the bench's output;  tour.csv  the tour's recorded table (docs/results/)
#   bench_<kind>.md / bench_<kind>.csv   the benchmark tables (device, LibTorch version, date, command)
#   extra.tar.gz       every demo's CSV files, and mutants.txt with GPU_MUTANTS=1
# It stops at once, with status 1 and the reason, when Bazel is missing or does not say its version, the build
# fails, the checks' log has no test summary, a check fails, a GPU case is skipped or fails on the GPU machine,
# the tour or the bench fails. KEEP_GOING=1 goes on to the demos after failed checks (the status stays 1).
# PHASES (default "checks demos"): "checks" builds and runs the checks, "demos" the tour, the bench and the GPU
# mutants; two calls of at most 10 minutes each on the device machine can take one phase each (the second finds
# the first's Bazel output base, $BAZEL_OUTPUT_BASE, on a machine that stayed warm).
# Bazel: the system's `bazel`, else the self-contained one in .portable/ (tools/portable_bazel.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu_results}
mkdir -p "$out"
kind=cuda
judge_kind=cuda
quick=()
if [[ ${ALLOW_CPU:-0} == 1 ]]; then
  kind=best judge_kind=cpu quick=(--quick)
fi
phases=" ${PHASES:-checks demos} "
for p in $phases; do
  [[ $p == checks || $p == demos ]] || { echo "gpu_check: unknown phase '$p' in PHASES (checks, demos)" >&2; exit 2; }
done
status=0
start=$(date +%s)
phase_start=$start
say() { printf '[gpu_check %s] %s\n' "$(date +%T)" "$*" | tee -a "$out/env.txt"; }
phase() {  # phase NAME: closes the previous phase with its time
  local now; now=$(date +%s)
  say "== $1 (previous phase $((now - phase_start)) s, total $((now - start)) s)"
  phase_start=$now
}
fail() {  # fail REASON...: loud, at once
  say "FAIL: $*"
  say "stopped after $(( $(date +%s) - start )) s; what was written is in $out"
  exit 1
}

# ---- environment ------------------------------------------------------------------------------------------
: > "$out/env.txt"
say "host: $(uname -a)"
say "mode: kind=$kind ${quick[*]:-full settings}"
cxx=$(command -v g++ || command -v c++ || command -v clang++ || true)
[[ -n $cxx ]] || fail "no C++ compiler (g++/c++/clang++) on PATH"
say "compiler: $cxx ($("$cxx" --version | head -1))"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  | while read -r line; do say "gpu: $line"; done
python=$(command -v python3 || true)
[[ -n $python ]] || fail "no python3 (the repository rule asks it for PyTorch's LibTorch; tools/gpu_log.py needs it)"
"$python" - <<'PY' 2>&1 | while read -r line; do say "python: $line"; done
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
    print("libtorch at", torch.utils.cmake_prefix_path)
except Exception as e:  # no PyTorch: the workspace falls back to $LIBTORCH or Debian's libtorch
    print("no torch module:", e)
PY
if command -v bazel >/dev/null; then
  bazel_bin=$(command -v bazel)
elif [[ -x .portable/bazel ]]; then
  bazel_bin=$PWD/.portable/bazel
  export RULES_JAVA=$PWD/.portable/rules_java DOCTEST_INCLUDE=$PWD/.portable/doctest
else
  fail "no bazel and no .portable/bazel (make it with tools/portable_bazel.sh where there is a network)"
fi
# `--version` is a client option: it goes before any startup option (Bazel 2.1.0 rejects it after --output_base).
bazel_version=$("$bazel_bin" --version 2>/dev/null | tail -1)
[[ -n $bazel_version ]] || fail "$bazel_bin --version printed nothing: this Bazel does not start here"
say "bazel: $bazel_bin ($bazel_version)"
bazel=("$bazel_bin" --output_base="${BAZEL_OUTPUT_BASE:-/tmp/gpu_check_bazel}")
# Lesson 6's CUDA kernels: nvcc for this machine's GPU (NVCC_FLAGS reaches tools/cuda.bzl through @libtorch).
nvcc=$(command -v nvcc || { [[ -x /usr/local/cuda/bin/nvcc ]] && echo /usr/local/cuda/bin/nvcc; } || true)
if [[ -n $nvcc ]]; then
  say "nvcc: $nvcc ($("$nvcc" --version | tail -2 | head -1))"
  [[ $kind == cuda ]] && export NVCC_FLAGS=${NVCC_FLAGS:--arch=native}
elif [[ $kind == cuda ]]; then
  fail "no nvcc: lesson 6's CUDA kernels would not be built and its GPU cases would fail"
fi
jobs=$(( $(nproc) > 2 ? $(nproc) : 2 ))
flags=(--jobs="$jobs" --local_ram_resources=HOST_RAM*.8 --keep_going)
tests=(//solutions/... //tests:memory_meter_test //bench:bench_smoke_test)

# ---- build, then checks ----------------------------------------------------------------------------------
if [[ $phases == *" checks "* ]]; then
  phase "build (jobs=$jobs): the checks, the tour, the bench"
  if ! "${bazel[@]}" build "${flags[@]}" --build_tag_filters=-exercise "${tests[@]}" //:tour //bench \
      > "$out/tests.log" 2>&1; then
    { grep -E '^(ERROR|FAILED)|error:' "$out/tests.log" || tail -15 "$out/tests.log"; } | head -30
    fail "the build failed (the first errors are above; all of it is in tests.log)"
  fi
  phase "checks"
  "${bazel[@]}" test "${flags[@]}" --test_output=all --test_tag_filters=-exercise --local_test_jobs=1 "${tests[@]}" \
    >> "$out/tests.log" 2>&1
  test_status=$?
  "$python" tools/gpu_log.py "$out/tests.log" --kind="$judge_kind" --summary "$out/tests_summary.txt" > /dev/null
  verdict=$?
  sed -n '/^Bazel: /,$p' "$out/tests_summary.txt" | while read -r line; do say "$line"; done
  if (( verdict != 0 || test_status != 0 )); then
    status=1
    [[ ${KEEP_GOING:-0} == 1 ]] || fail "the checks did not pass (bazel test exit $test_status; verdict in tests_summary.txt)"
    say "KEEP_GOING=1: going on to the demos although the checks did not pass"
  fi
fi

if [[ $phases != *" demos "* ]]; then
  phase "done (PHASES=${phases# }), status $status; results in $out"
  exit $status
fi

# ---- demos (the tour, recorded) and benchmarks ------------------------------------------------------------
phase "the tour: every lesson's demo on --device=$kind ${quick[*]:-}"
extra=$(mktemp -d)
: > "$out/demos.log"
"${bazel[@]}" run "${flags[@]}" //:tour -- --device="$kind" --csv_dir="$extra/csv" --record="$out/tour.csv" \
  "${quick[@]}" >> "$out/demos.log" 2>&1 || fail "the tour failed (demos.log)"
phase "the benchmarks"
# The PyTorch peer rows: the python3 whose PyTorch the build's LibTorch came from (not /usr/bin/python3, the
# bench's default, which on such a machine may have no torch). PEER_PYTHON overrides it.
peer=(--peer_python="${PEER_PYTHON:-$python}")
"${bazel[@]}" run "${flags[@]}" //bench -- --device="$kind" --out_dir="$out" "${quick[@]}" "${peer[@]}" \
  >> "$out/demos.log" 2>&1 || fail "the bench failed (demos.log)"
# ---- optional: lesson 6's GPU mutants (bugs in the CUDA kernels; each one rebuilds lesson 6, about 30 s) -------
if [[ ${GPU_MUTANTS:-0} == 1 && $kind == cuda ]]; then
  phase "lesson 6's GPU mutants (tools/mutants/run.sh --gpu 'l6_gpu_*')"
  wrapper=$(mktemp)
  printf '#!/bin/sh\nexec %s "$@"\n' "${bazel[*]}" > "$wrapper" && chmod +x "$wrapper"
  BAZEL=$wrapper MUTANTS_OUT=$extra/mutants.txt bash tools/mutants/run.sh --gpu 'l6_gpu_*' >> "$out/demos.log" 2>&1 \
    || { say "FAIL: a GPU mutant survived or the runner failed (see demos.log)"; status=1; }
  rm -f "$wrapper"
fi
tar czf "$out/extra.tar.gz" -C "$extra" . && rm -rf "$extra"
phase "done, status $status; results in $out"
files=$(find "$out" -type f | wc -l)
(( files <= 8 )) || say "WARNING: $files files in $out; the device tool brings back 8"
exit $status
