# Lesson 6 plots from the demo's CSV file (lesson6_fusion.csv: variant, passes, napkin MiB, median ms, min ms,
# GB/s, of copy ceiling, allocated MiB, vs torch AdamW). Read once lesson 6 is in tools/lessons.bzl; if the
# columns change, change the `using` below.
# plot: lesson6_step_time.png: One AdamW step over the same parameters: the fused operator against the unfused ATen ops and torch::optim::AdamW, beside the memory-bound operations that set the ceiling (median ms of the demo's rounds).
# plot: lesson6_rate.png: Napkin bytes per second of each variant (bytes each would move if every operand streamed from memory once, over its median time); the in-place row is the ceiling.
load "docs/plots/common.gp"
data = csv_dir."/lesson6_fusion.csv"

set output out_dir."/lesson6_step_time.png"
set title "One AdamW step, fused and unfused (median ms)"
set ylabel "ms per step"
set yrange [0:*]
set boxwidth 0.8
set xtics rotate by -35 left
unset key
plot data skip 1 using 0:4:xtic(strcol(1)) with boxes lc rgb "#1f77b4"

set output out_dir."/lesson6_rate.png"
set title "Napkin bytes per second (GB/s)"
set ylabel "GB/s"
plot data skip 1 using 0:6:xtic(strcol(1)) with boxes lc rgb "#2ca02c"
