# Shared look of the docs' plots. Each lessonN.gp loads this; gen_pages.py runs them with
#   gnuplot -e "csv_dir='DIR'; out_dir='DIR'" docs/plots/lessonN.gp
# and shows each `# plot: NAME.png: caption` a script declares on the lesson page and the results page.
set terminal pngcairo size 900,520 enhanced font "sans,11"
set datafile separator ","
set grid lc rgb "#dddddd"
set border lc rgb "#555555"
set key top right box opaque
set style fill solid 0.75 border -1
