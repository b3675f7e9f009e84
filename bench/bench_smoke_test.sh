#!/usr/bin/env bash
# The benchmark harness runs end to end (tiny sizes, CPU) and writes its CSV and Markdown results; the PyTorch
# peer's rows are there when /usr/bin/python3 has torch, and the bench says "not installed" (and still
# succeeds) when the interpreter has none or does not exist.
set -uo pipefail
bench=$1
tmp=${TEST_TMPDIR:-/tmp}
fail=0
check() {  # check DESCRIPTION COMMAND...: one line per failed expectation
  local what=$1
  shift
  "$@" || { echo "FAIL: $what"; fail=1; }
}

# 1. The full quick run with the default interpreter.
out=$tmp/bench_smoke
"$bench" --device=cpu --quick --out_dir="$out" > "$tmp/full.log" 2>&1
status=$?
cat "$tmp/full.log"
check "the bench exits 0 (got $status)" test "$status" -eq 0
for f in bench_cpu.csv bench_cpu.md; do check "$out/$f is written" test -s "$out/$f"; done
ours=$(grep -c ',ours,' "$out/bench_cpu.csv")
# 2 lesson-1 variants on CPU, 3 lesson-2 K values, 2 lesson-3 loops, 4 lesson-4 recipes, 4 lesson-5 variants
# (2 ranks in --quick), 2 scaler paths
check "at least 21 of our rows (got $ours)" test "$ours" -ge 21
check "a lesson 5 ZeRO-1 row" grep -q "^lesson 5: data parallel (N=2),ZeRO-1" "$out/bench_cpu.csv"
# Lesson 6: the fused step's rate in GB/s of its napkin bytes, held against an in-place pass over the same bytes.
check "a lesson 6 fused row with GB/s and a fraction of its in-place ceiling" grep -qE \
  '^\| lesson 6: AdamW step \([^)]*\) \| fused op \(float32\) \| [0-9.]+ \| [^|]+ \| [0-9.]+ GB/s \| [0-9.]+ \(memory in place[^|]*\| ([0-9.]+%|suspect) \|' \
  "$out/bench_cpu.md"
check "the Markdown names the device" grep -q "Device: " "$out/bench_cpu.md"
check "the Markdown has the side-by-side table" grep -q "| time ours/PyTorch |" "$out/bench_cpu.md"
check "the Markdown has the scaler's napkin math" grep -q "the floor" "$out/bench_cpu.md"
# A ceiling is a best case: no "of ceiling" cell may read above 100% (a row that beats its ceiling says "suspect").
over=$(grep -cE '\| (1[0-9][0-9]|[2-9][0-9][0-9]|[0-9]{4,})\.[0-9]% \|' "$out/bench_cpu.md")
check "no fraction of a ceiling above 100% (got $over)" test "$over" -eq 0
check "the ceilings table counts its measurements" grep -q "^| ceiling | measured | measurements |" "$out/bench_cpu.md"
check "the Markdown records the load average" grep -qE "^Load: [0-9.]+ at the start" "$out/bench_cpu.md"
if /usr/bin/python3 -c 'import torch' > /dev/null 2>&1; then
  echo "-- /usr/bin/python3 has torch: expecting the peer's rows"
  theirs=$(grep -c ',pytorch,' "$out/bench_cpu.csv")
  # lesson 1: 2, lesson 2: 3, lesson 3: 2, lesson 4: 4, scaler: 1 (a time, or the reason it is not available),
  # lesson 5 (N=2): DistributedDataParallel and ZeroRedundancyOptimizer
  check "at least 14 PyTorch rows in the CSV (got $theirs)" test "$theirs" -ge 14
  check "the Markdown names PyTorch's version" grep -q "^Peer: PyTorch [0-9]" "$out/bench_cpu.md"
  # Every lesson-2 line of the side-by-side table has a PyTorch time and a time ratio.
  l2=$(grep -cE '^\| lesson 2: accumulation \| K=[0-9]+ [^|]*\| [0-9.]+ \| [0-9.]+ \| [0-9.]+x ' "$out/bench_cpu.md")
  check "3 lesson-2 lines with PyTorch's time and a ratio (got $l2)" test "$l2" -eq 3
  check "the peer's peaks are measured (lesson 4 plain)" \
    grep -qE '^\| lesson 4: memory \| plain \| [0-9.]+ \| [0-9.]+ \|([^|]*\|){3} [0-9.]+ MiB \| [0-9.]+ MiB \|' "$out/bench_cpu.md"
  # Lesson 5: DDP beside "bucketed + overlap", ZeRO beside ZeRO-1, each with PyTorch's time and call count.
  l5=$(grep -cE '^\| lesson 5: data parallel \(N=2\) \| [^|]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+x .*[0-9]+ calls/step' \
    "$out/bench_cpu.md")
  check "2 lesson-5 lines with PyTorch's time and calls (got $l5)" test "$l5" -eq 2
  check "the DDP line names DistributedDataParallel" \
    grep -qE '^\| lesson 5: data parallel \(N=2\) \| bucketed \+ overlap \|.*DistributedDataParallel\(gloo' "$out/bench_cpu.md"
  check "the lesson 6 torch::optim::AdamW line has torch.optim.AdamW's time" \
    grep -qE '^\| lesson 6: AdamW step \([^)]*\) \| torch::optim::AdamW \| [0-9.]+ \| [0-9.]+ \| [0-9.]+x .*torch\.optim\.AdamW' \
    "$out/bench_cpu.md"
  # Lesson 3: both loops in Python, and torch.profiler's calls per step beside the lesson profiler's.
  l3=$(grep -cE '^\| lesson 3: training loop \| [^|]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+x ' "$out/bench_cpu.md")
  check "2 lesson-3 lines with PyTorch's time and a ratio (got $l3)" test "$l3" -eq 2
  check "lesson 3's op table has aten::to's calls per step on both sides" \
    grep -qE '^\| aten::to \| [0-9.]+ \| [0-9.]+ \| (yes|NO) \|' "$out/bench_cpu.md"
  # Lesson 7: FSDP's time beside ShardedStack's, or, where this PyTorch cannot run FSDP on the CPU (Debian 12's
  # 1.13 cannot), a cell that names what failed.
  l7='^\| lesson 7: Fully sharded data parallel, one training step \| [^|]+ \| [0-9.]+ \| '
  check "the lesson 7 line has FSDP's time or names what failed" grep -qE \
    "$l7([0-9.]+ \\| [0-9.]+x .*FullyShardedDataParallel|- \\|.*FSDP in PyTorch [^|]*(failed|raised))" "$out/bench_cpu.md"
  # 13 for lessons 1-5, lesson 6's torch.optim.AdamW, and its fused AdamW where this PyTorch has one for the CPU;
  # one more where lesson 7's FSDP ran.
  expected=14
  if grep -qE "$l7[0-9.]+ \\| [0-9.]+x " "$out/bench_cpu.md"; then expected=$((expected + 1)); fi
  if /usr/bin/python3 -c 'import sys, torch; v = tuple(int(x) for x in torch.__version__.split(".")[:2]); sys.exit(v < (2, 4))' \
    > /dev/null 2>&1; then expected=15; fi
  verdicts=$(grep -cE '\| (within noise|ours slower|ours faster) \|' "$out/bench_cpu.md")
  check "every compared line has a time verdict (got $verdicts of $expected)" test "$verdicts" -eq "$expected"
else
  echo "-- /usr/bin/python3 has no torch: expecting the 'not installed' message"
  check "the log says the peer did not run" grep -q "PyTorch peer: NOT RUN: .*cannot import torch" "$tmp/full.log"
  check "the Markdown says the peer did not run" grep -q "^Peer: PyTorch peer NOT RUN" "$out/bench_cpu.md"
fi

# 2. An interpreter that exists but cannot import torch: Python without its site packages.
if [[ -x /usr/bin/python3 ]]; then
  printf '#!/bin/sh\nexec /usr/bin/python3 -S "$@"\n' > "$tmp/python_without_torch"
  chmod +x "$tmp/python_without_torch"
  out2=$tmp/bench_smoke_no_torch
  "$bench" --device=cpu --quick --cases=l2 --peer_python="$tmp/python_without_torch" --out_dir="$out2" \
    > "$tmp/no_torch.log" 2>&1
  status=$?
  cat "$tmp/no_torch.log"
  check "without torch the bench still exits 0 (got $status)" test "$status" -eq 0
  check "without torch the log says so" grep -q "PyTorch peer: NOT RUN: .*cannot import torch" "$tmp/no_torch.log"
  check "without torch the log says how to install it" grep -q "tools/setup.sh --bench-peer" "$tmp/no_torch.log"
  check "without torch the Markdown says so" grep -q "^Peer: PyTorch peer NOT RUN" "$out2/bench_cpu.md"
  check "without torch no PyTorch row is written" test "$(grep -c ',pytorch,' "$out2/bench_cpu.csv")" -eq 0
  check "without torch our rows are still there" test "$(grep -c ',ours,' "$out2/bench_cpu.csv")" -eq 3
fi

# 3. An unknown case is refused, naming the known ones.
"$bench" --device=cpu --quick --cases=nosuch --peer=off > "$tmp/bad_case.log" 2>&1
status=$?
check "an unknown case fails (got $status)" test "$status" -ne 0
# The known ones are the registered cases in order (the lessons of the manifest and the scaler after lesson 4).
check "an unknown case is named with the known ones" grep -qE "unknown case 'nosuch' \(known: l1,l2,l3,l4,scaler,l5(,l[0-9]+)*\)" \
  "$tmp/bad_case.log"

# 4. No interpreter at all.
"$bench" --device=cpu --quick --cases=l2 --peer_python=/nonexistent/python3 > "$tmp/no_python.log" 2>&1
status=$?
cat "$tmp/no_python.log"
check "without an interpreter the bench still exits 0 (got $status)" test "$status" -eq 0
check "without an interpreter the log names it" grep -q "no Python interpreter at /nonexistent/python3" "$tmp/no_python.log"

echo "$(( fail == 0 ? 1 : 0 )) passed, $fail failed"
exit $fail
