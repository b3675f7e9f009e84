#!/usr/bin/env bash
# The benchmark harness runs end to end (tiny sizes, CPU) and writes its CSV and Markdown results.
set -euo pipefail
out=${TEST_TMPDIR:-/tmp}/bench_smoke
"$1" --device=cpu --quick --out_dir="$out"
fail=0
for f in bench_cpu.csv bench_cpu.md; do [[ -s $out/$f ]] || { echo "missing $out/$f"; fail=1; }; done
rows=$(($(wc -l < "$out/bench_cpu.csv") - 1))
# 2 lesson-1 variants on CPU, 3 lesson-2 K values, 2 lesson-3 loops, 4 lesson-4 recipes, 4 lesson-5 variants
[[ $rows -ge 15 ]] || { echo "expected >= 15 result rows, got $rows"; fail=1; }
grep -q "lesson 5: data parallel (N=2),ZeRO-1" "$out/bench_cpu.csv" || { echo "no lesson 5 ZeRO-1 row"; fail=1; }
grep -q "Device: " "$out/bench_cpu.md" || { echo "the Markdown table does not name the device"; fail=1; }
echo "$(( fail == 0 ? 1 : 0 )) passed, $fail failed"
exit $fail
