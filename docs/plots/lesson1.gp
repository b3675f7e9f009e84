# Lesson 1 plots from the demo's CSV files (lesson1_underflow.csv, lesson1_grad_histogram.csv).
# plot: lesson1_scale.png: The gradient scaler's scale at every step of the tiny-gradient model (log scale). It doubles after 5 clean steps and halves after each overflow; red marks the skipped steps.
# plot: lesson1_loss.png: Loss of the tiny-gradient model in float16: without the scaler every gradient underflows and the loss never moves; with it the model learns.
# plot: lesson1_grad_histogram.png: Gradient magnitudes reaching float16, without scaling and multiplied by 65536, against float16's underflow line: everything left of it becomes exactly zero.
load "docs/plots/common.gp"
underflow = csv_dir."/lesson1_underflow.csv"
histogram = csv_dir."/lesson1_grad_histogram.csv"

set output out_dir."/lesson1_scale.png"
set title "Loss scale over the training steps, with overflow back-offs"
set xlabel "training step"
set ylabel "scale used (log_2)"
set key bottom right
plot underflow skip 1 using 1:(log($4)/log(2)) with steps lw 2 lc rgb "#1f77b4" title "scale used", \
     underflow skip 1 using 1:($5 == 0 ? log($4)/log(2) : 1/0) with points pt 7 ps 1.1 lc rgb "#d62728" \
       title "overflow: step skipped, scale halved next"

set output out_dir."/lesson1_loss.png"
set title "Tiny-gradient model in float16: loss without and with the gradient scaler"
set ylabel "loss (log scale)"
set logscale y
set key top right
plot underflow skip 1 using 1:2 with lines lw 2 lc rgb "#d62728" title "no scaler (gradients underflow to 0)", \
     underflow skip 1 using 1:3 with lines lw 2 lc rgb "#2ca02c" title "with GradScaler"
unset logscale y

set output out_dir."/lesson1_grad_histogram.png"
set title "Gradient magnitudes against float16's underflow line"
set xlabel "log_2 |gradient| (bucket b holds [2^b, 2^{b+1}))"
set ylabel "number of gradients"
set boxwidth 0.4
set xrange [-34:0]
set yrange [0:*]
set arrow 1 from -25, graph 0 to -25, graph 1 nohead lw 2 dt 2 lc rgb "#000000"
set label 1 "float16 underflow:\nbelow 2^{-25} becomes 0" at -24.7, graph 0.9 left
set arrow 2 from -14, graph 0 to -14, graph 1 nohead lw 1 dt 3 lc rgb "#777777"
set label 2 "(dotted: smallest normal\nfloat16, 2^{-14})" at -10.5, graph 0.55 left tc rgb "#555555"
set key top right
plot histogram skip 1 using ($1+0.5-0.2):2 with boxes lc rgb "#d62728" title "unscaled", \
     histogram skip 1 using ($1+0.5+0.2):3 with boxes lc rgb "#2ca02c" title "scaled by 65536"
