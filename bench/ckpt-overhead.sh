#!/usr/bin/env bash
# bench/ckpt-overhead.sh - training throughput lost to checkpoints.
#
# Runs the demo trainer (examples/trainer, 1 trainer, --standalone ringd)
# for STEPS steps without checkpoints and with --ckpt-interval K, REPS
# times each, alternating, and prints the best wall time of each and the
# overhead. Last line: ckpt_overhead_pct=<x> (K=<k>).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
STEPS=${STEPS:-2000}
K=${K:-50}
REPS=${REPS:-3}
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

best_off=999999999 best_on=999999999
for _ in $(seq "$REPS"); do
    a=$(run "") ; [ "$a" -lt "$best_off" ] && best_off=$a
    b=$(run "--ckpt-dir $T/ck --ckpt-interval $K") ; [ "$b" -lt "$best_on" ] && best_on=$b
done
echo "mode	steps	ms"
echo "no_ckpt	$STEPS	$best_off"
echo "ckpt_every_$K	$STEPS	$best_on"
awk -v a="$best_off" -v b="$best_on" -v k="$K" \
    'BEGIN { printf "ckpt_overhead_pct=%.1f (K=%d)\n", (b - a) * 100 / a, k }'
