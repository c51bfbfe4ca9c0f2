#!/usr/bin/env bash
# chaos/scale.sh - many daemons on one machine: the first view, K nodes
# SIGKILLed at once, J new nodes joining, bitwise-identical replicas, the
# daemons' memory and etcd's CPU. `make scale` runs it (NODES=64).
#
# etcd (plain http on loopback, a temp data dir; ETCD_SECURE=1 gives the
# demo's TLS + password auth), then NODES daemons on loopback (UCX tcp over
# lo, no namespaces), one C trainer each with a 3940-byte model (--hidden
# 13: one allreduce of 985 floats per step). Phases, each waited for with a
# bounded deadline on the trainers' hash logs:
#   1. first view: every trainer logged a step;
#   2. step latency: the mean interval between node1's steps over a window
#      of steps of one generation (all NODES in it);
#   3. KILL daemons (and their trainers) SIGKILLed in one burst, the time
#      stamped just before; recovery = node1's first step completed in a
#      later generation than every step it logged before the kill (the
#      rule of rd_kill_to_step), whose world must be NODES - KILL;
#   4. JOIN new nodes started together; join time = from their start to
#      node1's first step with all of them in the world;
#   5. the job runs to its end; every surviving trainer exits 0 and all of
#      them saved bitwise identical parameters.
# Memory: VmRSS and RssAnon (/proc/PID/status) of every daemon after the
# join, medians. etcd: utime+stime (/proc/PID/stat) from healthy to the
# end, over the wall time: etcd_cpu_pct (100 = one core). CPU: each
# latency window prints a "scale: cpu:" line from /proc/PID/schedstat
# (cores busy, and per step each process's CPU time and its wait on the
# run queue), which says whether the step is bound by the scheduler.
# Last line:
#   scale: nodes=N kill8_recovery_ms=<n> join8_ms=<n> identical=<yes|no>
#     step_us_4k=<n> step_us_4k_flat=<n> rss_mb=<n> etcd_cpu_pct=<n>
# (kill8/join8 name the issue's figures; KILL and JOIN say how many.)
# step_us_4k is the two-level ring's step, step_us_4k_flat the flat
# ring's: the main job runs with SCALE_RING2D (the daemon arguments that
# choose the two-level ring; default --ring-grid-min-nodes 16, the
# threshold ring/README.md recommends) and a first, short job measures the
# flat ring; SCALE_RING2D= (empty) runs only the flat ring, and both
# figures are then its (a note on stderr says so).
# Exit 0 when identical=yes and both events recovered, 1 otherwise.
#
# Environment: NODES (64), KILL (8), JOIN (8), SCALE_LEASE_TTL (the
# daemons' --lease-ttl, 5, their default: at 2, as the demo has it, most
# of 64 daemons here fenced at least once, so the job changed views
# before the kill), SCALE_STEPS (the job's
# length in steps, 600: every phase fits at 8 to 64 nodes here; a job
# that ends first says to raise it), SCALE_WINDOW (steps in the
# latency window, 100), SCALE_RING2D (see above), BUILD (build),
# SCALE_KEEP=1 keeps the logs, ETCD_SECURE=1 for TLS etcd.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
N=${NODES:-64}
K=${KILL:-8}
J=${JOIN:-8}
STEPS=${SCALE_STEPS:-600}
WIN=${SCALE_WINDOW:-100}
RING2D=${SCALE_RING2D---ring-grid-min-nodes 16}
TTL=${SCALE_LEASE_TTL:-5}
for v in N K J STEPS WIN TTL; do
    [[ "${!v}" =~ ^[0-9]+$ ]] ||
        { echo "scale: $v must be a number" >&2; exit 2; }
done
[ "$N" -ge 2 ] && [ "$K" -ge 1 ] && [ "$K" -lt "$N" ] && [ "$WIN" -ge 2 ] ||
    { echo "scale: need NODES >= 2, 1 <= KILL < NODES," \
           "SCALE_WINDOW >= 2" >&2; exit 2; }
T=$(mktemp -d /tmp/ringd-scale.XXXXXX)
PIDS=()
NETNS=0
SUBNET=
PREFIX=
ETCD_SECURE=${ETCD_SECURE:-0}
export DEMO_KEEP=${SCALE_KEEP:-0}

trap 'rd_cleanup 0 scale' EXIT
trap 'exit 130' INT TERM

die() { echo "scale: $*" >&2; exit 1; }
# shellcheck source=cluster.sh
. chaos/cluster.sh
now_ms() { date +%s%3N; }

for f in "$B/ringd" "$B/examples/trainer"; do
    [ -x "$f" ] || die "$f is missing: run make first"
done
command -v etcd >/dev/null || die "etcd not found: run make deps"

# ---- limits ------------------------------------------------------------------
# Every process (2 per node, etcd) inherits our limits: a daemon holds
# sockets to its ring peers and etcd, etcd one or more per daemon.
need_fd=$(( 16 * (N + J) + 1024 ))
[ "$(ulimit -n)" -ge "$need_fd" ] || ulimit -n "$need_fd" 2>/dev/null ||
    die "open files: ulimit -n is $(ulimit -n), $need_fd needed" \
        "(ulimit -Hn $(ulimit -Hn))"
# Threads count against RLIMIT_NPROC: a daemon has a handful (loop, ring,
# checkpoint workers, UCX), a trainer one or two.
need_proc=$(( 16 * (N + J) + 256 ))
if [ "$(ulimit -u)" != unlimited ] && [ "$(ulimit -u)" -lt "$need_proc" ]; then
    ulimit -u "$need_proc" 2>/dev/null ||
        die "processes: ulimit -u is $(ulimit -u), $need_proc needed"
fi

declare -A DPID TPID
# Node $1's daemon (min-nodes $2, extra arguments $3), without waiting for
# its socket: a burst of nodes starts together.
launch_daemon() {
    local i=$1 extra
    read -ra extra <<<"$3"
    UCX_NET_DEVICES=lo UCX_TLS=tcp,self UCX_TCP_CM_REUSEADDR=y \
        UCX_WARN_UNUSED_ENV_VARS=n "$B/ringd" --etcd "$ETCD_URL" \
        "${ETCD_SEC[@]}" --job "$JOB" --node-id "node$i" --host "host$i" \
        --socket "$T/node$i.sock" --trainers 1 --lease-ttl "$TTL" \
        --min-nodes "$2" --metrics off "${extra[@]}" >"$T/ringd-$i.log" 2>&1 &
    DPID[$i]=$!
    PIDS+=($!)
}
# Node $1's trainer once its daemon's socket is there (bounded).
launch_trainer() {
    local i=$1 deadline=$(( $(now_ms) + 30000 ))
    until [ -S "$T/node$i.sock" ]; do
        [ "$(now_ms)" -lt "$deadline" ] || die "node$i's daemon did not start:
$(tail -5 "$T/ringd-$i.log")"
        kill -0 "${DPID[$i]}" 2>/dev/null || die "node$i's daemon exited:
$(tail -5 "$T/ringd-$i.log")"
        sleep 0.05
    done
    OPENBLAS_NUM_THREADS=1 "$B/examples/trainer" --cpu \
        --socket "$T/node$i.sock" \
        --steps "$STEPS" --hidden 13 --log-every 1000000 \
        --hash-log "$T/hash-$i.log" --save "$T/params-$i.bin" \
        >"$T/trainer-$i.log" 2>&1 &
    TPID[$i]=$!
    PIDS+=($!)
}
# Nodes $1..$2 (min-nodes $3, daemon arguments $4): daemons, then trainers.
start_nodes() {
    local i
    for i in $(seq "$1" "$2"); do launch_daemon "$i" "$3" "$4"; done
    for i in $(seq "$1" "$2"); do launch_trainer "$i"; done
}

# Wait (bounded, $1 s) until the command "${@:3}" succeeds; else die with $2.
wait_for() {
    local deadline=$(( $(now_ms) + $1 * 1000 )) what=$2
    shift 2
    until "$@"; do
        [ "$(now_ms)" -lt "$deadline" ] || die "timed out: $what"
        kill -0 "${TPID[1]}" 2>/dev/null || die "node1's trainer exited" \
            "at step $(steps_of 1) of $STEPS$(
            [ "$(steps_of 1)" -ge "$STEPS" ] &&
            echo " (the job ended first: raise SCALE_STEPS)"):
$(tail -5 "$T/trainer-1.log")"
        sleep 0.1
    done
}
steps_of() {
    [ -f "$T/hash-$1.log" ] && awk 'END { print NR }' "$T/hash-$1.log" ||
        echo 0
}
# Every node in $@ logged a step.
all_stepped() { local i; for i in "$@"; do [ -s "$T/hash-$i.log" ]; done; }
at_least() { [ "$(steps_of 1)" -ge "$1" ]; }
# node1 logged a step of world $1 after epoch ms $2: its line into LINE.
world_step() {
    LINE=$(awk -v w="$1" -v t="$2" '$1 == "step" && $8 == w && $12 > t {
        print; exit }' "$T/hash-1.log")
    [ -n "$LINE" ]
}
# Mean interval (µs) between node1's steps from line $1 on, over WIN steps
# of the generation of line $1 (a view change inside the window ends it).
step_us() {
    awk -v a="$1" -v w="$WIN" 'NR == a { g = $4; t0 = $12; n = 0 }
        NR > a && n < w - 1 && $4 == g { t1 = $12; n++ }
        END { if (n > 0) printf "%d", (t1 - t0) * 1000 / n
              else print "none" }' \
        "$T/hash-1.log"
}
# A job of NODES nodes with daemon arguments $1 up to its latency window:
# sets STEP_US (and FIRST_VIEW_MS from T0).
run_latency() {
    local from
    T0=$(now_ms)
    start_nodes 1 "$N" "$N" "$1"
    wait_for 120 "the first view (every trainer's first step)" \
        all_stepped $(seq 1 "$N")
    FIRST_VIEW_MS=$(( $(awk '$1 == "step" { print $12; exit }' \
        "$T/hash-1.log") - T0 ))
    # Leave the first steps (joining, cold caches) out of the window.
    from=$(( $(steps_of 1) + 20 ))
    wait_for 300 "node1 at step $from" at_least "$from"
    local s0 w0=$(now_ms)
    s0=$(sched_sum)
    wait_for 300 "node1 at step $((from + WIN))" at_least $((from + WIN))
    STEP_US=$(step_us "$from")
    sched_report "$s0" "$(sched_sum)" "$w0" "$(now_ms)" "$(( $(steps_of 1) - from ))"
}
# Every daemon's and trainer's CPU time and run-queue wait (ns, from
# /proc/PID/task/*/schedstat, every thread: time on a CPU, time runnable
# but waiting for one), summed: "run wait threads".
sched_sum() {
    local p
    for p in "${DPID[@]}" "${TPID[@]}"; do
        cat "/proc/$p"/task/*/schedstat 2>/dev/null
    done | awk '{ r += $1; w += $2; n++ } END { printf "%.0f %.0f %d", r, w, n }'
}
# What bounds the step: CPU demand over the window against the machine's
# cores, and how long a process waited runnable per step. When the cores
# are all busy and the wait is a large part of a step, the ring's hops
# wait for the scheduler, not for the network or the protocol.
sched_report() {
    local r0 w0 r1 w1 n
    read -r r0 w0 _ <<<"$1"
    read -r r1 w1 n <<<"$2"
    awk -v r="$((r1 - r0))" -v w="$((w1 - w0))" -v n="$n" \
        -v ms="$(($4 - $3))" -v steps="$5" -v cores="$(nproc)" -v us="$STEP_US" \
        'BEGIN { if (steps < 1 || ms < 1 || n < 1) exit
            pct = us > 0 ? w / 10 / n / steps / us : 0
            printf "scale: cpu: %d threads, %.2f of %d cores busy over the" \
                   " window; per step each thread ran %.0f us and waited %.0f us" \
                   " runnable (%.0f%% of the %s us step)\n",
                   n, r / 1e6 / ms, cores, r / 1e3 / n / steps,
                   w / 1e3 / n / steps, pct, us }'
}
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
# Median of the numbers on stdin, one decimal.
median() {
    sort -n | awk '{ v[NR] = $1 }
        END { if (NR == 0) { print "none"; exit }
              m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
              printf "%.1f", m }'
}

# ---- the flat ring alone, first, when the main job runs the other -------
rd_start_etcd scale
echo "scale: etcd at $ETCD_URL ($([ "$ETCD_SECURE" = 1 ] &&
    echo "TLS, password auth" || echo "plain http on loopback")), $N nodes," \
    "$K killed, $J joining, $STEPS steps, model 3940 B"
STEP_US_FLAT=
if [ -n "$RING2D" ]; then
    JOB=scaleflat
    run_latency "--ring-grid-min-nodes 0"
    STEP_US_FLAT=$STEP_US
    echo "scale: flat ring: ${STEP_US_FLAT} us a step"
    for p in "${TPID[@]}" "${DPID[@]}"; do kill -9 "$p" 2>/dev/null; done
    for p in "${TPID[@]}" "${DPID[@]}"; do wait "$p" 2>/dev/null; done
    rm -f "$T"/hash-*.log "$T"/params-*.bin "$T"/*.sock
    DPID=() TPID=()
else
    echo "scale: SCALE_RING2D is empty (the flat ring only):" \
         "step_us_4k is the flat ring's figure" >&2
fi

# ---- the main job ----------------------------------------------------------
JOB=scale
CPU0=$(cpu_ticks "$ETCD_PID")
CPU0_MS=$(now_ms)
run_latency "${RING2D:---ring-grid-min-nodes 0}"
[ -n "$STEP_US_FLAT" ] || STEP_US_FLAT=$STEP_US
echo "scale: first view after $FIRST_VIEW_MS ms; ${STEP_US} us a step" \
     "(node1, mean over $WIN steps)"

# Victims spread over the ring: node1 observes and stays.
VICTIMS=()
for j in $(seq 0 $((K - 1))); do VICTIMS+=($(( 2 + j * (N - 1) / K ))); done
KILL_MS=$(now_ms)
{
    for v in "${VICTIMS[@]}"; do kill -9 "${DPID[$v]}" "${TPID[$v]}"; done
    for v in "${VICTIMS[@]}"; do wait "${DPID[$v]}" "${TPID[$v]}"; done
} 2>/dev/null
echo "scale: SIGKILL nodes ${VICTIMS[*]} (daemons and trainers)"
WORLD=$(( N - K ))
wait_for 60 "a step of world $WORLD after the kill" \
    world_step "$WORLD" "$KILL_MS"
rd_kill_to_step "$T/hash-1.log" "$KILL_MS"
KILL_OK=no
[ "$FIRST_GEN" != "" ] &&
    [ "$(awk -v g="$FIRST_GEN" '$4 == g { print $8; exit }' \
        "$T/hash-1.log")" = "$WORLD" ] &&
    KILL_OK=yes
echo "scale: kill: generation $GEN0 -> $FIRST_GEN (world $WORLD: $KILL_OK)," \
     "first step $FIRST_STEP after $KILL_TO_STEP ms"

# Joiners: fresh ids after every node so far.
JOIN_MS=none JOIN_OK=yes
if [ "$J" -gt 0 ]; then
    JOIN_OK=no
    J0=$(now_ms)
    start_nodes $((N + 1)) $((N + J)) 1 "${RING2D:---ring-grid-min-nodes 0}"
    WORLD=$(( N - K + J ))
    wait_for 120 "a step of world $WORLD after the join" \
        world_step "$WORLD" "$J0"
    read -r _ _ _ JGEN _ _ _ _ _ _ _ JT _ <<<"$LINE"
    JOIN_MS=$(( JT - J0 ))
    JOIN_OK=yes
    echo "scale: join: generation $JGEN with world $WORLD after $JOIN_MS ms"
fi

SURV=()
for i in $(seq 1 $((N + J))); do
    [[ " ${VICTIMS[*]} " == *" $i "* ]] || SURV+=("$i")
done
VMRSS=$(for i in "${SURV[@]}"; do awk '/^VmRSS:/ { print $2 / 1024 }' \
    "/proc/${DPID[$i]}/status"; done | median)
ANON=$(for i in "${SURV[@]}"; do awk '/^RssAnon:/ { print $2 / 1024 }' \
    "/proc/${DPID[$i]}/status"; done | median)
echo "scale: daemons' memory (median of ${#SURV[@]}): VmRSS $VMRSS MB," \
     "RssAnon $ANON MB"
# Which ring the survivors built in their last generation: the grid
# logs its layout (ring_grid.c) once per generation it lays out.
GRID=0
for i in "${SURV[@]}"; do
    last=$(grep -o 'ring gen [0-9]*' "$T/ringd-$i.log" | tail -n 1)
    [ -n "$last" ] && grep -q "$last: grid of" "$T/ringd-$i.log" &&
        GRID=$((GRID + 1))
done
echo "scale: grid: $GRID of ${#SURV[@]} daemons on the two-level ring"

# To the end of the job: a hang is a minute without a step of node1's
# (at 64 nodes a step takes a few hundred ms on this machine).
FAILED=0
for i in "${SURV[@]}"; do
    last=$(steps_of 1) deadline=$(( $(date +%s) + 60 ))
    while kill -0 "${TPID[$i]}" 2>/dev/null; do
        now=$(steps_of 1)
        [ "$now" = "$last" ] || { last=$now; deadline=$(( $(date +%s) + 60 )); }
        [ "$(date +%s)" -lt "$deadline" ] ||
            die "no step for 60 s (node1 at step $now of $STEPS," \
                "node$i's trainer running)"
        sleep 0.2
    done
    wait "${TPID[$i]}" || { FAILED=$((FAILED + 1))
        echo "scale: node$i's trainer failed:" \
             "$(tail -2 "$T/trainer-$i.log")" >&2; }
done
CPU1=$(cpu_ticks "$ETCD_PID")
CPU_PCT=$(awk -v a="$CPU0" -v b="$CPU1" -v hz="$(getconf CLK_TCK)" \
    -v ms=$(( $(now_ms) - CPU0_MS )) \
    'BEGIN { printf "%.1f", (b - a) / hz * 100000 / ms }')

# Hash logs: per file the last line per step wins; every step 0..STEPS-1
# must be logged (else lost), and the lines of a step's newest generation
# must agree (else applied twice or divergently).
read -r LOST DUP < <(for i in $(seq 1 $((N + J))); do
        awk '$1 == "step" { h[$2] = $10; g[$2] = $4 }
            END { for (s in h) print s, g[s], h[s] }' "$T/hash-$i.log"
    done | awk -v n="$STEPS" '{ if (!($1 in top) || $2 > top[$1]) {
            top[$1] = $2; th[$1] = $3; delete d[$1]
        } else if ($2 == top[$1] && $3 != th[$1]) d[$1] = 1 }
        END { for (s = 0; s < n; s++) if (!(s in th)) lost++
              for (s in d) dup++; print lost + 0, dup + 0 }')
echo "scale: hash logs: $LOST steps lost, $DUP with diverging replicas"
identical=yes
[ "$LOST" = 0 ] && [ "$DUP" = 0 ] || identical=no
for i in "${SURV[@]}"; do
    cmp -s "$T/params-${SURV[0]}.bin" "$T/params-$i.bin" || identical=no
done
[ "$FAILED" = 0 ] || identical=no
echo "scale: final parameters of ${#SURV[@]} nodes: $([ $identical = yes ] &&
    echo "bitwise identical" || echo "DIFFERENT (or missing)")" \
    "($(sha256sum "$T/params-${SURV[0]}.bin" 2>/dev/null | cut -c1-16)...)"
# A daemon whose keepalive came too late fences itself and registers
# again (a new member): with 2 cores for 128 processes that happens at a
# short TTL, and each one costs the job a view change.
FENCED=$(cat "$T"/ringd-*.log | grep -c -- "-> FENCED")
echo "scale: $FENCED times a daemon fenced itself" \
     "(lease $TTL s not renewed in time)"
echo "scale: recovered: kill=$KILL_OK join=$JOIN_OK"
echo "scale: nodes=$N kill${K}_recovery_ms=$KILL_TO_STEP join${J}_ms=$JOIN_MS" \
     "identical=$identical step_us_4k=$STEP_US step_us_4k_flat=$STEP_US_FLAT" \
     "rss_mb=$VMRSS etcd_cpu_pct=$CPU_PCT"
[ "$identical" = yes ] && [ "$KILL_OK" = yes ] && [ "$JOIN_OK" = yes ]
