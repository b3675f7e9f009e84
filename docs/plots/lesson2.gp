# Lesson 2 plots from the demo's CSV file (lesson2_accumulation.csv: K, micro-batch, peak bytes, peak MiB, ...).
# plot: lesson2_peak_bytes.png: Peak bytes of one accumulated step against the number of micro-batches K (one effective batch): memory follows the micro-batch.
load "docs/plots/common.gp"
data = csv_dir."/lesson2_accumulation.csv"

set output out_dir."/lesson2_peak_bytes.png"
set title "Peak memory of one accumulated step vs K (same effective batch)"
set xlabel "K = micro-batches per step (micro-batch = batch / K)"
set ylabel "peak MiB (counted)"
set logscale x 2
set xrange [0.7:23]
set yrange [0:*]
set key top right
plot data skip 1 using 1:4 with linespoints lw 2 pt 7 ps 1.3 lc rgb "#1f77b4" title "peak MiB", \
     data skip 1 using 1:4:(sprintf("%.2f", $4)) with labels offset 0,1 notitle
