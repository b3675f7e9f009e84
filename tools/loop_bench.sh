#!/usr/bin/env bash
# Measures the learner's edit->check loop for every file a learner edits: per lesson, each .cc in the lesson's
# folder that holds a TODO(lessonN marker (the skeleton files). Per file: change it (a new exported function, so
# the object file really changes and everything downstream reruns), then time `bazel test //lessonN:all` as the
# README tells learners to run it. Prints the median (and min/max) of N such loops per file and per variant, all
# in one run, with the machine's load beside them. Restores the edited files at the end.
#
#   bash tools/loop_bench.sh                          # every learner file of every lesson, default settings, 5 loops
#   bash tools/loop_bench.sh --lessons=4 --loops=3    # lesson 4's files only
#   bash tools/loop_bench.sh --files=lesson4_memory/planner.cc,lesson1_amp/grad_scaler.cc
#   bash tools/loop_bench.sh --cpu                    # also the CPU seconds of the compile and links each edit
#                                                     # reruns (tools/action_cost.py): what the loop costs on a
#                                                     # quiet machine, even when this one is busy
#   bash tools/loop_bench.sh --variants=default,bfd,gold,lld,mold --lessons=1,2 --loops=5
#   bash tools/loop_bench.sh --variants=default,shm,async,shm+async,local   # sandbox settings, side by side
#   bash tools/loop_bench.sh --cold                   # also a cold build of //lesson1_amp:all (own output base,
#                                                     # no disk cache): what a learner's first command costs
#
# Variants (flags added to every bazel command of that row): default; the linkers bfd, gold, lld, mold; the
# sandbox settings shm, async, shm+async, local, bazel-defaults (see variant_flags below). A linker that is not
# installed is reported as absent and skipped. Each (variant, file) starts with one unmeasured loop (it relinks
# everything for the new flags). Run it in a clean checkout: it edits the skeletons (and puts them back). Extra
# arguments after -- go to every bazel command (e.g. -- --config=asan). The wall-clock figures include the
# tests' own run time (about 1 s per test binary, mostly loading LibTorch) and whatever else the machine does.
set -euo pipefail
cd "$(dirname "$0")/.."

# Every lesson folder of the manifest (tools/lessons.bzl, read by tools/manifest.py).
declare -A dir=()
for d in $(python3 tools/manifest.py dirs); do
  n=${d#lesson}
  dir[${n%%_*}]=$d
done
lessons=$(printf '%s\n' "${!dir[@]}" | sort -n | paste -sd, -)
files_arg=""
linkers="default"
loops=5
cold=0
cpu=0
extra=()
while (($#)); do
  case $1 in
    --lessons=*) lessons=${1#*=} ;;
    --files=*) files_arg=${1#*=} ;;
    --linkers=* | --variants=*) linkers=${1#*=} ;;
    --loops=*) loops=${1#*=} ;;
    --cold) cold=1 ;;
    --cpu) cpu=1 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "loop_bench: unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
  shift
done

bazel=${BAZEL:-bazel}

# The files to edit: every learner file (a .cc with a TODO(lessonN marker) of the chosen lessons, or --files.
files=()
if [[ -n $files_arg ]]; then
  for f in ${files_arg//,/ }; do
    [[ -f $f ]] || { echo "loop_bench: no file $f" >&2; exit 2; }
    files+=("$f")
  done
else
  for n in ${lessons//,/ }; do
    [[ -n ${dir[$n]:-} ]] || { echo "loop_bench: no lesson $n" >&2; exit 2; }
    while IFS= read -r f; do files+=("$f"); done < <(grep -l "TODO(lesson$n" "${dir[$n]}"/*.cc | sort)
  done
fi
package_of() { echo "${1%/*}"; }  # lesson4_memory/planner.cc -> lesson4_memory

backup=$(mktemp -d)
restore() {
  local i
  for i in "${!files[@]}"; do
    [[ -f $backup/$i ]] && cp "$backup/$i" "${files[$i]}"
  done
  rm -rf "$backup"
}
trap restore EXIT
for i in "${!files[@]}"; do cp "${files[$i]}" "$backup/$i"; done

variant_flags() {  # prints the bazel flags of variant $1, or fails if it cannot run here
  case $1 in
    default) return 0 ;;  # the toolchain Bazel configured (it picks gold when installed)
    bfd) command -v ld.bfd >/dev/null && echo "--linkopt=-fuse-ld=bfd" ;;
    gold) command -v ld.gold >/dev/null && echo "--linkopt=-fuse-ld=gold" ;;
    lld) command -v ld.lld >/dev/null && echo "--linkopt=-fuse-ld=lld" ;;
    mold) command -v mold >/dev/null && echo "--linkopt=-fuse-ld=mold" ;;
    # Sandbox levers: every compile action's sandbox holds a symlink per LibTorch header (thousands).
    shm) [[ -d /dev/shm && -w /dev/shm ]] && echo "--sandbox_base=/dev/shm" ;;
    async) echo "--experimental_sandbox_async_tree_delete_idle_threads=HOST_CPUS" ;;
    shm+async) [[ -d /dev/shm && -w /dev/shm ]] &&
      echo "--sandbox_base=/dev/shm --experimental_sandbox_async_tree_delete_idle_threads=HOST_CPUS" ;;
    local) echo "--strategy=CppCompile=local" ;;  # compiles without a sandbox
    bazel-defaults)  # undoes machine.bazelrc (tools/setup.sh): Bazel's own sandbox settings
      echo "--sandbox_base= --experimental_sandbox_async_tree_delete_idle_threads=0" ;;
    *) return 1 ;;
  esac
}

one_loop() {  # file index, flags...: edit, then time the check; prints seconds (runs in a subshell: no state)
  local i=$1; shift
  local f=${files[$i]}
  local id
  id=$(date +%s%N)  # unique per loop, so every loop's object file differs from the last one
  cp "$backup/$i" "$f"
  printf '\nextern "C" long workshop_loop_bench_%s() { return %sL; }\n' "$id" "$id" >>"$f"
  local start end
  start=$(date +%s.%N)
  "$bazel" test "//$(package_of "$f"):all" --color=no --curses=no --noshow_progress "$@" "${extra[@]}" \
    >/dev/null 2>&1 || true  # the skeleton's checks fail on purpose; a build error shows as a short time
  end=$(date +%s.%N)
  echo "$end - $start" | bc
}

stats() {  # seconds... -> "median min max"
  printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2;
    printf "%.1f %.1f %.1f", m, a[1], a[NR]}'
}

cpu_of() {  # file index, flags... -> "compile_cpu link_cpu compile_wall" of the actions an edit reruns
  local i=$1; shift
  local out
  out=$(python3 tools/action_cost.py "//$(package_of "${files[$i]}"):all" "${files[$i]}" --repeat=3 -- \
    "$@" "${extra[@]}" 2>/dev/null) || { echo "- - -"; return; }
  local compile link wall
  compile=$(sed -nE 's/.*compile_cpu_s=([0-9.]+).*/\1/p' <<<"$out")
  link=$(sed -nE 's/.*link_cpu_s=([0-9.]+).*/\1/p' <<<"$out")
  wall=$(awk '$1 == "CppCompile" {sub("wall_s=", "", $3); w += $3} END {printf "%.1f", w}' <<<"$out")
  echo "$compile $link $wall"
}

row() { printf '| %-9s | %-40s | %-10s | %-10s | %-12s |%s\n' "$@"; }
cpu_cols() { ((cpu)) && printf ' %-15s | %-12s | %-14s |' "$@"; true; }

echo "loop_bench: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(ld --version | head -1)"
echo "settings: $( [[ -f machine.bazelrc ]] && echo "machine.bazelrc: $(grep '^build' machine.bazelrc | cut -d' ' -f2- | tr '\n' ' ')" || echo "no machine.bazelrc (Bazel's sandbox defaults)")$( [[ -f user.bazelrc ]] && echo "; user.bazelrc: $(grep -v '^#' user.bazelrc | tr '\n' ' ')")$( ((${#extra[@]})) && echo "; then: ${extra[*]}")"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)  (1, 5, 15 min; shared machines: other builds count too)"
mapfile -t packages < <(for f in "${files[@]}"; do package_of "$f"; done | sort -u)
"$bazel" build --color=no --curses=no --noshow_progress "${packages[@]/#/\/\/}" "${extra[@]}" >/dev/null 2>&1 || true
echo
row variant "file (bazel test //<its folder>:all)" "median (s)" "min-max (s)" "load (1 min)" "$(cpu_cols "compile cpu (s)" "link cpu (s)" "compile wall (s)")"
row --------- ---------------------------------------- ---------- ---------- ------------ "$(cpu_cols --------------- ------------ --------------)"
for linker in ${linkers//,/ }; do
  if ! flags=$(variant_flags "$linker"); then
    row "$linker" "(not installed)" - - - "$(cpu_cols - - -)"
    continue
  fi
  for i in "${!files[@]}"; do
    # shellcheck disable=SC2086
    one_loop "$i" $flags >/dev/null  # unmeasured: relinks for these flags
    times=()
    loads=()
    for ((k = 0; k < loops; k++)); do
      # shellcheck disable=SC2086
      times+=("$(one_loop "$i" $flags)")
      loads+=("$(cut -d' ' -f1 /proc/loadavg)")
    done
    read -r median low high <<<"$(stats "${times[@]}")"
    read -r load_median _ <<<"$(stats "${loads[@]}")"
    costs=""
    if ((cpu)); then
      # shellcheck disable=SC2086
      read -r compile link wall <<<"$(cpu_of "$i" $flags)"
      costs=$(cpu_cols "$compile" "$link" "$wall")
    fi
    row "$linker" "${files[$i]}" "$median" "$low-$high" "$load_median" "$costs"
  done
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
if ((cpu)); then
  echo "cpu: user+sys seconds of the edited file's compile and of the links it reruns, each the least of 3 runs"
  echo "of the action's own command line outside the sandbox (tools/action_cost.py); on a quiet machine the"
  echo "loop is about their sum, plus Bazel's sandbox set-up, plus the tests' run time."
fi

if ((cold)); then
  # A learner's first `bazel test //lesson1_amp:all`: a fresh output base and no disk cache. The Bazel server's
  # start-up and the repository rules (finding LibTorch) are part of it.
  base=$(mktemp -d)
  start=$(date +%s.%N)
  "$bazel" --output_base="$base" test //lesson1_amp:all --disk_cache= --color=no --curses=no --noshow_progress \
    "${extra[@]}" >/dev/null 2>&1 || true
  end=$(date +%s.%N)
  "$bazel" --output_base="$base" shutdown >/dev/null 2>&1 || true
  chmod -R u+w "$base" 2>/dev/null; rm -rf "$base"
  printf 'cold //lesson1_amp:all (fresh output base, no disk cache): %.0f s; load after: %s\n' \
    "$(echo "$end - $start" | bc)" "$(cut -d' ' -f1-3 /proc/loadavg)"
fi
