#!/usr/bin/env bash
# Records one run of a lesson's demo as a results page, the file a lesson page names for its measured figures
# (tools/figure_check.py checks every figure against it):
#
#   bash tools/record_demo.sh 6 --quick --device=cpu   # -> docs/results/bench/lesson6_demo_cpu.md
#
# The page holds the date, the machine, LibTorch's version, the load before and after, the commit and the exact
# command, then the demo's standard output, unedited. Run it from the repository root on a quiet machine if you can;
# the load is written down either way. RECORD_DEMO_OUT=FILE writes another page than the default (e.g. lesson 7's
# demo with --world_size=4, whose ranks are processes, beside its default run).
set -euo pipefail

if [[ $# -lt 1 || ! "$1" =~ ^[0-9]+$ ]]; then
  echo "usage: bash tools/record_demo.sh N [demo flags...]   (N: a lesson number)" >&2
  exit 2
fi
number=$1
shift
dir=$(python3 tools/manifest.py dirs | grep -E "^lesson${number}_" || true)
if [[ -z "$dir" ]]; then
  echo "record_demo: lesson $number is not in tools/lessons.bzl" >&2
  exit 2
fi
device=cpu
for arg in "$@"; do
  [[ "$arg" == --device=* ]] && device=${arg#--device=}
done
out=${RECORD_DEMO_OUT:-docs/results/bench/lesson${number}_demo_${device%%:*}.md}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

bazel build --config=ci "//$dir:demo"
load_before=$(cut -d' ' -f1 /proc/loadavg)
date_utc=$(date -u '+%Y-%m-%d %H:%M UTC')
bazel run --config=ci "//$dir:demo" -- "$@" >"$log"
load_after=$(cut -d' ' -f1 /proc/loadavg)

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
libtorch=$(dpkg-query -W -f '${Version}' libtorch-dev 2>/dev/null || echo unknown)
commit=$(git rev-parse --short HEAD)
dirty=$(git status --porcelain --untracked-files=no | grep -q . && echo " (with uncommitted changes)" || true)
{
  echo "Date: $date_utc  "
  # How the run was scheduled where that is not the default (e.g. `nice -n -20 taskset -c 1 bash tools/record_demo.sh`).
  sched=""
  # GNU nproc counts OMP_NUM_THREADS too: ask it without.
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
  ((cpus < $(nproc --all))) && sched+="; pinned to $cpus of them"
  (($(nice) != 0)) && sched+="; nice $(nice)"
  echo "Device: $cpu ($(nproc --all) hardware threads$sched)  "
  echo "LibTorch: $libtorch (Debian's libtorch-dev)  "
  echo "Load (1 min): $load_before at the start, $load_after at the end  "
  [[ -n "${OMP_NUM_THREADS:-}" ]] && echo "Environment: OMP_NUM_THREADS=$OMP_NUM_THREADS  "
  echo "Code: $commit$dirty  "
  echo "Command: \`bazel run --config=ci //$dir:demo -- $*\` (its standard output below, unedited)"
  echo
  sed 's/^/    /' "$log"
} >"$out"
echo "record_demo: wrote $out"
