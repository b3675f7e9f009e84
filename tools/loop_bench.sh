#!/usr/bin/env bash
# Measures the learner's edit->check loop: per lesson, change one learner .cc (a new exported function, so the
# object file really changes and everything downstream reruns), then time `bazel test //lessonN:all` as the
# README tells learners to run it. Prints the median (and min/max) of N such loops per lesson and per linker,
# all in one run, with the machine's load beside them. Restores the edited files at the end.
#
#   bash tools/loop_bench.sh                          # every lesson, the toolchain's default linker, 5 loops
#   bash tools/loop_bench.sh --variants=default,bfd,gold,lld,mold --lessons=1,2 --loops=5
#   bash tools/loop_bench.sh --variants=default,shm,async,shm+async,local   # sandbox settings, side by side
#   bash tools/loop_bench.sh --cold                   # also a cold build of //lesson1_amp:all (own output base,
#                                                     # no disk cache): what a learner's first command costs
#
# Variants (flags added to every bazel command of that row): default; the linkers bfd, gold, lld, mold; the
# sandbox settings shm, async, shm+async, local, bazel-defaults (see variant_flags below). A linker that is not installed is
# reported as absent and skipped. Each (linker, lesson) starts with one
# unmeasured loop (it relinks everything for the new flags). Run it in a clean checkout: it edits the
# skeletons (and puts them back). Extra arguments after -- go to every bazel test (e.g. -- --config=asan).
set -euo pipefail
cd "$(dirname "$0")/.."

lessons="1,2,3,4,5"
linkers="default"
loops=5
cold=0
extra=()
while (($#)); do
  case $1 in
    --lessons=*) lessons=${1#*=} ;;
    --linkers=* | --variants=*) linkers=${1#*=} ;;
    --loops=*) loops=${1#*=} ;;
    --cold) cold=1 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "loop_bench: unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
  shift
done

bazel=${BAZEL:-bazel}
# lesson number -> the folder and the learner file the loop edits
declare -A dir=([1]=lesson1_amp [2]=lesson2_accumulation [3]=lesson3_profiling [4]=lesson4_memory [5]=lesson5_distributed)
declare -A file=([1]=grad_scaler.cc [2]=accumulation.cc [3]=profiler.cc [4]=checkpoint.cc [5]=ddp.cc)

backup=$(mktemp -d)
restore() {
  for n in "${!dir[@]}"; do
    [[ -f $backup/$n ]] && cp "$backup/$n" "${dir[$n]}/${file[$n]}"
  done
  rm -rf "$backup"
}
trap restore EXIT
for n in ${lessons//,/ }; do cp "${dir[$n]}/${file[$n]}" "$backup/$n"; done

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

one_loop() {  # lesson, flags...: edit, then time the check; prints seconds (runs in a subshell: no state)
  local n=$1; shift
  local id
  id=$(date +%s%N)  # unique per loop, so every loop's object file differs from the last one
  cp "$backup/$n" "${dir[$n]}/${file[$n]}"
  printf '\nextern "C" long workshop_loop_bench_%s() { return %sL; }\n' "$id" "$id" >>"${dir[$n]}/${file[$n]}"
  local start end
  start=$(date +%s.%N)
  "$bazel" test "//${dir[$n]}:all" --color=no --curses=no --noshow_progress "$@" "${extra[@]}" \
    >/dev/null 2>&1 || true  # the skeleton's checks fail on purpose; a build error shows as a short time
  end=$(date +%s.%N)
  echo "$end - $start" | bc
}

stats() {  # seconds... -> "median min max"
  printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2;
    printf "%.1f %.1f %.1f", m, a[1], a[NR]}'
}

echo "loop_bench: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(ld --version | head -1)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)  (1, 5, 15 min; shared machines: other builds count too)"
"$bazel" build --color=no --curses=no --noshow_progress $(for n in ${lessons//,/ }; do echo "//${dir[$n]}:all"; done) \
  "${extra[@]}" >/dev/null 2>&1 || true
echo
printf '| %-9s | %-24s | %-14s | %-14s | %-17s |\n' variant lesson "median (s)" "min-max (s)" "load (1 min)"
printf '|%s|%s|%s|%s|%s|\n' ----------- -------------------------- ---------------- ---------------- -------------------
for linker in ${linkers//,/ }; do
  if ! flags=$(variant_flags "$linker"); then
    printf '| %-9s | %-24s | %-14s | %-14s | %-17s |\n' "$linker" "(not installed)" - - -
    continue
  fi
  for n in ${lessons//,/ }; do
    # shellcheck disable=SC2086
    one_loop "$n" $flags >/dev/null  # unmeasured: relinks for these flags
    times=()
    loads=()
    for ((i = 0; i < loops; i++)); do
      # shellcheck disable=SC2086
      times+=("$(one_loop "$n" $flags)")
      loads+=("$(cut -d' ' -f1 /proc/loadavg)")
    done
    read -r median low high <<<"$(stats "${times[@]}")"
    read -r load_median _ <<<"$(stats "${loads[@]}")"
    printf '| %-9s | %-24s | %-14s | %-14s | %-17s |\n' "$linker" "$n ${dir[$n]}" "$median" "$low-$high" \
      "$load_median"
  done
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

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
