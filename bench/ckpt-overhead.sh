#!/usr/bin/env bash
# bench/ckpt-overhead.sh - training throughput lost to checkpoints.
#
# Runs the demo trainer (examples/trainer, 1 trainer, --standalone ringd)
# for STEPS steps without checkpoints and with --ckpt-interval K, REPS
# times each, alternating, and prints the median wall time of each and the
# overhead. Last line: ckpt_overhead_pct=<x> (K=<k>).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
STEPS=${STEPS:-2000}
K=${K:-50}
REPS=${REPS:-5}
T=$(mktemp -d /tmp/ringd-ckbench.XXXXXX)
DP=
cleanup() { [ -n "$DP" ] && kill -9 "$DP" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT

run() { # $1: extra daemon flags; prints milliseconds
    rm -rf "$T/ck" "$T/s.sock"
    # shellcheck disable=SC2086
    "$B/ringd" --standalone --socket "$T/s.sock" --metrics off $1 \
        >"$T/d.log" 2>&1 &
    DP=$!
    for _ in $(seq 200); do [ -S "$T/s.sock" ] && break; sleep 0.02; done
    local t0 t1
    t0=$(date +%s%3N)
    "$B/examples/trainer" --socket "$T/s.sock" --steps "$STEPS" \
        --log-every "$STEPS" >"$T/t.log" 2>&1 || { echo "trainer failed" >&2; exit 1; }
    t1=$(date +%s%3N)
    kill "$DP"; wait "$DP" 2>/dev/null; DP=
    echo $((t1 - t0))
}

# Alternating runs, and the median of each: the machine is shared and a
# single best or mean is at the mercy of one noisy run.
offs=() ons=()
for _ in $(seq "$REPS"); do
    offs+=("$(run "")")
    ons+=("$(run "--ckpt-dir $T/ck --ckpt-interval $K")")
done
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END {
    print (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
med_off=$(median "${offs[@]}") med_on=$(median "${ons[@]}")
echo "mode	steps	median_ms	runs_ms"
echo "no_ckpt	$STEPS	$med_off	${offs[*]}"
echo "ckpt_every_$K	$STEPS	$med_on	${ons[*]}"
awk -v a="$med_off" -v b="$med_on" -v k="$K" \
    'BEGIN { printf "ckpt_overhead_pct=%.1f (K=%d)\n", (b - a) * 100 / a, k }'
