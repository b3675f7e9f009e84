#!/usr/bin/env bash
# The demo's --quick settings (the ones the tour and the bench's quick runs use) must compare overlap, not bucket
# counts: "bucketed + overlap" (the Reducer, with DDP's separate first-bucket limit) must make more than one bucket,
# and as many as "bucketed" (make_buckets with one limit). Counted from the demo's CSV: bucketed makes its buckets
# plus the agreement all-gather per step, bucketed + overlap its buckets plus the "no gradient" map.
set -uo pipefail
demo=$1
out=${TEST_TMPDIR:-$(mktemp -d)}/quick
mkdir -p "$out"
timeout 120 "$demo" --quick --csv_dir="$out" >"$out/log.txt" 2>&1 || { cat "$out/log.txt"; echo "the demo failed"; exit 1; }
calls() { awk -F, -v v="$1" '$1 == v { print $3 }' "$out/lesson5_distributed.csv"; }
bucketed=$(calls "bucketed")
overlap=$(calls "bucketed + overlap")
echo "collectives per step: bucketed $bucketed, bucketed + overlap $overlap"
fail=0
[[ -n $overlap && $overlap -ge 3 ]] || { echo "bucketed + overlap has one bucket in --quick: nothing to overlap"; fail=1; }
[[ $bucketed == "$overlap" ]] || { echo "the two rows make different buckets (first-bucket limits differ)"; fail=1; }
echo "$(( fail == 0 ? 1 : 0 )) passed, $fail failed"
exit $fail
