# Lesson 5 plots from the demo's CSV file (lesson5_distributed.csv: variant, ranks, collectives / step,
# payload MiB / step, napkin MiB sent / rank, step ms (median), optimizer state bytes / rank, max rel diff).
# plot: lesson5_collectives.png: Collective calls per training step for each way of averaging the gradients (counted by the communicator): buckets cut the calls, ZeRO-1 adds one broadcast per parameter.
# plot: lesson5_state_bytes.png: Optimizer-state bytes per rank (lesson 4's meter, in each rank's process): ZeRO-1 keeps 1/N of Adam's state.
load "docs/plots/common.gp"
data = csv_dir."/lesson5_distributed.csv"

set output out_dir."/lesson5_collectives.png"
set title "Collective calls per step (counted)"
set ylabel "calls per step"
set yrange [0:*]
set offsets 0, 0, graph 0.12, 0
set boxwidth 0.6
set key off
plot data skip 1 using 0:3:xtic(1) with boxes lc rgb "#1f77b4", \
     data skip 1 using 0:3:(sprintf("%d", $3)) with labels offset 0,1

set output out_dir."/lesson5_state_bytes.png"
set title "Optimizer state per rank (counted)"
set ylabel "KiB per rank"
plot data skip 1 using 0:($7/1024):xtic(1) with boxes lc rgb "#ff7f0e", \
     data skip 1 using 0:($7/1024):(sprintf("%.0f", $7/1024)) with labels offset 0,1
