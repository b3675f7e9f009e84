#!/usr/bin/env bash
# The demo's ranks as processes (--world_size, lesson 5's launcher): 2 ranks on loopback in --quick settings run
# the three rows, the sharded rows send the same counted bytes and keep fewer bytes than the DDP-style row, the
# napkin and the verdict are printed, and no rank process is left behind.
set -uo pipefail
demo=$1
out=${TEST_TMPDIR:-$(mktemp -d)}/l7proc
mkdir -p "$out"
timeout 120 "$demo" --quick --world_size=2 --csv_dir="$out" >"$out/log.txt" 2>&1 ||
  { cat "$out/log.txt"; echo "the demo failed"; exit 1; }
cat "$out/log.txt"
csv=$out/lesson7_network.csv
# A cell of the CSV (quoted where a cell holds a comma): row named $1, column $2 (1-based).
cell() {
  python3 -c 'import csv, sys
print(*[r[int(sys.argv[3]) - 1] for r in csv.reader(open(sys.argv[1])) if r[0] == sys.argv[2]])' "$csv" "$1" "$2"
}
fail=0
[[ $(($(wc -l <"$csv") - 1)) -eq 3 ]] || { echo "expected 3 rows in $csv"; fail=1; }
[[ $(cell "fully sharded, no prefetch" 4) == $(cell "fully sharded + prefetch" 4) ]] ||
  { echo "prefetch changed the bytes sent"; fail=1; }
[[ $(cell "fully sharded + prefetch" 3) -lt $(cell "DDP-style: replicated, one all-reduce" 3) ]] ||
  { echo "the sharded rank keeps no fewer bytes than the DDP-style one"; fail=1; }
grep -q "^Napkin math: link " "$out/log.txt" || { echo "no napkin line"; fail=1; }
grep -Eq "^Verdict: with prefetch the step is [0-9.]+x max\(compute .* within 1.5x: (met|NOT MET)$" "$out/log.txt" ||
  { echo "no verdict line"; fail=1; }
if pgrep -f -- "--l7_world=2 --l7_port" >/dev/null; then echo "a rank process is still running"; fail=1; fi
echo "$(( fail == 0 ? 1 : 0 )) passed, $fail failed"
exit $fail
