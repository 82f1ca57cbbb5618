# The plots of `ced replay-budget` and `ced merge` (docs/spec.md §10), drawn from
# PREFIX.csv (the aggregate table). gnuplot rather than hand-built SVG or a
# Python library: one Debian package (gnuplot-nox), no interpreter or virtual
# environment in the path of a C++ command, and SVG output that is the same
# bytes for the same table (the shard/merge identity covers the plots).
#
# Set by the caller (gnuplot -e): prefix (the output prefix), config, Ns (the
# prompt lengths, space-separated), Nmax, Bs (the replay spans of Nmax),
# R (= 1 + D(W-1)), Rdec (= D(W-1)).
set datafile separator ','
set datafile columnheaders
set terminal svg size 900,560 dynamic font 'sans,12' background '#ffffff'
csv = prefix . '.csv'
# Zero (bitwise exact) cannot sit on a log axis: it is drawn at 1e-17, labelled 0.
floor = 1e-17
z(v) = v > 0 ? v : floor
is(kind, n) = strcol('kind') eq kind && column('n_prompt') == n
set logscale y
set format y '1e%T'
set ytics add ('0 (exact)' floor)
set yrange [floor/3:*]
set grid
set key outside right top

# 1. error against B, log scale, the exact-recovery point R marked
set output prefix . '-vs-replay.svg'
set title sprintf('%s: last-position logits rel L2 against exact recovery (median, bootstrap 95%% interval, worst)', config) noenhanced
set xlabel 'replay span B (log scale)'
set ylabel 'logits rel L2'
set logscale x
set arrow 1 from R, graph 0 to R, graph 1 nohead dashtype 2 linecolor rgb '#555555'
set label 1 sprintf('R = %d', R) at R, graph 0.96 offset 0.5, 0
plot for [i=1:words(Ns)] csv \
       using (is('prefill', word(Ns, i) + 0) ? column('replay') : NaN):(z(column('rel_l2_median'))):(z(column('rel_l2_ci_lo'))):(z(column('rel_l2_ci_hi'))) \
       with yerrorlines linecolor i pointtype 7 title sprintf('N = %s median', word(Ns, i)), \
     for [i=1:words(Ns)] csv \
       using (is('prefill', word(Ns, i) + 0) ? column('replay') : NaN):(z(column('rel_l2_worst'))) \
       with linespoints linecolor i dashtype 3 pointtype 6 title sprintf('N = %s worst', word(Ns, i))
unset arrow 1
unset label 1

# 2. error against cost (the oracle's FLOP ratio), the Pareto frontier
set output prefix . '-vs-cost.svg'
set title sprintf('%s: median logits rel L2 against cost, Pareto frontier', config) noenhanced
set xlabel 'FLOP ratio ced / full (docs/spec.md §7)'
unset logscale x
plot for [i=1:words(Ns)] csv \
       using (is('prefill', word(Ns, i) + 0) ? column('flop_ratio') : NaN):(z(column('rel_l2_median'))) \
       with points linecolor i pointtype 7 title sprintf('N = %s', word(Ns, i)), \
     for [i=1:words(Ns)] csv \
       using (is('prefill', word(Ns, i) + 0) && column('pareto') == 1 ? column('flop_ratio') : NaN):(z(column('rel_l2_median'))) \
       with steps linecolor i linewidth 2 title sprintf('N = %s Pareto frontier', word(Ns, i))

# 3. per-decoder-layer hidden-state drift at the largest N, one line per B
set output prefix . '-layers.svg'
set title sprintf('%s: hidden state rel L2 at the last position per decoder layer, N = %d (median)', config, Nmax) noenhanced
set xlabel 'decoder layer'
set ylabel 'hidden state rel L2'
set xtics 1
plot for [i=1:words(Bs)] csv \
       using (is('layer', Nmax) && column('replay') == word(Bs, i) + 0 ? column('layer') : NaN):(z(column('rel_l2_median'))) \
       with linespoints linecolor i pointtype 7 title sprintf('B = %s', word(Bs, i))
