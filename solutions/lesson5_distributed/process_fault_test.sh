#!/usr/bin/env bash
# Real processes, a real fault: the demo starts its ranks as processes on a TCPStore, and one of them exits right
# after joining the Gloo group. The others must fail with a clear error (a closed connection or a timeout), the
# demo must say which rank failed and exit 1, within a bounded time, and leave no rank process behind.
set -uo pipefail
# Every process of this run carries a token of its own in its environment (the ranks inherit it from the demo), so
# the check for ranks left behind sees this run's processes only, not another test's or another user's demo.
token=rank_check_$$_$RANDOM
left_behind() { grep -lsz "^WORKSHOP_RANK_TOKEN=$token\$" /proc/[0-9]*/environ; }
demo=$1
log=${TEST_TMPDIR:-/tmp}/process_fault.log
start=$(date +%s)
WORKSHOP_RANK_TOKEN=$token timeout 120 "$demo" --quick --world_size=4 --fault_exit_rank=1 >"$log" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$log"
fail=0
[[ $rc -eq 1 ]] || { echo "expected the demo to exit 1, got $rc"; fail=1; }
grep -q "lesson 5 demo: rank [023] failed" "$log" || { echo "the demo does not name the failed rank"; fail=1; }
grep -Eq "rank [023]: .*(closed its connection|timed out after)" "$log" || { echo "no clear error from a surviving rank"; fail=1; }
[[ $elapsed -lt 60 ]] || { echo "took ${elapsed}s: not bounded"; fail=1; }
if left_behind >/dev/null; then echo "a rank process is still running: $(left_behind)"; fail=1; fi
echo "faulted run took ${elapsed}s"
echo "$(( fail == 0 ? 1 : 0 )) passed, $fail failed"
exit $fail
