# Lesson 7 plots from the demo's CSV file (lesson7_fsdp_step.csv: training, bytes kept per rank (params, grads,
# Adam), bytes sent per rank per step, how counted, step ms (median, rank 0)). If the columns change, change the
# `using` below.
# plot: lesson7_trade.png: FSDP's trade, one training step of the demo's MLP on 2 ranks: the bytes each rank keeps between steps (parameters, gradients, Adam's moments) and the bytes it sends per step, replicated (one all-reduce) against fully sharded. Kept bytes are read from the tensors; sent bytes are counted by the communicator, the all-reduce's as the napkin's 2(N-1)/N of its counted payload. Sharding keeps 1/N of the bytes and sends 3/2 of DDP's (two all-gathers and a reduce-scatter per layer against one all-reduce); prefetching changes neither.
load "docs/plots/common.gp"
data = csv_dir."/lesson7_fsdp_step.csv"

set output out_dir."/lesson7_trade.png"
set title "Bytes per rank, kept between steps and sent per step (2 ranks)"
set ylabel "KiB per rank"
set yrange [0:*]
set autoscale xfix
set offsets 0.3, 0.3, graph 0.12, 0
set boxwidth 0.36
set key top right
set bmargin 4
# A row's name on two lines, its parenthesis on the second. gnuplot 5.4 reads a quoted name only up to its first
# comma ("DDP-style: replicated"); the bytes of that row are read in full.
wrap(s) = strstrt(s, " (") > 0 ? s[1:strstrt(s, " (") - 1]."\n".s[strstrt(s, " (") + 1:] : s
plot data skip 1 using 0:(0):xtic(wrap(strcol(1))) with points pt -1 notitle, \
     data skip 1 using ($0 - 0.19):($2/1024) with boxes lc rgb "#1f77b4" \
         title "kept: parameters, gradients, Adam's moments", \
     data skip 1 using ($0 + 0.19):($3/1024) with boxes lc rgb "#ff7f0e" title "sent per step", \
     data skip 1 using ($0 - 0.19):($2/1024):(sprintf("%.0f", $2/1024)) with labels offset 0,1 notitle, \
     data skip 1 using ($0 + 0.19):($3/1024):(sprintf("%.0f", $3/1024)) with labels offset 0,1 notitle
