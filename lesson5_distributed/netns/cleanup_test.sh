#!/usr/bin/env bash
# netns_run.sh leaves nothing behind: after a run that ends by itself, one stopped by SIGINT and one by SIGTERM
# (its trap cleans up), and one SIGKILLed (no trap runs: the next start's sweep removes it), no namespace of the
# run, no veth of it and no process it started is left. The same for a run of the real demo stopped by SIGINT and
# by SIGTERM in the middle, which must end within 8 s (the demo alone would run for minutes). Before each stop the
# same functions that look for leftovers must find the run's veth ends, shaped links and processes (so that a
# "nothing left" can fail). A sweep leaves alone a live run started under another name (as `bazel run` starts
# it). Needs root; otherwise it skips and says why.
set -uo pipefail
set -m  # job control: a background job gets SIGINT like a foreground one (else bash starts it with SIGINT ignored)
runner=$1
demo=${2:-}
prefix=wsl5t  # the test's own prefix: it never touches another run's namespaces
if [[ $(id -u) != 0 ]]; then
  echo "SKIPPED: needs root (network namespaces); running as uid $(id -u)"
  exit 0
fi
if ! command -v ip >/dev/null; then
  echo "SKIPPED: iproute2's ip is not installed"
  exit 0
fi
log_dir=${TEST_TMPDIR:-$(mktemp -d)}
pass=0
fail=0
check() {  # check NAME CONDITION...
  local name=$1
  shift
  if "$@"; then pass=$((pass + 1)); echo "ok: $name"; else fail=$((fail + 1)); echo "FAILED: $name"; fi
}
alive() { local state; state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null); [[ -n $state && $state != Z ]]; }
ours() { ip netns list | awk '{print $1}' | grep -E "^$prefix-$1-" ; }
# veth ends carrying run $1's alias, here and in every namespace of the run
veths_of() {
  local ns count
  count=$(ip -o link show type veth | grep -c -- "alias $prefix-$1\b")
  for ns in $(ours "$1"); do count=$((count + $(ip -n "$ns" -o link show type veth | grep -c -- "alias $prefix-$1\b"))); done
  echo "$count"
}
# shaped links (tbf or netem qdiscs) in run $1's namespaces
qdiscs_of() {
  local ns count=0
  for ns in $(ours "$1"); do count=$((count + $(ip netns exec "$ns" tc qdisc show | grep -cE "qdisc (tbf|netem)"))); done
  echo "$count"
}
nothing_of() {  # no namespace named after run $1, no interface of it in this namespace, none of pids $2... alive
  local run=$1 pid
  shift
  [[ -z $(ours "$run") ]] || { echo "  left: $(ours "$run" | tr '\n' ' ')"; return 1; }
  ! ip -o link | grep -q -- "$prefix-$run" || { echo "  left: an interface named $prefix-$run"; return 1; }
  [[ $(veths_of "$run") == 0 && $(qdiscs_of "$run") == 0 ]] || { echo "  left: veths or qdiscs of $run"; return 1; }
  for pid in "$@"; do
    if alive "$pid"; then echo "  left: process $pid"; return 1; fi
  done
  return 0
}
# Starts a held run (--hold 300: two namespaces, a sleep in each) and waits until it is ready. Sets run, procs.
# $2: the runner to start (default: netns_run.sh under its own name).
start_held() {
  local log=$log_dir/held_$1.log
  "${2:-$runner}" --prefix "$prefix" --world_size 2 --hold 300 >"$log" 2>&1 &
  run=$!
  for _ in $(seq 600); do grep -q "netns_run: ready" "$log" && break; alive $run || break; sleep 0.1; done
  grep -q "netns_run: ready" "$log" || { cat "$log"; echo "FAILED: the held run never became ready"; exit 1; }
  procs=()
  local ns
  for ns in $(ours "$run"); do procs+=($(ip netns pids "$ns")); done
}
wait_gone() { wait "$1" 2>/dev/null; }  # the runner is our child; its own clean-up is bounded

# 1. A run that ends by itself.
"$runner" --prefix "$prefix" --world_size 4 --hold 0.2 >"$log_dir/normal.log" 2>&1
rc=$?
cat "$log_dir/normal.log"
run=$(grep -o "$prefix-[0-9]*-hub" "$log_dir/normal.log" | head -1 | cut -d- -f2)
check "a normal run says it was ready with 4 ranks and exits 0" \
  bash -c "[[ $rc == 0 && -n '$run' ]] && grep -q 'ready: 4 ranks' '$log_dir/normal.log'"
check "a normal run leaves nothing" nothing_of "$run"

# 2, 3. SIGINT and SIGTERM: the trap cleans up, and the processes in the namespaces are ended.
for signal in INT TERM; do
  start_held "$signal"
  check "the held run ($signal) made 3 namespaces with a process in each rank's, 4 veth ends and 2 shaped links" \
    bash -c "[[ $(ours "$run" | wc -l) == 3 && ${#procs[@]} == 2 && $(veths_of "$run") == 4 && $(qdiscs_of "$run") == 2 ]]"
  kill -"$signal" "$run"
  wait_gone "$run"
  cat "$log_dir/held_$signal.log"
  check "after SIG$signal the run leaves nothing" nothing_of "$run" "${procs[@]}"
done

# 4. SIGKILL: nothing can clean up at once (the check that this state is real), the next start sweeps it.
start_held KILL
kill -KILL "$run"
wait_gone "$run"
check "after SIGKILL the namespaces are still there (no trap ran)" bash -c "[[ $(ours "$run" | wc -l) == 3 ]]"
"$runner" --prefix "$prefix" --sweep >"$log_dir/sweep.log" 2>&1
cat "$log_dir/sweep.log"
check "the sweep names the stale namespaces" grep -q "removing stale namespace $prefix-$run-hub" "$log_dir/sweep.log"
check "after SIGKILL and a sweep nothing is left" nothing_of "$run" "${procs[@]}"

# 5. The sweep never touches a live run's namespaces.
start_held LIVE
live=$run
"$runner" --prefix "$prefix" --sweep >"$log_dir/sweep_live.log" 2>&1
check "a sweep leaves a live run's namespaces alone" bash -c "[[ $(ours "$live" | wc -l) == 3 ]]"
kill -TERM "$live"
wait_gone "$live"
check "and that run, stopped, leaves nothing" nothing_of "$live" "${procs[@]}"

# 6. A live run started under another name (`bazel run //lesson5_distributed/netns:run` runs it as .../run):
# a sweep must know it is alive by its PID and start time, not by its name.
ln -sf "$(realpath "$runner")" "$log_dir/run"
start_held RENAMED "$log_dir/run"
renamed=$run
"$runner" --prefix "$prefix" --sweep >"$log_dir/sweep_renamed.log" 2>&1
cat "$log_dir/sweep_renamed.log"
check "a sweep leaves alone a live run started as .../run" bash -c "[[ $(ours "$renamed" | wc -l) == 3 ]]"
kill -TERM "$renamed"
wait_gone "$renamed"
check "and that run, stopped, leaves nothing" nothing_of "$renamed" "${procs[@]}"

# 7, 8. The real demo, stopped in the middle by SIGINT and by SIGTERM: it ends within seconds and leaves nothing.
if [[ -z $demo ]]; then
  echo "FAILED: no demo given (second argument)"
  fail=$((fail + 1))
else
  for signal in INT TERM; do
    log=$log_dir/demo_$signal.log
    "$runner" --prefix "$prefix" --world_size 2 --gbit 1 --delay_ms 0 --rounds 20 --limit_s 300 --demo "$demo" \
      -- --quick >"$log" 2>&1 &
    run=$!
    ranks=0
    for _ in $(seq 1200); do  # until a process runs in both rank namespaces (the demo started its ranks)
      ranks=0
      for ns in $(ours "$run" | grep -v -- "-hub$"); do [[ -n $(ip netns pids "$ns") ]] && ranks=$((ranks + 1)); done
      [[ $ranks == 2 ]] && break
      alive "$run" || break
      sleep 0.1
    done
    sleep 1  # into the demo's first steps
    procs=()
    for ns in $(ours "$run"); do procs+=($(ip netns pids "$ns")); done
    check "the demo run ($signal) runs processes in both rank namespaces, with 4 veth ends and 2 shaped links" \
      bash -c "[[ $ranks == 2 && ${#procs[@]} -ge 3 && $(veths_of "$run") == 4 && $(qdiscs_of "$run") == 2 ]]"
    start=$(date +%s%N)
    kill -"$signal" "$run"
    wait_gone "$run"
    took_ms=$((($(date +%s%N) - start) / 1000000))
    tail -3 "$log"
    check "after SIG$signal mid-demo the run ended within 8 s (took $took_ms ms)" bash -c "[[ $took_ms -lt 8000 ]]"
    check "after SIG$signal mid-demo the run leaves nothing" nothing_of "$run" "${procs[@]}"
  done
fi

echo "$pass passed, $fail failed"
exit $(( fail == 0 ? 0 : 1 ))
