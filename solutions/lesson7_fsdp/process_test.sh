#!/usr/bin/env bash
# The demo's ranks as processes (--world_size, lesson 5's launcher): 2 ranks on loopback in --quick settings run
# the four rows; the sharded rows send the same counted bytes; ZeRO-1 keeps fewer bytes than the DDP-style row and
# the sharded rows fewer than ZeRO-1; every row's peak bytes are at least its bytes kept; the CPU floor, the napkin
# and the verdict are printed; and no rank process is left behind.
set -uo pipefail
# Every process of this run carries a token of its own in its environment (the ranks inherit it from the demo), so
# the check for ranks left behind sees this run's processes only, not another test's or another user's demo.
token=rank_check_$$_$RANDOM
left_behind() { grep -lsz "^WORKSHOP_RANK_TOKEN=$token\$" /proc/[0-9]*/environ; }
demo=$1
out=${TEST_TMPDIR:-$(mktemp -d)}/l7proc
mkdir -p "$out"
WORKSHOP_RANK_TOKEN=$token timeout 120 "$demo" --quick --world_size=2 --csv_dir="$out" >"$out/log.txt" 2>&1 ||
  { cat "$out/log.txt"; echo "the demo failed"; exit 1; }
cat "$out/log.txt"
csv=$out/lesson7_network.csv
# A cell of the CSV (quoted where a cell holds a comma): row named $1, column $2 (1-based).
cell() {
  python3 -c 'import csv, sys
print(*[r[int(sys.argv[3]) - 1] for r in csv.reader(open(sys.argv[1])) if r[0] == sys.argv[2]])' "$csv" "$1" "$2"
}
# The column named $1: its number (1-based), or nothing.
column() {
  python3 -c 'import csv, sys
header = next(csv.reader(open(sys.argv[1])))
print(header.index(sys.argv[2]) + 1 if sys.argv[2] in header else "")' "$csv" "$1"
}
ddp="DDP-style: replicated, one all-reduce"
zero="ZeRO-1: replicated, Adam's state sharded"
plain="fully sharded, no prefetch"
prefetch="fully sharded + prefetch"
fail=0
[[ $(($(wc -l <"$csv") - 1)) -eq 4 ]] || { echo "expected 4 rows in $csv"; fail=1; }
kept=$(column "bytes kept / rank") peak=$(column "peak bytes / rank") sent=$(column "MiB sent / rank / step")
floor=$(column "CPU floor ms")
[[ -n $kept && -n $peak && -n $sent && -n $floor ]] || { echo "a column is missing from $csv"; exit 1; }
[[ $(cell "$plain" "$sent") == $(cell "$prefetch" "$sent") ]] || { echo "prefetch changed the bytes sent"; fail=1; }
[[ $(cell "$zero" "$kept") -lt $(cell "$ddp" "$kept") ]] ||
  { echo "the ZeRO-1 rank keeps no fewer bytes than the DDP-style one"; fail=1; }
[[ $(cell "$prefetch" "$kept") -lt $(cell "$zero" "$kept") ]] ||
  { echo "the sharded rank keeps no fewer bytes than the ZeRO-1 one"; fail=1; }
for row in "$ddp" "$zero" "$plain" "$prefetch"; do
  [[ $(cell "$row" "$peak") -ge $(cell "$row" "$kept") ]] || { echo "$row: peak bytes below bytes kept"; fail=1; }
  python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' "$(cell "$row" "$floor")" ||
    { echo "$row: no CPU floor"; fail=1; }
done
grep -q "^Napkin math: link " "$out/log.txt" || { echo "no napkin line"; fail=1; }
grep -Eq "^Verdict: with prefetch the step is [0-9.]+x max\(compute .* within 1.5x: (met|NOT MET)(; the goal cannot be met on this machine: its CPU floor, [0-9.]+ ms .*)?$" \
  "$out/log.txt" || { echo "no verdict line"; fail=1; }
grep -q "^Peak bytes / rank, the most of any rank: " "$out/log.txt" || { echo "no line of the busiest ranks' peaks"; fail=1; }
if left_behind >/dev/null; then echo "a rank process is still running: $(left_behind)"; fail=1; fi
echo "$(( fail == 0 ? 1 : 0 )) passed, $fail failed"
exit $fail
