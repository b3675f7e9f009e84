# Lesson 3 plots from the demo's CSV file (lesson3_phases.csv: loop, name, calls, total_ms, self_ms, share;
# loop is "slow" or "fixed", share the fraction of the profiled time). Read once lesson 3 is ready in
# tools/lessons.bzl; if the columns change, change the `using` below.
# plot: lesson3_phase_shares.png: Share of the profiled time per phase, before (slow loop) and after the fix.
load "docs/plots/common.gp"
data = csv_dir."/lesson3_phases.csv"

set output out_dir."/lesson3_phase_shares.png"
set title "Phase shares of a training step, before and after the fix"
set ylabel "share of the profiled time"
set yrange [0:*]
set boxwidth 0.8
set xtics rotate by -35 left
set key top right
plot data skip 1 using 0:(strcol(1) eq "slow" ? $6 : 1/0):xtic(strcol(2)." (".strcol(1).")") with boxes \
       lc rgb "#d62728" title "before (slow loop)", \
     data skip 1 using 0:(strcol(1) eq "slow" ? 1/0 : $6) with boxes lc rgb "#2ca02c" title "after the fix"
