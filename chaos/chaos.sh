#!/usr/bin/env bash
# chaos/chaos.sh - seeded fault injection through a real training job.
#
#   chaos/chaos.sh [-s SEED] [-f FAULTS] [-n NODES] [--quick] [--keep]
#                  [--kinds a,b,c] [--plan] [--etcd3]
#
# Starts etcd and NODES (default 4) nodes, each a ringd daemon with one C
# trainer, as network namespaces on a private bridge (chaos/netns.sh) or,
# where namespaces cannot be made, as processes on loopback (it says so, and
# the network faults are then skipped). It injects FAULTS faults drawn from
# SEED one at a time, waits for the job to make progress after each, lets
# the job finish, then checks the invariants (see chaos/README.md) and
# prints a report whose last line is
#   chaos: faults=<n> recovered=<n> lost_steps=<n> duplicated_steps=<n>
#          hangs=<n> kill_recovery_median_ms=<x> hang_recovery_max_ms=<y>
# (one line). Exit 0 when every check passed, 1 on a violation, 2 on bad
# usage. The same SEED gives the same fault sequence. --quick: fewer steps
# and only the robust faults (daemon kill, hang, scale up). Everything it
# starts is killed by pid and removed on every exit path.
#
# --kinds a,b,c (or CHAOS_KINDS) restricts the plan to those fault kinds.
# --etcd3 (or CHAOS_ETCD3=1): a 3-member etcd cluster, etcd_kill kills one.
#
# Environment: BUILD (default build), CHAOS_NETNS=0 to force loopback,
# CHAOS_KINDS (as --kinds; the option wins), CHAOS_STEPS_PER_FAULT (the
# job's steps per fault), CHAOS_STEP_DELAY_MS (a floor on each step's
# time, for fast machines), CHAOS_STRICT=0 to report
# stale replica steps and older checkpoints that do not restore as
# warnings instead of failing the run on them.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}

SEED=
FAULTS=10
NODES=4
QUICK=0
KEEP=0
PLAN_ONLY=0
KINDS_OPT=${CHAOS_KINDS:-}
ETCD3=${CHAOS_ETCD3:-0}
ALL_KINDS=(kill_daemon kill_trainer hang_daemon link_down packet_loss
           slow_link scale_up scale_down etcd_kill disk_full job_restart
           slow_trainer hung_trainer kill_adjacent trainer_close daemon_etcd
           fd_exhaust slow_disk daemon_restart rolling_restart)
usage() {
    echo "usage: $0 [-s SEED] [-f FAULTS] [-n NODES] [--quick] [--keep] [--plan]" \
         "[--kinds a,b,c] [--etcd3]" >&2
    echo "  kinds: ${ALL_KINDS[*]}" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
    -s) SEED=${2:-}; shift 2 || usage ;;
    -f) FAULTS=${2:-}; shift 2 || usage ;;
    -n) NODES=${2:-}; shift 2 || usage ;;
    --quick) QUICK=1; shift ;;
    --keep) KEEP=1; shift ;;
    --plan) PLAN_ONLY=1; shift ;;
    --kinds) KINDS_OPT=${2:-}; shift 2 || usage ;;
    --kinds=*) KINDS_OPT=${1#--kinds=}; shift ;;
    --etcd3) ETCD3=1; shift ;;
    -h|--help) usage ;;
    *) usage ;;
    esac
done
[ -z "$SEED" ] && SEED=$(( $(od -An -N4 -tu4 /dev/urandom) % 1000000 ))
[[ "$SEED" =~ ^[0-9]+$ ]] || { echo "chaos: SEED must be a number" >&2; exit 2; }
[[ "$FAULTS" =~ ^[0-9]+$ && "$FAULTS" -le 200 ]] ||
    { echo "chaos: FAULTS must be 0..200" >&2; exit 2; }
[[ "$NODES" =~ ^[0-9]+$ && "$NODES" -ge 2 && "$NODES" -le 8 ]] ||
    { echo "chaos: NODES must be 2..8" >&2; exit 2; }
# --kinds: a comma-separated subset of ALL_KINDS (each once, in the order
# given; the seeded draw then picks among them).
SEL_KINDS=()
if [ -n "$KINDS_OPT" ]; then
    IFS=, read -r -a _ks <<<"$KINDS_OPT"
    for k in "${_ks[@]}"; do
        [ -n "$k" ] || continue
        [[ " ${ALL_KINDS[*]} " == *" $k "* ]] ||
            { echo "chaos: unknown fault kind '$k' (kinds: ${ALL_KINDS[*]})" >&2; exit 2; }
        [[ " ${SEL_KINDS[*]:-} " == *" $k "* ]] || SEL_KINDS+=("$k")
    done
    [ ${#SEL_KINDS[@]} -gt 0 ] || { echo "chaos: --kinds: no kind given" >&2; exit 2; }
fi

KINDS_ARG=
[ ${#SEL_KINDS[@]} -gt 0 ] && KINDS_ARG=" --kinds $(IFS=,; echo "${SEL_KINDS[*]}")"
echo "chaos: seed=$SEED faults=$FAULTS nodes=$NODES quick=$QUICK" \
     "(replay: chaos/chaos.sh -s $SEED -f $FAULTS -n $NODES$(
     [ $QUICK = 1 ] && echo ' --quick')$KINDS_ARG$([ "$ETCD3" = 1 ] && echo ' --etcd3'))"

# The job runs at some hundreds of steps a second here and keeps going
# through most faults, so faults are paced by time (one after the previous
# recovered, plus a quiet time) and the job gets PER steps per fault, the
# most one fault and its quiet time use up, plus a tail.
PER=${CHAOS_STEPS_PER_FAULT:-4000}
[ "$QUICK" = 1 ] && PER=${CHAOS_STEPS_PER_FAULT:-2500}
STEPS=$(( FAULTS * PER + 2000 ))
# A floor on each step's time (the trainers' --step-delay-ms): faults are
# paced by time and the job by steps, so on a fast machine a job of small
# steps can near its end before its faults are played (a skip, which
# fails the run). 0: as fast as the machine goes.
STEP_DELAY_MS=${CHAOS_STEP_DELAY_MS:-0}
[[ "$STEP_DELAY_MS" =~ ^[0-9]+$ ]] ||
    { echo "chaos: CHAOS_STEP_DELAY_MS must be a number of ms" >&2; exit 2; }
STEP_DELAY_ARG=
[ "$STEP_DELAY_MS" -gt 0 ] && STEP_DELAY_ARG="--step-delay-ms $STEP_DELAY_MS"
SETTLE_MS=1500        # quiet time after a recovery before the next fault
RECOVER_S=60          # no step within this long after a fault: a hang
STEP_TIMEOUT_MS=20000 # the daemons' --step-timeout (hung_trainer)
# Every daemon runs with this descriptor limit (`ulimit -n`), low enough
# for fd_exhaust to reach it.
NOFILE=${CHAOS_NOFILE:-256}
[[ "$NOFILE" =~ ^[0-9]+$ && "$NOFILE" -ge 64 ]] ||
    { echo "chaos: CHAOS_NOFILE must be a number >= 64" >&2; exit 2; }
TOL=0.02              # final accuracy vs the reference run
# Checkpoints every CKPT_EVERY steps into CKDIR, shared by all the nodes
# (one machine): job_restart resumes from them, disk_full fills their
# file system, and the newest one is restored and verified at the end.
CKPT_EVERY=${CHAOS_CKPT_INTERVAL:-250}
[[ "$CKPT_EVERY" =~ ^[0-9]+$ ]] || { echo "chaos: CHAOS_CKPT_INTERVAL must be a number" >&2; exit 2; }
CKPT_TMPFS_SIZE=${CHAOS_CKPT_TMPFS:-16m}
# Stale replica steps and older checkpoints that do not restore fail the
# run unless CHAOS_STRICT=0.
STRICT=${CHAOS_STRICT:-1}
[[ "$STRICT" =~ ^[01]$ ]] || { echo "chaos: CHAOS_STRICT must be 0 or 1" >&2; exit 2; }

T=$(mktemp -d /tmp/ringd-chaos.XXXXXX)
PREFIX="ch$$"
PREFIX=${PREFIX:0:8}
# Every new node is a fresh host: a fault makes at most 4 (kill_adjacent
# with two nodes added first, then two replacements).
MAXSLOT=$(( NODES + 4 * FAULTS + 1 ))
[ "$MAXSLOT" -gt 50 ] && MAXSLOT=50
PIDS=()
NETNS=0
SUBNET=
declare -A ROLE EXPECT   # pid -> "daemon k"/"trainer k"; pid -> expected end
declare -A HOSTOF        # slot -> host (namespace PREFIXh<host>)
CKDIR=                   # the checkpoint directory (set once T exists)
CKPT_MOUNTED=0           # a file system of ours is mounted on CKDIR
CKPT_LOOP=               # its loop device (ext4), empty for a tmpfs
THROTTLE=/sys/fs/cgroup/blkio/blkio.throttle   # ...{read,write}_{bps,iops}_device
ETCD_OLD=()              # etcd pids killed by etcd_kill
IPT_NS=()                # namespaces with an iptables rule of ours
QDISC_DEV=()             # bridge-side veths with a qdisc of ours
LINK_DOWN=()             # veths we set down

# Our children still running, from bash's own job table, into RUNNING
# (" pid pid "). Not kill -0: a run forks tens of thousands of processes
# (pid_max is 32768 here), so the pid of one that exited may already be
# another process's, possibly not even ours. No fork: a builtin into a file.
running_snapshot() {
    local run=()
    jobs -rp >"$T/running" 2>/dev/null
    mapfile -t run <"$T/running" 2>/dev/null
    RUNNING=" ${run[*]} "
}
is_running() { [[ "$RUNNING" == *" $1 "* ]]; }
# Record the exit status of every started process that has exited, while
# bash still knows it (it forgets a status once the pid is reused by a new
# child of ours). Uses the last running_snapshot.
reap_exited() {
    local p
    for p in "${PIDS[@]}"; do
        [ -n "${STATUS[$p]:-}" ] || is_running "$p" && continue
        wait "$p" 2>/dev/null; STATUS[$p]=$?; REAPED[$p]=1
    done
}

cleanup() {
    local p
    running_snapshot
    for p in "${PIDS[@]}"; do
        is_running "$p" || continue
        kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null
    done
    for p in "${HELPERS[@]}"; do is_running "$p" && { kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; }; done
    for ns in "${IPT_NS[@]}"; do ip netns exec "$ns" iptables -F 2>/dev/null; done
    for d in "${QDISC_DEV[@]}"; do tc qdisc del dev "$d" root 2>/dev/null; done
    for d in "${LINK_DOWN[@]}"; do ip link set "$d" up 2>/dev/null; done
    [ "$NETNS" = 1 ] && chaos/netns.sh down "$PREFIX" "$MAXSLOT"
    [ -n "$CKPT_LOOP" ] && disk_throttle 0
    if [ "$CKPT_MOUNTED" = 1 ]; then
        rm -f "$CKDIR/fill"
        [ "$KEEP" = 1 ] && cp -a "$CKDIR" "$T/ckpt.kept" 2>/dev/null
        umount "$CKDIR" 2>/dev/null || umount -l "$CKDIR" 2>/dev/null
        CKPT_MOUNTED=0
    fi
    [ -n "$CKPT_LOOP" ] && losetup -d "$CKPT_LOOP" 2>/dev/null
    if [ "$KEEP" = 1 ]; then
        [ "${REPORTED:-0}" = 1 ] || echo "chaos: kept $T"
    else
        rm -rf "$T"
    fi
    return 0
}
# disk_throttle 0 | BPS IOPS: the checkpoint loop device's read and write
# limits for every process (the root blkio cgroup); 0 lifts them.
disk_throttle() {
    local mm w
    mm=$(lsblk -dno MAJ:MIN "$CKPT_LOOP" 2>/dev/null | tr -d ' ')
    [ -n "$mm" ] || return 1
    for w in read write; do
        echo "$mm ${1}" >"${THROTTLE}.${w}_bps_device" 2>/dev/null || return 1
        echo "$mm ${2:-0}" >"${THROTTLE}.${w}_iops_device" 2>/dev/null || return 1
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() { echo "chaos: $*" >&2; exit 1; }
# shellcheck source=cluster.sh disable=SC1091
. chaos/cluster.sh
now_ms() { date +%s%3N; }
log() { local d=$(( $(now_ms) - T0 )); echo "chaos: [$((d / 1000)).$((d % 1000 / 100))s] $*"; }

# ---- the seeded generator (an LCG in bash arithmetic: same seed, same
# sequence, whatever bash's own RANDOM does) ---------------------------------
RNG=$(( SEED * 2654435761 % 2147483648 + 1 ))
rnd() { # rnd N: 0..N-1 in REPLY
    RNG=$(( (RNG * 1103515245 + 12345) % 2147483648 ))
    REPLY=$(( (RNG >> 8) % $1 ))
}

T0=$(now_ms)

# ---- fault plan ------------------------------------------------------------
if [ ${#SEL_KINDS[@]} -gt 0 ]; then
    KINDS=("${SEL_KINDS[@]}")
elif [ "$QUICK" = 1 ]; then
    KINDS=(kill_daemon hang_daemon scale_up)
else
    KINDS=("${ALL_KINDS[@]}")
fi
PLAN=()
for i in $(seq 1 "$FAULTS"); do
    if [ "$QUICK" = 1 ]; then
        # Every kind once per round, in a seeded order.
        if [ $(( (i - 1) % ${#KINDS[@]} )) = 0 ]; then
            ROUND=("${KINDS[@]}")
            for ((j = ${#ROUND[@]} - 1; j > 0; j--)); do
                rnd $((j + 1)); x=${ROUND[$j]}; ROUND[$j]=${ROUND[$REPLY]}; ROUND[$REPLY]=$x
            done
        fi
        kind=${ROUND[$(( (i - 1) % ${#KINDS[@]} ))]}
    else
        rnd ${#KINDS[@]}; kind=${KINDS[$REPLY]}
    fi
    rnd 1000; PLAN+=("$kind:$REPLY")
    # A rolling restart is a restart per node, one after the other: the
    # job gets steps for each (the nodes a scale_up may add included).
    [ "$kind" = rolling_restart ] && STEPS=$(( STEPS + PER * (NODES + 2) / 2 ))
done
echo "chaos: plan: ${PLAN[*]%%:*}"
[ "$PLAN_ONLY" = 1 ] && exit 0
for f in "$B/ringd" "$B/ringctl" "$B/examples/trainer"; do
    [ -x "$f" ] || die "$f is missing: run make first"
done
command -v etcd >/dev/null || die "etcd not found: run make deps"

# ---- hosts -----------------------------------------------------------------
if [ "${CHAOS_NETNS:-1}" != 0 ] && [ "$(id -u)" = 0 ] &&
   chaos/netns.sh check 2>/dev/null; then
    out=$(chaos/netns.sh up "$PREFIX" "$MAXSLOT") || die "cannot make namespaces"
    SUBNET=${out#subnet=}
    NETNS=1
    echo "chaos: nodes are network namespaces ${PREFIX}h1..$MAXSLOT on a" \
         "private bridge, $SUBNET.0/24"
else
    echo "chaos: network namespaces are not available here (root and ip" \
         "netns needed, or CHAOS_NETNS=0); running the nodes as processes" \
         "on loopback: link-down, packet-loss and slow-link faults are skipped"
fi

# ---- the checkpoint directory ---------------------------------------------------
# When the plan fills it (disk_full) or slows it down (slow_disk), a small
# file system of its own: ext4 on a loop device, whose I/O the blkio
# cgroup can throttle (slow_disk); else, for disk_full only, a tmpfs.
# Without a disk_full or slow_disk, a plain directory in T.
CKDIR="$T/ckpt"
mkdir -p "$CKDIR"
CKPT_NOTE=
SLOW_NOTE=
ckpt_loop_mount() {
    [ "$(id -u)" = 0 ] || { echo "root needed"; return 1; }
    [ -w "${THROTTLE}.write_bps_device" ] ||
        { echo "no blkio throttle (${THROTTLE}.write_bps_device)"; return 1; }
    truncate -s "$CKPT_TMPFS_SIZE" "$T/ckpt.img" &&
    mkfs.ext4 -q -F -m 0 -E lazy_itable_init=0,lazy_journal_init=0 \
        "$T/ckpt.img" >/dev/null 2>&1 || { echo "mkfs.ext4 failed"; return 1; }
    CKPT_LOOP=$(losetup -f --show "$T/ckpt.img" 2>&1) ||
        { echo "losetup: $CKPT_LOOP"; CKPT_LOOP=; return 1; }
    mount -o noatime "$CKPT_LOOP" "$CKDIR" 2>&1 || return 1
    CKPT_MOUNTED=1
}
if [ "$CKPT_EVERY" = 0 ]; then
    CKPT_NOTE="checkpoints off (CHAOS_CKPT_INTERVAL=0)"
    SLOW_NOTE=$CKPT_NOTE
elif [[ " ${PLAN[*]%%:*} " == *" disk_full "* || " ${PLAN[*]%%:*} " == *" slow_disk "* ]]; then
    if ckpt_loop_mount >"$T/loop.err" 2>&1; then
        :
    elif SLOW_NOTE="no loop device for the checkpoints: $(head -c 200 "$T/loop.err")"
        [ -n "$CKPT_LOOP" ] && losetup -d "$CKPT_LOOP"; CKPT_LOOP=
        [ "$(id -u)" = 0 ] && mount -t tmpfs -o size="$CKPT_TMPFS_SIZE",mode=0755 \
            chaos-ckpt "$CKDIR" 2>"$T/mount.err"; then
        CKPT_MOUNTED=1
    else
        CKPT_NOTE="no file system for the checkpoints (root needed): $(cat "$T/mount.err")"
        SLOW_NOTE=$CKPT_NOTE
    fi
fi
[ "$CKPT_EVERY" != 0 ] && echo "chaos: checkpoints every $CKPT_EVERY steps in" \
    "$CKDIR$([ $CKPT_MOUNTED = 1 ] && echo " (a $([ -n "$CKPT_LOOP" ] &&
    echo "ext4 on $CKPT_LOOP" || echo tmpfs) of $CKPT_TMPFS_SIZE)")"
CKPT_ARGS=()
[ "$CKPT_EVERY" != 0 ] && CKPT_ARGS=(--ckpt-interval "$CKPT_EVERY" --ckpt-dir "$CKDIR")
CKJOB="$CKDIR/chaos"    # where the daemons of job "chaos" put them
# Complete checkpoints (a MANIFEST.json in their step directory), by step.
ckpt_steps() {
    local d
    for d in "$CKJOB"/step-*/MANIFEST.json; do
        [ -f "$d" ] || continue
        d=${d%/MANIFEST.json}; d=${d##*/step-}
        echo $((10#$d))
    done | sort -n
}
newest_ckpt() { local s; s=$(ckpt_steps | tail -1); echo "${s:--1}"; }
# Checkpoint write failures the daemons logged so far.
ckpt_failures() {
    cat "$T"/ringd-*.log 2>/dev/null |
        grep -c 'checkpoint of step [0-9]* \(failed\|not completed\)'
}

# ---- reference run -----------------------------------------------------------
"$B/examples/trainer" --no-daemon --cpu --steps "$STEPS" --log-every "$STEPS" \
    >"$T/reference.log" 2>&1 || die "the reference run failed"
REF_ACC=$(sed -n 's/^final: test_accuracy \([0-9.]*\).*/\1/p' "$T/reference.log")
echo "chaos: reference (one process, $STEPS steps): test_accuracy $REF_ACC"

# ---- etcd --------------------------------------------------------------------
ETCD_PIDS=()
if [ "$ETCD3" = 1 ]; then
    rd_start_etcd3 chaos
    echo "chaos: etcd: 3 members, client ports ${EPS[*]}"
else
    rd_start_etcd chaos
    ETCD_PIDS=("$ETCD_PID")
fi
echo "chaos: etcd at $ETCD_URL ($([ "$ETCD_SECURE" = 1 ] && echo "TLS, password auth" || echo "plain http, no auth"))"

# ---- nodes ---------------------------------------------------------------------
declare -A DPID TPID
LIVE=()        # slots whose daemon and trainer are meant to be running
NEXT=1         # next fresh slot (node id node<slot>)
NEXTHOST=1     # next fresh host (namespace); a job restart reuses its hosts
start_trainer() {
    local k=$1
    rd_host_cmd "${HOSTOF[$k]}"
    "${HOST_CMD[@]}" "$B/examples/trainer" --socket "$T/node$k.sock" --cpu \
        --steps "$STEPS" --log-every $((STEPS / 4)) $STEP_DELAY_ARG \
        --hash-log "$T/hash-$k.log" >>"$T/trainer-$k.log" 2>&1 &
    TPID[$k]=$!; PIDS+=($!); ROLE[$!]="trainer node$k"; EXPECT[$!]=ok
}
# start_node MIN_NODES [HOST]: a fresh slot (node id), on a fresh host
# unless HOST is given; returns the slot in REPLY.
start_node() {
    local k=$NEXT min=$1 dev=lo h=${2:-}
    if [ -z "$h" ]; then
        h=$NEXTHOST
        [ "$h" -le "$MAXSLOT" ] || die "out of hosts"
        NEXTHOST=$((NEXTHOST + 1))
    fi
    NEXT=$((NEXT + 1)); HOSTOF[$k]=$h
    start_daemon "$k" "$min"
    start_trainer "$k"
    LIVE+=("$k")
    REPLY=$k
}
# start_daemon SLOT MIN_NODES: the slot's daemon (node id, host, socket
# of the slot), until its socket is there. A restart starts it again
# with the same (its log goes on).
start_daemon() {
    local k=$1 min=$2 dev=lo
    [ "$NETNS" = 1 ] && dev=eth0
    rd_host_cmd "${HOSTOF[$k]}"
    "${HOST_CMD[@]}" UCX_NET_DEVICES=$dev UCX_TCP_CM_REUSEADDR=y \
        UCX_WARN_UNUSED_ENV_VARS=n prlimit --nofile="$NOFILE:$NOFILE" \
        "$B/ringd" --etcd "$ETCD_URL" "${ETCD_SEC[@]}" --job chaos \
        --node-id "node$k" --host "host${HOSTOF[$k]}" --socket "$T/node$k.sock" \
        --trainers 1 --lease-ttl 2 --min-nodes "$min" --metrics off \
        --step-timeout "$STEP_TIMEOUT_MS" \
        "${CKPT_ARGS[@]}" >>"$T/ringd-$k.log" 2>&1 &
    DPID[$k]=$!; PIDS+=($!); ROLE[$!]="daemon node$k"; EXPECT[$!]=ok
    for _ in $(seq 250); do [ -S "$T/node$k.sock" ] && break; sleep 0.02; done
    [ -S "$T/node$k.sock" ] || die "node$k's daemon did not start:
$(tail -5 "$T/ringd-$k.log")"
}
# restart_gap SLOT FAULT_MS, after a restart's record: the other nodes'
# longest time without a step while SLOT was away (from the fault to its
# first step back, the record's last sample), into RESTART_GAPS. They
# must not have waited for it the whole time.
restart_gap() {
    local k=$1 fms=$2 o=() x away gap
    for x in "${LIVE[@]}"; do [ "$x" = "$k" ] || o+=("$x"); done
    [ ${#o[@]} -gt 0 ] || return 0
    away=${TIMES[$kind]##* }
    gap=$(gap_in "${o[*]}" "$fms" $(( fms + away )))
    RESTART_GAPS+=("$gap")
    log "  the other nodes' longest time without a step meanwhile: $gap ms (node$k away $away ms)"
    [ "$gap" -lt "$away" ] ||
        RESTART_BAD+=("the other nodes made no step for $gap ms while node$k's daemon restarted (away $away ms): they waited for it")
}
# restart_daemon SLOT: what `systemctl reload ringd` does on the slot's
# node: SIGUSR2 (the daemon drains for a restart and exits 75), the
# unit's RestartSec=1, the daemon started again on the same socket. The
# slot's trainer waits for it meanwhile and must survive. Violations go
# to RESTART_BAD.
restart_daemon() {
    local k=$1 dp=${DPID[$1]} tp=${TPID[$1]} rc
    EXPECT[$dp]=restarted
    kill -USR2 "$dp" 2>/dev/null
    for _ in $(seq 300); do running_snapshot; is_running "$dp" || break; sleep 0.05; done
    if is_running "$dp"; then
        RESTART_BAD+=("node$k's daemon did not exit within 15 s of SIGUSR2")
        kill_reap "$dp"
    else
        wait "$dp" 2>/dev/null; rc=$?; STATUS[$dp]=$rc
        [ "$rc" = 75 ] || RESTART_BAD+=("node$k's daemon exited $rc on SIGUSR2, not 75")
    fi
    sleep 1 # the unit's RestartSec=1: systemd's delay, not a wait on an event
    start_daemon "$k" 1
    running_snapshot
    is_running "$tp" || RESTART_BAD+=("node$k's trainer did not outlive its daemon's restart")
}
nodes() { local x o=; for x; do o+="${o:+,}node$x"; done; echo "$o"; }
drop_live() { local k=$1 x n=(); for x in "${LIVE[@]}"; do [ "$x" = "$k" ] || n+=("$x"); done; LIVE=("${n[@]}"); }

# The highest step any trainer logged so far (-1 when none).
max_step() {
    cat "$T"/hash-*.log 2>/dev/null | awk 'BEGIN { m = -1 } $1 == "step" && $2 > m { m = $2 } END { print m }'
}
# First completed step >= $1 logged by a node in "$2" (space-separated
# slots) with t_ms >= $3: prints "step t_ms" or nothing.
first_after() {
    local f=() k
    for k in $2; do [ -f "$T/hash-$k.log" ] && f+=("$T/hash-$k.log"); done
    [ ${#f[@]} -gt 0 ] || return 0
    cat "${f[@]}" | awk -v s="$1" -v t="$3" '$1 == "step" && $2 >= s && $12 >= t { if (m == "" || $12 < m) { m = $12; st = $2 } } END { if (m != "") print st, m }'
}
# The newest view generation in any hash log line stamped at or before
# $1 (ms): the generation the job was in when a fault struck.
gen_at() {
    cat "$T"/hash-*.log 2>/dev/null | awk -v t="$1" 'BEGIN { g = 0 }
        $1 == "step" && $12 <= t && $4 > g { g = $4 } END { print g }'
}
# First step of a generation above $1 logged by a node in "$2" (slots)
# with t_ms >= $3: prints "step t_ms gen" or nothing.
first_newgen() {
    local f=() k
    for k in $2; do [ -f "$T/hash-$k.log" ] && f+=("$T/hash-$k.log"); done
    [ ${#f[@]} -gt 0 ] || return 0
    cat "${f[@]}" | awk -v g="$1" -v t="$3" '$1 == "step" && $4 > g && $12 >= t { if (m == "" || $12 < m) { m = $12; st = $2; sg = $4 } } END { if (m != "") print st, m, sg }'
}
CRASH_NOTES=()
RESTART_BAD=()   # a daemon restart that did not go as a reload must
RESTART_GAPS=()  # per restart: the other nodes' longest time without a step
RESTARTS=()   # per job_restart: "kill_ms ckpt_step last_step old slots:new slots"
CKPT_BAD=()   # checkpoint violations
EVICTED=()    # live nodes evicted for a slow trainer
MARKS=()      # "step kind" per injected fault, for the plot
DF_FREED=     # the step at which the last disk_full freed the space
# A live node's process that exited on its own is a crash: it is recorded
# (the run fails) and the node carries on: a trainer is restarted on its
# daemon, a node whose daemon died is replaced by a fresh one.
check_alive() {
    local k p rc who lf
    running_snapshot
    for k in "${LIVE[@]}"; do
        for p in "${DPID[$k]}" "${TPID[$k]}"; do
            is_running "$p" && continue
            # Reaped while it was out of LIVE (a fault's victim): its
            # exit is news here all the same.
            if [ -n "${REAPED[$p]:-}" ]; then
                rc=${STATUS[$p]}; unset "REAPED[$p]"
            else
                [ -n "${STATUS[$p]:-}" ] && continue
                wait "$p"; rc=$?; STATUS[$p]=$rc
            fi
            who=${ROLE[$p]%% *}
            [ "$(max_step)" -ge $((STEPS - 1)) ] && [ "$who" = trainer ] && [ $rc = 0 ] && continue
            EXPECT[$p]=crashed
            # Its last words: an assertion or error line if there is
            # one (a backtrace ends with a rule), else the last line.
            lf="$T/$( [ "$who" = daemon ] && echo ringd || echo trainer)-$k.log"
            CRASH_NOTES+=("${ROLE[$p]} (pid $p) exited with status $rc unprompted: $(
                { grep -E 'Assertion|Segmentation fault| error \[' "$lf" | tail -1 | grep . ||
                  grep -v '^step\|^data\|^gemm\|^joined\|^collective' "$lf" | tail -1; } | cut -c1-200)")
            log "CRASH: ${CRASH_NOTES[-1]}"
            if [ "$who" = trainer ] && kill -0 "${DPID[$k]}" 2>/dev/null; then
                start_trainer "$k"; log "  node$k's trainer restarted"
            else
                drop_live "$k"
                for p in "${DPID[$k]}" "${TPID[$k]}"; do
                    [ -n "${STATUS[$p]:-}" ] || kill_reap "$p"
                done
                start_node 1; log "  node$REPLY started as node$k's replacement"
            fi
            return 1
        done
    done
    reap_exited
    return 0
}
# Every crash so far (check_alive handles one per call; bounded).
check_all_alive() { local i; for i in 1 2 3 4 5 6 7 8; do check_alive && return 0; done; }
declare -A STATUS REAPED
wait_step() {  # wait_step S TIMEOUT_S: until some trainer logged step S
    local deadline=$(( $(date +%s) + $2 ))
    while [ "$(max_step)" -lt "$1" ]; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        check_alive
        sleep 0.1
    done
}

for _ in $(seq 1 "$NODES"); do start_node "$NODES"; done
log "etcd and $NODES nodes up; training $STEPS steps"
wait_step 0 60 || die "the job did not start (see $T)"

# ---- faults --------------------------------------------------------------------
declare -A INJ REC SKIP TIMES
NFAULTS=0; NREC=0; HANGS=0
OTHER_NOTES=()
skip() { # skip KIND WHY: count a fault of the plan that was not injected
    local c=${SKIP[$1]:-0 x}; SKIP[$1]="$(( ${c%% *} + 1 )) ($2)"
}
# SIGKILL and reap a process (quietly: bash reports killed jobs).
kill_reap() {
    EXPECT[$1]=killed
    { kill -9 "$1"; wait "$1"; STATUS[$1]=$?; } 2>/dev/null
}
veth() { echo "${PREFIX}v${HOSTOF[$1]}"; }   # veth SLOT: its host's link
HELPERS=()
# later MS CMD...: run CMD MS milliseconds after the fault, in the background
# (so the recovery is measured while the fault lasts); `settle` waits for it.
later() {
    local ms=$1; shift
    ( sleep "$(awk -v t="$fms" -v d="$ms" -v n="$(now_ms)" \
        'BEGIN { x = (t + d - n) / 1000; print (x > 0 ? x : 0) }')"; "$@" ) &
    HELPER=$!; HELPERS+=($!)
}
settle() { wait "$HELPER" 2>/dev/null; }
# stop_for PID MS: SIGSTOP PID now, SIGCONT it MS after the fault, in a
# helper (`settle` waits for it); a stray SIGCONT meanwhile is undone and
# counted in $T/cont (rd_stop_until, cluster.sh).
stop_for() {
    rd_stop_until "$1" $(( fms + $2 )) "$T/cont"
    HELPERS+=("$HELPER")
}
# Stray SIGCONTs stop_for has undone so far.
stray_conts() { [ -f "$T/cont" ] && wc -l <"$T/cont" || echo 0; }
pick() { # pick R: a live slot from the seeded draw
    REPLY=${LIVE[$(( $1 % ${#LIVE[@]} ))]}
}
record() { # record KIND FAULT_MS VICTIM_SLOT_OR_EMPTY PRE_STEP [JOINER]
    local kind=$1 fms=$2 victim=$3 pre=$4 others=() k res g0=
    for k in "${LIVE[@]}"; do [ "$k" = "$victim" ] || others+=("$k"); done
    # The step reached once the fault is in place: the next one may have
    # been in flight (and its log line not yet written), the one after
    # that had to get through the fault.
    pre=$(( $(max_step) + 1 ))
    # A fault that takes a member out of the job (kill, hang, partition,
    # drain) is over when the job completes a step in a later view
    # generation than any step logged before it: a step logged after the
    # fault in the old generation was reduced with the victim's data.
    case "$kind" in
    kill_daemon|kill_trainer|hang_daemon|link_down|scale_down|hung_trainer|kill_adjacent|daemon_restart|rolling_restart) g0=$(gen_at "$fms") ;;
    esac
    # A joiner: the time until it completes a step of its own; a node
    # whose daemon restarted: until it completes one in a later
    # generation (the step in flight at the reload is not the node back).
    [ -n "${5:-}" ] && { others=("$5"); pre=-2; [ "$kind" = daemon_restart ] || [ "$kind" = rolling_restart ] || g0=; }
    local deadline=$(( $(date +%s) + ${WITHIN:-$RECOVER_S} ))
    while :; do
        if [ -n "$g0" ]; then
            res=$(first_newgen "$g0" "${others[*]}" "$fms")
        else
            res=$(first_after $((pre + 2)) "${others[*]}" "$fms")
        fi
        [ -n "$res" ] && break
        if [ "$(date +%s)" -ge "$deadline" ]; then
            [ -n "${WITHIN:-}" ] && return 2
            HANGS=$((HANGS + 1))
            log "  $kind: HANG: no step completed within ${RECOVER_S}s"
            return 1
        fi
        check_alive
        sleep 0.05
    done
    local rstep rms rgen
    read -r rstep rms rgen <<<"$res"
    local ms=$(( rms - fms ))
    NREC=$((NREC + 1)); REC[$kind]=$(( ${REC[$kind]:-0} + 1 ))
    TIMES[$kind]="${TIMES[$kind]:-} $ms"
    log "  $kind: recovered: step $rstep completed ${ms} ms after the fault$(
        [ -n "$g0" ] && echo " (generation $rgen; $g0 at the fault)")"
}

# disk_full's end, at fault + 4 s (in a helper): the checkpoints complete
# before the fault must be intact; then the space is freed. Retention may
# retire an old one once a newer checkpoint completed (a write can still
# fit while dd fills the disk): only then may one be gone.
df_check_and_free() { # BEFORE_STEPS NEWEST_BEFORE SUMS OUT
    local st d
    for st in $1; do
        d="$CKJOB/step-$(printf %020d "$st")"
        if [ ! -f "$d/MANIFEST.json" ]; then
            [ "$(newest_ckpt)" -gt "$2" ] ||
            echo "disk_full: the checkpoint of step $st is no longer complete" >>"$4"
        elif ! ( cd "$CKDIR" && grep -F " chaos/step-$(printf %020d "$st")/" "$3" |
                 md5sum -c --quiet >/dev/null 2>&1 ); then
            echo "disk_full: the checkpoint of step $st changed while the disk was full" >>"$4"
        fi
    done
    rm -f "$CKDIR/fill"
    log "  disk_full: the fill file removed $(( $(now_ms) - fms )) ms after the fault"
}

# The longest time in [A_MS, B_MS] without a step logged by a node in
# "SLOTS" (the edges count): gap_in SLOTS A_MS B_MS.
gap_in() {
    local f=() k
    for k in $1; do [ -f "$T/hash-$k.log" ] && f+=("$T/hash-$k.log"); done
    [ ${#f[@]} -gt 0 ] || { echo $(( $3 - $2 )); return 0; }
    cat "${f[@]}" | awk -v a="$2" -v b="$3" '$1 == "step" && $12 >= a && $12 <= b { print $12 }' |
        sort -n | awk -v a="$2" -v b="$3" 'BEGIN { p = a; g = 0 }
            { if ($1 - p > g) g = $1 - p; p = $1 } END { if (b - p > g) g = b - p; print g }'
}
# Wait (RECOVER_S) for a step >= FROM by a node in "SLOTS" stamped at or
# after MS: until_step SLOTS FROM MS; the result ("step t_ms") in REPLY,
# 1 on a timeout.
until_step() {
    local deadline=$(( $(date +%s) + RECOVER_S ))
    until REPLY=$(first_after "$2" "$1" "$3"); [ -n "$REPLY" ]; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        check_alive; sleep 0.05
    done
}
recovered() { # recovered KIND MS: count a recovery of MS
    NREC=$((NREC + 1)); REC[$1]=$(( ${REC[$1]:-0} + 1 ))
    TIMES[$1]="${TIMES[$1]:-} $2"
}
ckpt_skips() {
    cat "$T"/ringd-*.log 2>/dev/null | grep -c 'checkpoint of step [0-9]* skipped'
}
# trainer_close: V FAULT_MS GEN_AT_FAULT CLOSES_BEFORE. The trainer's own
# next step (not in flight at the fault) shows it is back; the recovery
# is the job's first step of a later generation when the view changed,
# else its first step not in flight at the fault.
tc_wait() {
    local v=$1 fms=$2 g0=$3 p0 g1 rstep rms
    p0=$(( $(max_step) + 2 ))
    if ! until_step "$v" "$p0" "$fms"; then
        HANGS=$((HANGS + 1))
        log "  trainer_close: HANG: node$v's trainer made no step within ${RECOVER_S}s"
        return 1
    fi
    [ "$(grep -c '^connection closed' "$T/trainer-$v.log")" -gt "$4" ] ||
        OTHER_BAD+=("trainer_close: node$v's trainer did not close its connection (no 'connection closed' line)")
    g1=$(gen_at "$(now_ms)")
    if [ "$g1" -gt "$g0" ]; then
        read -r rstep rms _ <<<"$(first_newgen "$g0" "${LIVE[*]}" "$fms")"
        TC_NEWGEN=$(( ${TC_NEWGEN:-0} + 1 ))
    else
        read -r rstep rms <<<"$(first_after "$p0" "${LIVE[*]}" "$fms")"
        TC_SAMEGEN=$(( ${TC_SAMEGEN:-0} + 1 ))
    fi
    recovered trainer_close $(( rms - fms ))
    log "  trainer_close: recovered: step $rstep completed $(( rms - fms )) ms after" \
        "the fault ($( [ "$g1" -gt "$g0" ] && echo "a new generation, $g0 -> $g1" ||
        echo "no view change")); node$v's trainer back at step ${REPLY% *}"
}
# daemon_etcd: V FAULT_MS GEN_AT_FAULT, etcd healthy again now. The
# recovery runs from etcd's return to the survivors' first step of a
# later generation; every view they logged since has only them.
de_wait() {
    local v=$1 fms=$2 g0=$3 back iso deadline res rstep rms rgen bad k
    back=$(now_ms)
    iso="$(date -u -d "@$((back / 1000))" +%Y-%m-%dT%H:%M:%S).$(printf %03d $((back % 1000)))Z"
    log "  etcd healthy again $((back - fms)) ms after the kill"
    deadline=$(( $(date +%s) + RECOVER_S ))
    until res=$(first_newgen "$g0" "${LIVE[*]}" "$fms"); [ -n "$res" ]; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            HANGS=$((HANGS + 1))
            log "  daemon_etcd: HANG: no step in a new view within ${RECOVER_S}s of etcd's return"
            return 1
        fi
        check_alive; sleep 0.05
    done
    read -r rstep rms rgen <<<"$res"
    bad=$(for k in "${LIVE[@]}"; do
              awk -v t="$iso" '$1 >= t' "$T/ringd-$k.log" |
              sed -n 's/.*mb node[0-9]*: view \([0-9]*\), \([0-9]*\) members.*/\1 \2/p'
          done | awk -v g="$g0" -v n=${#LIVE[@]} '$1 > g && $2 > n { print "view " $1 ": " $2 " members" }' |
          sort -u | head -3 | tr '\n' ';')
    [ -z "$bad" ] ||
        OTHER_BAD+=("daemon_etcd: views after etcd's return count node$v, killed with etcd, as a member ($bad ${#LIVE[@]} survivors)")
    recovered daemon_etcd $(( rms - back ))
    log "  daemon_etcd: recovered: step $rstep (generation $rgen; $g0 at the fault)" \
        "completed $(( rms - back )) ms after etcd was back, $(( rms - fms )) ms after the kill$(
        [ -n "$bad" ] && echo "; DEAD NODE IN A VIEW: $bad")"
}
# fd_exhaust: V FAULT_MS FLOOD_END_MS GEN_AT_FAULT LOG_LINES_BEFORE. The
# row is the longest time without a step of node v's trainer during the
# flood; a view change, a daemon that serves no new client within 10 s of
# the flood's end, more than 2 * NOFILE + 50 new log lines (one per
# client accepted and closed, plus the rate-limited warnings), or any
# other work of the daemon's failing with EMFILE (checkpoint files, etcd
# connections: the flood must meet the client cap first) fail the run.
fd_check() {
    local v=$1 fms=$2 fend=$3 g0=$4 gap ok=0 lines g1 n emfile
    if ! until_step "$v" $(( $(max_step) + 1 )) "$fend"; then
        HANGS=$((HANGS + 1))
        log "  fd_exhaust: HANG: node$v's trainer made no step within ${RECOVER_S}s of the flood's end"
        return 1
    fi
    for _ in $(seq 100); do
        "$B/ringctl" --socket "$T/node$v.sock" status >/dev/null 2>&1 && { ok=1; break; }
        sleep 0.1
    done
    gap=$(gap_in "$v" "$fms" "$fend")
    n=$(cat "$T/hash-$v.log" | awk -v a="$fms" -v b="$fend" '$1 == "step" && $12 >= a && $12 <= b' | wc -l)
    lines=$(( $(wc -l <"$T/ringd-$v.log") - $5 ))
    emfile=$(tail -n +"$(( $5 + 1 ))" "$T/ringd-$v.log" | grep -v 'accept: ' |
        grep -c 'Too many open files')
    [ "$emfile" = 0 ] ||
        OTHER_BAD+=("fd_exhaust: the flood ran node$v's daemon itself out of descriptors: $emfile lines such as '$(
            tail -n +"$(( $5 + 1 ))" "$T/ringd-$v.log" | grep -v 'accept: ' | grep -m1 'Too many open files' | cut -c25-150)'")
    g1=$(gen_at "$(now_ms)")
    [ "$ok" = 1 ] ||
        OTHER_BAD+=("fd_exhaust: node$v's daemon served no new client (ringctl status) within 10 s of the flood's end")
    [ "$lines" -le $(( 2 * NOFILE + 50 )) ] ||
        OTHER_BAD+=("fd_exhaust: node$v's daemon logged $lines lines for one flood (bound $(( 2 * NOFILE + 50 )))")
    [ "$g1" = "$g0" ] ||
        OTHER_BAD+=("fd_exhaust: the view changed ($g0 -> $g1) while node$v's socket was flooded")
    [ "$n" -gt 0 ] && recovered fd_exhaust "$gap"
    log "  fd_exhaust: $(tail -1 "$T/flood-$NFAULTS.log"); node$v's trainer made $n steps" \
        "during the flood, longest without one $gap ms; the daemon logged $lines lines" \
        "($(grep -c 'accept: ' "$T/ringd-$v.log") accept warnings so far); ringctl status" \
        "after the flood: $([ $ok = 1 ] && echo served || echo NOT SERVED); generation $g0 -> $g1"
}
# slow_disk: FAULT_MS GEN_AT_FAULT SKIPS_BEFORE NEWEST_BEFORE, the disk
# fast again. The row is the longest time without a step of any node in
# the 4 s; a view change fails the run, and a checkpoint newer than the
# fault's must complete within 30 s of it.
sd_check() {
    local fms=$1 g0=$2 gap n g1 deadline
    if ! until_step "${LIVE[*]}" $(( $(max_step) + 1 )) "$fms"; then
        HANGS=$((HANGS + 1)); log "  slow_disk: HANG: no step within ${RECOVER_S}s"; return 1
    fi
    gap=$(gap_in "${LIVE[*]}" "$fms" $(( fms + 4000 )))
    g1=$(gen_at "$(now_ms)")
    [ "$g1" = "$g0" ] ||
        OTHER_BAD+=("slow_disk: the view changed ($g0 -> $g1) while the checkpoint disk was slow")
    deadline=$(( $(date +%s) + 30 ))
    while [ "$(newest_ckpt)" -le "$4" ] && [ "$(date +%s)" -lt "$deadline" ]; do
        check_alive; sleep 0.1
    done
    [ "$(newest_ckpt)" -gt "$4" ] ||
        CKPT_BAD+=("slow_disk: no checkpoint newer than step $4 completed within 30 s of the disk being fast again")
    n=$(( $(ckpt_skips) - $3 ))
    SD_SKIPS=$(( ${SD_SKIPS:-0} + n ))
    recovered slow_disk "$gap"
    log "  slow_disk: longest time without a step while slow: $gap ms; $n checkpoint(s)" \
        "skipped (the previous one still being written); newest complete checkpoint now" \
        "$(newest_ckpt); generation $g0 -> $g1"
}
# grow_first KIND MIN: a kind that needs MIN live nodes finds fewer (the
# plan's scale_downs and kill_adjacents drift the count down): start
# nodes until there are MIN, each awaited to its first step, so that no
# kind of the plan is ever skipped for want of nodes. Not faults; counted
# per kind in GREW. 1 (a hang) when an added node made no step.
declare -A GREW
grow_first() {
    local kind=$1 min=$2 a0 n
    while [ ${#LIVE[@]} -lt "$min" ]; do
        a0=$(now_ms); start_node 1; n=$REPLY
        log "fault $kind: $(( ${#LIVE[@]} - 1 )) nodes, $min needed: node$n started first"
        if ! until_step "$n" 0 "$a0"; then
            HANGS=$((HANGS + 1))
            log "  $kind: HANG: the added node$n made no step within ${RECOVER_S}s"
            return 1
        fi
        GREW[$kind]=$(( ${GREW[$kind]:-0} + 1 ))
        log "  node$n joined: step ${REPLY% *}, $(( ${REPLY#* } - a0 )) ms after its start"
    done
}
OTHER_BAD=()

for f in "${PLAN[@]}"; do
    kind=${f%%:*}; r=${f#*:}
    # Some quiet time after the last recovery, and enough steps left.
    sleep "$(awk -v m=$SETTLE_MS 'BEGIN { print m / 1000 }')"
    check_all_alive
    need=$PER
    [ "$kind" = rolling_restart ] && need=$(( PER * (${#LIVE[@]} + 2) / 2 ))
    if [ $(( STEPS - $(max_step) )) -lt "$need" ]; then
        skip "$kind" "job near its end"
        log "fault $kind: skipped: fewer than $need steps left (raise CHAOS_STEPS_PER_FAULT)"
        FAIL_EARLY=1; continue
    fi
    case "$kind" in
    link_down|packet_loss|slow_link)
        if [ "$NETNS" != 1 ]; then
            skip "$kind" "no namespaces"
            log "fault $kind: skipped (no network namespaces)"; continue
        fi ;;
    job_restart)
        if [ "$CKPT_EVERY" = 0 ]; then
            skip "$kind" "checkpoints off"
            log "fault $kind: skipped (checkpoints off)"; continue
        fi ;;
    disk_full)
        if [ "$CKPT_MOUNTED" != 1 ]; then
            skip "$kind" "${CKPT_NOTE:-no tmpfs}"
            log "fault $kind: skipped (${CKPT_NOTE:-no tmpfs})"; continue
        fi ;;
    scale_down)
        grow_first "$kind" 3 || break ;;
    kill_adjacent)
        # Two of three or fewer killed would leave a ring of one.
        grow_first "$kind" 4 || break ;;
    daemon_etcd)
        if [ "$ETCD3" = 1 ]; then
            skip "$kind" "3-member etcd"
            log "fault $kind: skipped (with --etcd3 one member down is no outage)"; continue
        fi ;;
    fd_exhaust)
        if [ ! -x /usr/bin/python3 ]; then
            skip "$kind" "no /usr/bin/python3"
            log "fault $kind: skipped (no /usr/bin/python3 for the flooder)"; continue
        fi ;;
    slow_disk)
        if [ -z "$CKPT_LOOP" ]; then
            skip "$kind" "${SLOW_NOTE:-no loop device}"
            log "fault $kind: skipped (${SLOW_NOTE:-no loop device})"; continue
        fi ;;
    esac
    pick "$r"; v=$REPLY
    pre=$(max_step); fms=$(now_ms)
    NFAULTS=$((NFAULTS + 1)); INJ[$kind]=$(( ${INJ[$kind]:-0} + 1 ))
    MARKS+=("$pre $kind")
    case "$kind" in
    kill_daemon)
        log "fault $kind: SIGKILL node$v's daemon (step $pre)"
        kill_reap "${DPID[$v]}"
        drop_live "$v"
        record "$kind" "$fms" "$v" "$pre"
        # The node is gone: its trainer goes too; a fresh node replaces it.
        kill_reap "${TPID[$v]}"
        start_node 1; log "  node$REPLY started as node$v's replacement"
        ;;
    kill_trainer)
        log "fault $kind: SIGKILL node$v's trainer (step $pre)"
        kill_reap "${TPID[$v]}"
        drop_live "$v"
        # First without a new trainer (the ring deadline, 10 s, and
        # suspicion should get the others going), then, like a supervisor,
        # with one.
        WITHIN=20 record "$kind" "$fms" "$v" "$pre"
        if [ $? = 2 ]; then
            # The job does not resume without that node's trainer: a hang
            # (not recovered); restart the trainer so the run goes on, and
            # report how long that took.
            HANGS=$((HANGS + 1))
            log "  $kind: HANG: no step in 20 s without a new trainer: restarting it"
            NEEDED_RESTART=$(( ${NEEDED_RESTART:-0} + 1 ))
            LIVE+=("$v"); start_trainer "$v"
            saved=${TIMES[$kind]:-}
            if record "$kind" "$fms" "" "$pre"; then
                NREC=$((NREC - 1)); REC[$kind]=$(( REC[$kind] - 1 ))
                RESTART_MS="${RESTART_MS:-} ${TIMES[$kind]##* }"
                TIMES[$kind]=$saved
            else
                break
            fi
        else
            LIVE+=("$v"); start_trainer "$v"
        fi
        log "  node$v's trainer restarted"
        ;;
    slow_trainer)
        # A trainer paused longer than the ring deadline (10 s) but not the
        # step timeout: an evaluation or a data-loader stall. Nobody may be
        # evicted; the job waits. Recovery is the first step after it.
        g0=$(gen_at "$fms")
        log "fault $kind: SIGSTOP node$v's trainer for 12 s (step $pre)"
        stop_for "${TPID[$v]}" 12000
        settle
        record "$kind" "$fms" "" "$pre"
        g1=$(gen_at "$(now_ms)")
        if [ -n "$g0" ] && [ -n "$g1" ] && [ "$g1" != "$g0" ]; then
            EVICTED+=("slow_trainer: the view changed ($g0 -> $g1) for a slow trainer")
            log "  $kind: EVICTION: generation $g0 -> $g1"
        fi
        ;;
    hung_trainer)
        # A trainer stopped past --step-timeout: its node steps out and the
        # others go on; resumed 5 s later, it rejoins.
        ms=$(( STEP_TIMEOUT_MS + 5000 ))
        log "fault $kind: SIGSTOP node$v's trainer for $((ms / 1000)) s (step $pre)"
        stop_for "${TPID[$v]}" "$ms"
        drop_live "$v"
        record "$kind" "$fms" "$v" "$pre"
        settle; LIVE+=("$v"); log "  node$v's trainer continued"
        ;;
    kill_adjacent)
        # Two ring neighbours SIGKILLed at once. Ring order: each live
        # daemon's index in the newest view it logged.
        mapfile -t ring < <(for k in "${LIVE[@]}"; do
            sed -n "s/.*mb node$k: view \([0-9]*\), [0-9]* members, index \([0-9]*\).*/\1 \2 $k/p" \
                "$T/ringd-$k.log" | tail -1
        done | sort -k1,1nr -k2,2n | awk 'NR == 1 { g = $1 } $1 == g { print $3 }')
        [ ${#ring[@]} -ge 2 ] || mapfile -t ring < <(printf '%s\n' "${LIVE[@]}" | sort -n)
        i=$(( r % ${#ring[@]} )); v=${ring[$i]}; w=${ring[$(( (i + 1) % ${#ring[@]} ))]}
        log "fault $kind: SIGKILL node$v's and node$w's daemons at once (step $pre)"
        kill -9 "${DPID[$v]}" "${DPID[$w]}" 2>/dev/null
        kill_reap "${DPID[$v]}"; kill_reap "${DPID[$w]}"
        drop_live "$v"; drop_live "$w"
        record "$kind" "$fms" "$v" "$pre"
        kill_reap "${TPID[$v]}"; kill_reap "${TPID[$w]}"
        start_node 1; log "  node$REPLY started as node$v's replacement"
        start_node 1; log "  node$REPLY started as node$w's replacement"
        ;;
    hang_daemon)
        log "fault $kind: SIGSTOP node$v's daemon for 3 s (step $pre)"
        stop_for "${DPID[$v]}" 3000
        drop_live "$v"
        record "$kind" "$fms" "$v" "$pre"
        settle; LIVE+=("$v"); log "  node$v's daemon continued"
        ;;
    link_down)
        log "fault $kind: $(veth "$v") (node$v) down for 4 s (step $pre)"
        LINK_DOWN+=("$(veth "$v")"); ip link set "$(veth "$v")" down
        later 4000 ip link set "$(veth "$v")" up
        drop_live "$v"
        record "$kind" "$fms" "$v" "$pre"
        settle; LIVE+=("$v"); log "  $(veth "$v") up"
        ;;
    packet_loss)
        ns="${PREFIX}h${HOSTOF[$v]}"; IPT_NS+=("$ns")
        log "fault $kind: 30% packet loss in and out of node$v for 4 s (step $pre)"
        ip netns exec "$ns" iptables -I INPUT -m statistic --mode random --probability 0.3 -j DROP
        ip netns exec "$ns" iptables -I OUTPUT -m statistic --mode random --probability 0.3 -j DROP
        later 4000 ip netns exec "$ns" iptables -F
        record "$kind" "$fms" "$v" "$pre"
        settle; log "  node$v's packet loss removed"
        ;;
    slow_link)
        d=$(veth "$v"); QDISC_DEV+=("$d")
        log "fault $kind: tbf 10mbit on $d (node$v) for 4 s (step $pre)"
        tc qdisc add dev "$d" root tbf rate 10mbit burst 32kbit latency 50ms
        later 4000 tc qdisc del dev "$d" root
        record "$kind" "$fms" "$v" "$pre"
        settle; log "  $d's qdisc removed"
        ;;
    job_restart)
        # The whole job dies at once (a scheduler kills the allocation)
        # and is started again on the same hosts, with fresh node ids
        # (the dead ones' keys linger in etcd until their leases expire);
        # it must resume from the newest complete checkpoint.
        old=("${LIVE[@]}")
        for k in "${old[@]}"; do kill -9 "${DPID[$k]}" "${TPID[$k]}" 2>/dev/null; done
        for k in "${old[@]}"; do
            for p in "${DPID[$k]}" "${TPID[$k]}"; do
                if [ -z "${STATUS[$p]:-}" ]; then
                    # One that had died on its own before is a crash.
                    wait "$p" 2>/dev/null; STATUS[$p]=$?
                    if [ "${STATUS[$p]}" = 137 ]; then
                        EXPECT[$p]=killed
                    else
                        EXPECT[$p]=crashed
                        CRASH_NOTES+=("${ROLE[$p]} (pid $p) had exited with status ${STATUS[$p]} before the job_restart")
                    fi
                fi
            done
        done
        # Nothing writes checkpoints now: the newest complete one is final.
        c=$(newest_ckpt)
        # What the restart will restore from, kept for a post-mortem.
        cp -a "$CKJOB" "$T/ckpt-at-restart.$NFAULTS" 2>/dev/null
        log "fault $kind: SIGKILLed every daemon and trainer ($(nodes "${old[@]}"); step $pre," \
            "newest complete checkpoint: step $c)"
        kpre=$(max_step); LIVE=(); new=()
        for k in "${old[@]}"; do start_node "${#old[@]}" "${HOSTOF[$k]}"; new+=("$REPLY"); done
        log "  restarted as $(nodes "${new[@]}") on the same hosts (last step before the kill: $kpre)"
        RESTARTS+=("$fms $c $kpre ${old[*]}:${new[*]}")
        record "$kind" "$fms" "" "$pre" "${new[*]}"
        ;;
    disk_full)
        # Fill the checkpoint tmpfs for 4 s: checkpoints fail, training
        # must not notice, and the complete ones must stay intact.
        before=$(ckpt_steps | tr '\n' ' ') blast=$(newest_ckpt)
        sums="$T/ckpt-sums.$NFAULTS"
        for st in $before; do
            ( cd "$CKDIR" && md5sum "chaos/step-$(printf %020d "$st")"/* )
        done >"$sums" 2>/dev/null
        log "fault $kind: checkpoint file system ($CKPT_TMPFS_SIZE $([ -n "$CKPT_LOOP" ] && echo ext4 || echo tmpfs)) filled for 4 s" \
            "(step $pre; complete checkpoints: ${before:-none})"
        dd if=/dev/zero of="$CKDIR/fill" bs=64k status=none 2>/dev/null
        log "  $(df -h --output=used,avail "$CKDIR" | tail -1 | awk '{ print "checkpoint file system: " $1 " used, " $2 " free" }')"
        # The fault lasts 4 s, whatever the recovery wait says: a helper
        # checks, while the disk is still full (nothing can be completed
        # or retired then), that the checkpoints complete before are there
        # byte for byte, and frees the space at fault + 4 s.
        dfbad="$T/df-bad.$NFAULTS"; : >"$dfbad"
        later 4000 df_check_and_free "$before" "$blast" "$sums" "$dfbad"
        record "$kind" "$fms" "" "$pre"
        settle
        nb=${#CKPT_BAD[@]}
        while IFS= read -r m; do CKPT_BAD+=("$m"); done <"$dfbad"
        DF_FREED=$(max_step)
        log "  space freed at step $DF_FREED; $(ckpt_failures) checkpoint failures logged so far;" \
            "older checkpoints ${before:+($before) }$( [ ${#CKPT_BAD[@]} = "$nb" ] && echo intact || echo DAMAGED)"
        ;;
    etcd_kill)
        # etcd is SIGKILLed and started again on its data dir 3 s later.
        # The daemons ride out the outage in their view (membership/
        # README.md), so the job should not stop at all: the measure is
        # the longest time without any completed step, from the kill
        # until a step after etcd's return, and a daemon that fenced
        # itself meanwhile fails the run.
        f0=$(cat "$T"/ringd-*.log | grep -c -- '-> FENCED')
        if [ "$ETCD3" = 1 ]; then
            m=$(( r % 3 )); ep=${ETCD_PIDS[m]}
            # Is it the raft leader? (member_id == leader in its status)
            role=$("${ETCD_CURL[@]}" -fs -m 1 -X POST "$ETCD_SCHEME://127.0.0.1:${EPS[m]}/v3/maintenance/status" -d '{}' 2>/dev/null |
                sed -n 's/.*"member_id":"\([0-9]*\)".*"leader":"\([0-9]*\)".*/\1 \2/p' |
                awk '{ print ($1 == $2 ? "the leader" : "a follower") }')
            log "fault $kind: SIGKILL etcd member $m of 3 (${role:-role unknown}, pid $ep), restarted on its data dir 3 s later (step $pre)"
            ETCD_OLD+=("$ep")
            { kill -9 "$ep"; wait "$ep"; } 2>/dev/null
            rd_restart_etcd_member chaos "$m" 3
            [ "$m" = 0 ] && ETCD_PID=${ETCD_PIDS[0]}
            rd_wait_etcd 30 "${EPS[m]}" ||
                die "etcd member $m did not come back within 30 s of etcd_kill (see $T/etcd-$m.log)"
        else
            log "fault $kind: SIGKILL etcd (pid $ETCD_PID), restarted on its data dir 3 s later (step $pre)"
            ETCD_OLD+=("$ETCD_PID")
            { kill -9 "$ETCD_PID"; wait "$ETCD_PID"; } 2>/dev/null
            rd_restart_etcd 3
            ETCD_PIDS=("$ETCD_PID")
            rd_wait_etcd 30 ||
                die "etcd did not come back within 30 s of etcd_kill (see $T/etcd.log)"
        fi
        back=$(now_ms)
        log "  etcd healthy again $((back - fms)) ms after the kill"
        s0=$(( $(max_step) + 2 )); res=; deadline=$(( $(date +%s) + RECOVER_S ))
        while res=$(first_after "$s0" "${LIVE[*]}" "$back"); [ -z "$res" ]; do
            [ "$(date +%s)" -lt "$deadline" ] || break
            check_alive; sleep 0.05
        done
        fenced=$(( $(cat "$T"/ringd-*.log | grep -c -- '-> FENCED') - f0 ))
        if [ -n "$res" ]; then
            gap=$(cat "$T"/hash-*.log | awk -v a="$fms" -v b="${res#* }" '$1 == "step" && $12 >= a && $12 <= b { print $12 }' |
                sort -n | awk -v a="$fms" 'BEGIN { p = a; g = 0 } { if ($1 - p > g) g = $1 - p; p = $1 } END { print g }')
            NREC=$((NREC + 1)); REC[$kind]=$(( ${REC[$kind]:-0} + 1 ))
            TIMES[$kind]="${TIMES[$kind]:-} $gap"
            log "  $kind: recovered: step ${res% *} completed $(( ${res#* } - back )) ms after etcd was back;" \
                "the longest time without a step was $gap ms; $fenced daemon(s) fenced themselves"
            [ "$fenced" = 0 ] || ETCD_FENCED="${ETCD_FENCED:-} $fenced"
        else
            HANGS=$((HANGS + 1)); log "  $kind: HANG: no step within ${RECOVER_S}s of etcd's return"
        fi
        ;;
    trainer_close)
        # The trainer drops its connection (no BYE) in the middle of a
        # step (SIGUSR1) or between two steps (SIGUSR2) and reconnects
        # at once (examples/trainer.c). The job must go on.
        sig=USR1; where="in a step"
        [ $((r % 2)) = 1 ] && { sig=USR2; where="between two steps"; }
        g0=$(gen_at "$fms"); n0=$(grep -c '^connection closed' "$T/trainer-$v.log")
        log "fault $kind: node$v's trainer closes its connection $where and reconnects (SIG$sig; step $pre)"
        kill -"$sig" "${TPID[$v]}"
        tc_wait "$v" "$fms" "$g0" "$n0"
        ;;
    daemon_etcd)
        # A daemon SIGKILLed together with etcd, etcd back 4 s later. The
        # job must resume within 1 s of etcd's return, in a view without
        # the dead node: a restarted etcd renews every lease to its full
        # TTL, the dead node's included, and that key is no member.
        g0=$(gen_at "$fms")
        log "fault $kind: SIGKILL node$v's daemon and etcd (pid $ETCD_PID) at once;" \
            "etcd restarted on its data dir 4 s later (step $pre)"
        ETCD_OLD+=("$ETCD_PID")
        kill -9 "${DPID[$v]}" "$ETCD_PID" 2>/dev/null
        kill_reap "${DPID[$v]}"; { wait "$ETCD_PID"; } 2>/dev/null
        drop_live "$v"
        rd_restart_etcd 4
        ETCD_PIDS=("$ETCD_PID")
        rd_wait_etcd 30 ||
            die "etcd did not come back within 30 s of daemon_etcd (see $T/etcd.log)"
        de_wait "$v" "$fms" "$g0"
        kill_reap "${TPID[$v]}"
        start_node 1; log "  node$REPLY started as node$v's replacement"
        ;;
    fd_exhaust)
        # A local process connects to node v's socket over and over for
        # 4 s and holds every connection: the daemon (ulimit -n NOFILE)
        # runs out of descriptors. Its trainer must keep stepping in the
        # same view, the daemon log the condition rate-limited, and serve
        # a new client once the flood is over.
        g0=$(gen_at "$fms"); l0=$(wc -l <"$T/ringd-$v.log")
        log "fault $kind: flooding node$v's socket with connections for 4 s" \
            "(its daemon: ulimit -n $NOFILE; step $pre)"
        /usr/bin/python3 chaos/fd-flood.py "$T/node$v.sock" 4 \
            >"$T/flood-$NFAULTS.log" 2>&1 &
        HELPER=$!; HELPERS+=($!)
        settle; fend=$(now_ms)
        fd_check "$v" "$fms" "$fend" "$g0" "$l0"
        ;;
    slow_disk)
        # The checkpoint disk (ext4 on a loop device) throttled to 4 KiB/s
        # and 2 I/Os a second, reads and writes, for 4 s. Checkpoints are
        # skipped or late (counted); training must not notice: the row is
        # the longest time without a step while the disk is slow.
        g0=$(gen_at "$fms"); sk0=$(ckpt_skips); blast=$(newest_ckpt)
        log "fault $kind: checkpoint disk $CKPT_LOOP throttled to 4 KiB/s," \
            "2 IOPS for 4 s (step $pre; newest complete checkpoint: $blast)"
        disk_throttle 4096 2 || die "cannot throttle $CKPT_LOOP"
        later 4000 disk_throttle 0
        settle
        sd_check "$fms" "$g0" "$sk0" "$blast"
        ;;
    daemon_restart)
        # systemctl reload ringd on one node (a package upgrade): its
        # trainer waits for the new daemon, which rejoins as a new
        # incarnation; the others train on. The time: until the node's
        # own trainer completes a step in a later generation.
        log "fault $kind: SIGUSR2 node$v's daemon, started again 1 s after its exit (step $pre)"
        restart_daemon "$v"
        record "$kind" "$fms" "" "$pre" "$v" && restart_gap "$v" "$fms"
        ;;
    rolling_restart)
        # An upgrade rolled over every live node, one at a time, as
        # daemon/README.md tells it: ringctl generation, the reload,
        # ringctl wait-member before the next. No trainer may die, the
        # job must not stop; each node's time back is recorded.
        log "fault $kind: every node's daemon restarted in turn (${LIVE[*]}; step $pre)"
        nback=0
        for k in "${LIVE[@]}"; do
            fms=$(now_ms); pre=$(max_step)
            g=$("$B/ringctl" --etcd "$ETCD_URL" "${ETCD_SEC[@]}" --job chaos generation 2>"$T/roll-$k.log") ||
                { RESTART_BAD+=("ringctl generation failed: $(cat "$T/roll-$k.log")"); break; }
            restart_daemon "$k"
            if ! "$B/ringctl" --etcd "$ETCD_URL" "${ETCD_SEC[@]}" --job chaos --timeout "$RECOVER_S" \
                    wait-member "node$k" "$g" >>"$T/roll-$k.log" 2>&1; then
                RESTART_BAD+=("node$k not back after its restart: $(tail -1 "$T/roll-$k.log")")
                break
            fi
            log "  node$k: $(head -1 "$T/roll-$k.log" | cut -c1-120)"
            record "$kind" "$fms" "" "$pre" "$k" || break
            restart_gap "$k" "$fms"
            nback=$((nback + 1))
        done
        # One fault, one recovery (each node's time is in TIMES): the
        # roll is recovered when every node came back.
        if [ "$nback" -gt 0 ]; then
            NREC=$((NREC - nback)); REC[$kind]=$(( REC[$kind] - nback ))
            if [ "$nback" = "${#LIVE[@]}" ]; then
                NREC=$((NREC + 1)); REC[$kind]=$(( REC[$kind] + 1 ))
            fi
        fi
        ;;
    scale_up)
        start_node 1; n=$REPLY
        log "fault $kind: node$n started (step $pre)"
        record "$kind" "$fms" "" "$pre" "$n"
        ;;
    scale_down)
        log "fault $kind: ringctl drain node$v (step $pre)"
        "$B/ringctl" --etcd "$ETCD_URL" "${ETCD_SEC[@]}" --job chaos drain "node$v" >"$T/drain-$v.log" 2>&1 ||
            die "ringctl drain node$v failed: $(cat "$T/drain-$v.log")"
        drop_live "$v"
        EXPECT[${DPID[$v]}]=drained; EXPECT[${TPID[$v]}]=drained
        record "$kind" "$fms" "$v" "$pre"
        for _ in $(seq 300); do kill -0 "${DPID[$v]}" 2>/dev/null || break; sleep 0.05; done
        kill -0 "${DPID[$v]}" 2>/dev/null && die "node$v's daemon did not exit after its drain"
        ;;
    esac
    [ "$HANGS" -gt "${NEEDED_RESTART:-0}" ] && break
done

# ---- the end of the job ---------------------------------------------------------
log "faults done; waiting for step $STEPS"
# Until the last step, or a hang: no new step for RECOVER_S.
last=-2; since=$(date +%s)
while m=$(max_step); [ "$m" -lt $((STEPS - 1)) ]; do
    [ "$m" != "$last" ] && { last=$m; since=$(date +%s); }
    if [ $(( $(date +%s) - since )) -ge "$RECOVER_S" ]; then
        HANGS=$((HANGS + 1)); log "HANG: the job stopped at step $m"; break
    fi
    check_alive
    sleep 0.2
done
deadline=$(( $(date +%s) + 60 ))
for k in "${LIVE[@]}"; do
    while running_snapshot; is_running "${TPID[$k]}" && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.1; done
done
END_MS=$(now_ms)
running_snapshot; reap_exited
# Stop the daemons gracefully (SIGTERM drains, exit 0), then etcd.
for k in "${LIVE[@]}"; do is_running "${DPID[$k]}" && kill -TERM "${DPID[$k]}" 2>/dev/null; done
for k in "${LIVE[@]}"; do
    for _ in $(seq 300); do running_snapshot; is_running "${DPID[$k]}" || break; sleep 0.05; done
done
running_snapshot; reap_exited

# ---- the newest checkpoint restores (chaos/ckpt-check.sh) --------------------------
# shellcheck source=ckpt-check.sh disable=SC1091
. chaos/ckpt-check.sh

# ---- checks ------------------------------------------------------------------------
FAIL=()
for m in "${CKPT_BAD[@]}"; do FAIL+=("$m"); done
for m in "${EVICTED[@]}"; do FAIL+=("$m"); done
for m in "${OTHER_BAD[@]}"; do FAIL+=("$m"); done
for m in "${CRASH_NOTES[@]}"; do FAIL+=("$m"); done
for m in "${RESTART_BAD[@]}"; do FAIL+=("$m"); done
CRASHES=${#CRASH_NOTES[@]}
[ "${FAIL_EARLY:-0}" = 0 ] || FAIL+=("faults skipped because the job neared its end")
. chaos/run-check.sh
[ "$REPLAY_BAD" = 0 ] || FAIL+=("$REPLAY_BAD steps replayed after a job restart with another hash than before the kill (same world size): $(head -3 "$T/replay.txt" | tr '\n' ';')")
[ "$MAXS" -ge $((STEPS - 1)) ] || FAIL+=("the job reached step $((MAXS + 1)), not $STEPS")
[ "$LOST" = 0 ] || FAIL+=("$LOST steps logged by no trainer")
# With --etcd3 a killed member can hold the keepalives of some daemons
# until etcd's fail-over moves them, past their TTL: etcd itself expires
# those leases, so the fence is right there and only reported.
[ -z "${ETCD_FENCED:-}" ] || [ "$ETCD3" = 1 ] ||
    FAIL+=("daemons fenced themselves through an etcd outage with every member healthy (per kill:$ETCD_FENCED)")
[ "$STALE" = 0 ] || [ "$STRICT" = 0 ] ||
    FAIL+=("$STALE steps completed by an evicted replica with another hash")
[ "$DUP" = 0 ] || FAIL+=("$DUP steps whose hash differs between replicas")
[ "$HANGS" = 0 ] || FAIL+=("$HANGS hangs")
[ "$NREC" = "$NFAULTS" ] || FAIL+=("$((NFAULTS - NREC)) faults not recovered")
# Accuracy: the final line of every trainer that finished.
ACCS=$(for k in "${LIVE[@]}"; do cat "$T/trainer-$k.log"; done | sed -n 's/^final: test_accuracy \([0-9.]*\).*/\1/p' | sort -u | tr '\n' ' ')
[ -n "$ACCS" ] || FAIL+=("no trainer printed a final accuracy")
for a in $ACCS; do
    awk -v a="$a" -v r="$REF_ACC" -v t=$TOL 'BEGIN { d = a - r; if (d < 0) d = -d; exit !(d <= t) }' ||
        FAIL+=("final accuracy $a is not within $TOL of the reference $REF_ACC")
done

# ---- loss plot (chaos/plot.sh) ------------------------------------------------------
# shellcheck source=plot.sh disable=SC1091
. chaos/plot.sh

# ---- report --------------------------------------------------------------------------
. chaos/report.sh
echo
cat "$T/report.txt"
mkdir -p "$OUTDIR" 2>/dev/null && cp "$T/report.txt" "$OUTDIR/chaos-$SEED.txt" 2>/dev/null
[ ${#FAIL[@]} = 0 ]
