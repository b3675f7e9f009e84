# Lesson 4 plots from the demo's CSV file (lesson4_memory.csv: recipe, settings, step peak MiB, total peak MiB,
# peak ratio, step ms, time vs plain %). Read once lesson 4 is ready in tools/lessons.bzl; if the columns change,
# change the `using` below.
# plot: lesson4_peak_bytes.png: Peak bytes of one training step per memory technique, each added to the one before.
load "docs/plots/common.gp"
data = csv_dir."/lesson4_memory.csv"

set output out_dir."/lesson4_peak_bytes.png"
set title "Peak memory of one training step per technique"
set ylabel "step peak MiB (counted)"
set yrange [0:*]
set boxwidth 0.6
set key off
plot data skip 1 using 0:3:xtic(1) with boxes lc rgb "#1f77b4", \
     data skip 1 using 0:3:(sprintf("%.2f", $3)) with labels offset 0,1
