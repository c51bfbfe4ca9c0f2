# shellcheck shell=bash
# chaos/plot.sh - sourced by chaos/chaos.sh at this point of its run (it
# shares chaos.sh's variables and functions); kept apart so each file
# stays readable.
# ---- loss plot ---------------------------------------------------------------------------
# Loss against step (the hash logs' last field: each trainer's share's
# mean loss, averaged over every line of a bin of steps), with the faults
# marked where they were injected; PNG in T, copied to OUTDIR.
OUTDIR=${CHAOS_OUT:-$B/chaos}
PLOT=
PLOT_NOTE=
plot_loss() {
    if ! command -v gnuplot >/dev/null; then
        PLOT_NOTE="no loss plot: gnuplot is not installed (make deps installs gnuplot-nox)"
        return
    fi
    local bin=$(( STEPS / 500 > 1 ? STEPS / 500 : 1 )) m i=0
    cat "$T"/hash-*.log 2>/dev/null | awk -v b="$bin" '$1 == "step" && $13 == "loss" {
            k = int($2 / b); s[k] += $14; n[k]++ }
        END { for (k in s) print k * b + b / 2, s[k] / n[k] }' | sort -n >"$T/loss.dat"
    if [ ! -s "$T/loss.dat" ]; then
        PLOT_NOTE="no loss plot: no loss in the hash logs"; return
    fi
    : >"$T/marks.dat"
    for m in "${MARKS[@]}"; do i=$((i + 1)); echo "$m $i" >>"$T/marks.dat"; done
    gnuplot >"$T/gnuplot.log" 2>&1 <<GP
set terminal pngcairo size 1200,600 noenhanced font ",10"
set output "$T/loss.png"
set title "chaos seed $SEED: loss against step ($NODES nodes, $STEPS steps; the faults where they were injected)"
set xlabel "step"
set ylabel "training loss (mean over $bin-step bins, all trainers)"
set logscale y
set xrange [0:$STEPS]
set grid
set key top right
plot "$T/loss.dat" using 1:2 with lines lw 2 lc rgb "#1f77b4" title "loss", \
     "$T/marks.dat" using 1:(0):(0):(1e9) with vectors nohead dt 2 lc rgb "#d62728" title "fault", \
     "$T/marks.dat" using 1:(1):2 with labels rotate by 90 left offset 0.6,0 tc rgb "#d62728" notitle
GP
    if [ -s "$T/loss.png" ] && mkdir -p "$OUTDIR" && cp "$T/loss.png" "$OUTDIR/chaos-$SEED-loss.png"; then
        PLOT="$OUTDIR/chaos-$SEED-loss.png"
    else
        PLOT_NOTE="no loss plot: gnuplot failed ($(tail -1 "$T/gnuplot.log"))"
    fi
}
plot_loss

