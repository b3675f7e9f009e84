#!/usr/bin/env bash
# netns_run.sh leaves nothing behind: after a run that ends by itself, one stopped by SIGINT and one by SIGTERM
# (its trap cleans up), and one SIGKILLed (no trap runs: the next start's sweep removes it), no namespace of the
# run, no veth of it and no process it started is left. Counts and names only; no timing is asserted (the waits
# below are bounded polls for a state, not thresholds). Needs root; otherwise it skips and says why.
set -uo pipefail
set -m  # job control: a background job gets SIGINT like a foreground one (else bash starts it with SIGINT ignored)
runner=$1
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
nothing_of() {  # no namespace named after run $1, no interface of it in this namespace, none of pids $2... alive
  local run=$1 pid
  shift
  [[ -z $(ours "$run") ]] || { echo "  left: $(ours "$run" | tr '\n' ' ')"; return 1; }
  ! ip -o link | grep -q -- "$prefix-$run" || { echo "  left: an interface named $prefix-$run"; return 1; }
  for pid in "$@"; do
    if alive "$pid"; then echo "  left: process $pid"; return 1; fi
  done
  return 0
}
# Starts a held run (--hold 300: two namespaces, a sleep in each) and waits until it is ready. Sets run, procs.
start_held() {
  local log=$log_dir/held_$1.log
  "$runner" --prefix "$prefix" --world_size 2 --hold 300 >"$log" 2>&1 &
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
  check "the held run ($signal) made 3 namespaces with a process in each rank's" \
    bash -c "[[ $(ours "$run" | wc -l) == 3 && ${#procs[@]} == 2 ]]"
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

echo "$pass passed, $fail failed"
exit $(( fail == 0 ? 0 : 1 ))
