# shellcheck shell=bash
# chaos/cluster.sh - shared by examples/demo.sh and chaos/chaos.sh (sourced).
#
# Expects: T (temp dir), NETNS (1: nodes are namespaces PREFIXh<i>),
# PREFIX, SUBNET, the array PIDS (everything started, killed by the
# caller's cleanup) and a die() function.

# A port p with p and p+1 free on this machine (etcd's client and peer):
# no socket of any state on either (a connection's local port blocks a
# bind as much as a listener does). Free now is no promise: rd_start_etcd
# retries when a port was taken before etcd bound it.
rd_free_port() {
    local p used
    while :; do
        p=$((20000 + RANDOM % 20000))
        used=$(ss -tanH 2>/dev/null | awk '{ print $4 }')
        grep -qE ":($p|$((p + 1)))\$" <<<"$used" || { echo "$p"; return; }
    done
}

# etcd security: by default etcd serves clients over TLS (a CA and a
# server certificate made here with openssl) with password auth on, and
# the daemons and ringctl get ETCD_SEC (--etcd-ca, --etcd-user,
# --etcd-password-file). The server asks for no client certificate:
# etcd 3.4's JSON gateway refuses those once auth is on. ETCD_SECURE=0
# runs plain http without auth. Peer traffic stays plain http on loopback.
ETCD_SECURE=${ETCD_SECURE:-1}
ETCD_SEC=()
ETCD_SCHEME=http
ETCD_TLS_ARGS=()
ETCD_CURL=(curl)
rd_etcd_pki() {
    [ "$ETCD_SECURE" = 1 ] || return 0
    local d="$T/pki" san="IP:127.0.0.1"
    [ "$NETNS" = 1 ] && san="$san,IP:$SUBNET.1"
    mkdir -p "$d" && chmod 700 "$d"
    {
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=ringd-test-ca \
            -keyout "$d/ca.key" -out "$d/ca.crt" &&
        openssl req -newkey rsa:2048 -nodes -subj /CN=etcd \
            -keyout "$d/etcd.key" -out "$d/etcd.csr" &&
        printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" >"$d/ext.cnf" &&
        openssl x509 -req -in "$d/etcd.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" \
            -CAcreateserial -days 2 -extfile "$d/ext.cnf" -out "$d/etcd.crt"
    } >"$d/openssl.log" 2>&1 || die "openssl failed (see $d/openssl.log)"
    # Random passwords, in files only the caller can read.
    (umask 077
     openssl rand -hex 16 >"$d/root.pw" && openssl rand -hex 16 >"$d/ringd.pw") ||
        die "openssl rand failed"
    ETCD_SCHEME=https
    ETCD_TLS_ARGS=(--cert-file "$d/etcd.crt" --key-file "$d/etcd.key")
    ETCD_CURL=(curl --cacert "$d/ca.crt")
    ETCD_SEC=(--etcd-ca "$d/ca.crt" --etcd-user ringd --etcd-password-file "$d/ringd.pw")
}

# Users once the cluster is up: root (for etcdctl) and ringd, whose role
# reads and writes /ringd/ only; then auth on. $1: a client URL.
rd_etcd_auth() {
    [ "$ETCD_SECURE" = 1 ] || return 0
    local d="$T/pki" c
    c=(env ETCDCTL_API=3 etcdctl --endpoints "$1" --cacert "$d/ca.crt")
    {
        "${c[@]}" user add root --interactive=false <"$d/root.pw" &&
        "${c[@]}" user add ringd --interactive=false <"$d/ringd.pw" &&
        "${c[@]}" role add ringd &&
        "${c[@]}" role grant-permission ringd --prefix=true readwrite /ringd/ &&
        "${c[@]}" user grant-role ringd ringd &&
        "${c[@]}" auth enable
    } >"$T/etcd-auth.log" 2>&1 || die "etcd auth setup failed (see $T/etcd-auth.log)"
}

# Start etcd named $1 on loopback (and the bridge, with namespaces), wait
# for /health (bounded). Sets EP, ETCD_CMD (the command line, for a
# restart), ETCD_PID and ETCD_URL (the address the nodes use). A port
# found free can be taken before etcd binds it (by another program, or as
# the local port of some connection: the range overlaps the ephemeral
# ports): etcd then exits with "address already in use", and it is tried
# again on other ports, RD_ETCD_TRIES times at most.
RD_ETCD_TRIES=${RD_ETCD_TRIES:-5}
rd_etcd_cmd() { # rd_etcd_cmd NAME: ETCD_CMD for a single member on EP
    local name=$1 s=$ETCD_SCHEME listen
    listen="$s://127.0.0.1:$EP"
    [ "$NETNS" = 1 ] && listen="$listen,$s://$SUBNET.1:$EP"
    ETCD_CMD=(etcd --name "$name" --data-dir "$T/etcd" --listen-client-urls "$listen"
        --advertise-client-urls "$s://127.0.0.1:$EP"
        --listen-peer-urls "http://127.0.0.1:$((EP + 1))"
        --initial-advertise-peer-urls "http://127.0.0.1:$((EP + 1))"
        --initial-cluster "$name=http://127.0.0.1:$((EP + 1))"
        "${ETCD_TLS_ARGS[@]}" --log-level warn --logger zap)
}
rd_start_etcd() {
    local name=$1 s try
    rd_etcd_pki
    s=$ETCD_SCHEME
    for ((try = 1; ; try++)); do
        EP=$(rd_free_port)
        rd_etcd_cmd "$name"
        rm -rf "$T/etcd"
        "${ETCD_CMD[@]}" >"$T/etcd.log" 2>&1 &
        ETCD_PID=$!
        PIDS+=("$ETCD_PID")
        rd_wait_etcd 10 "$EP" "$ETCD_PID" && break
        rd_etcd_port_taken "$T/etcd.log" "$ETCD_PID" && [ "$try" -lt "$RD_ETCD_TRIES" ] ||
            die "etcd did not come up (see $T/etcd.log)"
        echo "etcd: ports $EP/$((EP + 1)) were taken (try $try of" \
             "$RD_ETCD_TRIES): $(grep -m1 -o '[^"]*address already in use' "$T/etcd.log")" >&2
    done
    rd_etcd_auth "$s://127.0.0.1:$EP"
    ETCD_URL="$s://127.0.0.1:$EP"
    [ "$NETNS" = 1 ] && ETCD_URL="$s://$SUBNET.1:$EP"
    return 0
}

# 0 when the etcd of pid $2 has exited because a port in its log $1 was in
# use (then reaped), 1 otherwise (it is left running).
rd_etcd_port_taken() {
    kill -0 "$2" 2>/dev/null && return 1
    wait "$2" 2>/dev/null
    grep -q 'address already in use' "$1"
}

# Wait up to $1 seconds for etcd's /health on port $2 (default EP): 0 once
# healthy (a member of a cluster is healthy once the cluster has a leader);
# 1 on the timeout, or at once when the process of pid $3 (if given) has
# exited.
rd_wait_etcd() {
    local deadline=$(( $(date +%s%3N) + $1 * 1000 )) port=${2:-$EP}
    while [ "$(date +%s%3N)" -lt "$deadline" ]; do
        "${ETCD_CURL[@]}" -fs -m 1 "$ETCD_SCHEME://127.0.0.1:$port/health" 2>/dev/null |
            grep -q true && return 0
        [ -z "${3:-}" ] || kill -0 "$3" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# Start etcd again with the same command line (same data dir and ports)
# after $1 seconds, in the background: ETCD_PID is then etcd's own pid
# (the subshell execs it). The caller waits with rd_wait_etcd.
rd_restart_etcd() {
    ( sleep "$1"; exec "${ETCD_CMD[@]}" ) >>"$T/etcd.log" 2>&1 &
    ETCD_PID=$!
    PIDS+=("$ETCD_PID")
    return 0
}

# A 3-member etcd cluster named $1 ($1-0..2) on loopback, each member's
# client port also on the bridge with namespaces. Sets EPS (the members'
# client ports; peer port = client + 1), ETCD_PIDS, ETCD_URL (the three
# client URLs, comma-separated: the nodes fail over in order), and EP /
# ETCD_PID as member 0's.
rd_etcd_member() { # rd_etcd_member NAME I: ETCD_CMD for member I
    local name=$1 i=$2 cluster='' j listen
    for j in 0 1 2; do
        cluster+="${cluster:+,}$name-$j=http://127.0.0.1:$((EPS[j] + 1))"
    done
    local s=$ETCD_SCHEME
    listen="$s://127.0.0.1:${EPS[i]}"
    [ "$NETNS" = 1 ] && listen="$listen,$s://$SUBNET.1:${EPS[i]}"
    ETCD_CMD=(etcd --name "$name-$i" --data-dir "$T/etcd-$i"
        --listen-client-urls "$listen"
        --advertise-client-urls "$s://127.0.0.1:${EPS[i]}"
        --listen-peer-urls "http://127.0.0.1:$((EPS[i] + 1))"
        --initial-advertise-peer-urls "http://127.0.0.1:$((EPS[i] + 1))"
        --initial-cluster "$cluster" --initial-cluster-state new
        --initial-cluster-token "$name-$$" "${ETCD_TLS_ARGS[@]}"
        --log-level warn --logger zap)
}
rd_start_etcd3() {
    local name=$1 i p j ok try taken
    rd_etcd_pki
    for ((try = 1; ; try++)); do
        EPS=()
        while [ ${#EPS[@]} -lt 3 ]; do
            p=$(rd_free_port); ok=1
            for j in "${EPS[@]}"; do [ $((p - j)) -ge -1 ] && [ $((p - j)) -le 1 ] && ok=0; done
            [ $ok = 1 ] && EPS+=("$p")
        done
        ETCD_PIDS=()
        for i in 0 1 2; do
            rd_etcd_member "$name" "$i"
            rm -rf "$T/etcd-$i"
            "${ETCD_CMD[@]}" >"$T/etcd-$i.log" 2>&1 &
            ETCD_PIDS[i]=$!
            PIDS+=("$!")
        done
        taken=
        for i in 0 1 2; do
            rd_wait_etcd 20 "${EPS[i]}" "${ETCD_PIDS[i]}" && continue
            rd_etcd_port_taken "$T/etcd-$i.log" "${ETCD_PIDS[i]}" && taken=$i && break
            die "etcd member $i did not come up (see $T/etcd-$i.log)"
        done
        [ -z "$taken" ] && break
        [ "$try" -lt "$RD_ETCD_TRIES" ] ||
            die "etcd member $taken did not come up (see $T/etcd-$taken.log)"
        echo "etcd: member $taken's ports ${EPS[taken]}/$((EPS[taken] + 1))" \
             "were taken (try $try of $RD_ETCD_TRIES): the cluster again on" \
             "other ports" >&2
        # The cluster's URLs name every member's ports: all start again.
        for i in 0 1 2; do
            [ "$i" = "$taken" ] && continue
            kill -9 "${ETCD_PIDS[i]}" 2>/dev/null; wait "${ETCD_PIDS[i]}" 2>/dev/null
        done
    done
    rd_etcd_auth "$ETCD_SCHEME://127.0.0.1:${EPS[0]}"
    ETCD_URL=
    for i in 0 1 2; do
        ETCD_URL+="${ETCD_URL:+,}$ETCD_SCHEME://$([ "$NETNS" = 1 ] && echo "$SUBNET.1" || echo 127.0.0.1):${EPS[i]}"
    done
    EP=${EPS[0]}
    ETCD_PID=${ETCD_PIDS[0]}
    return 0
}

# Start member $2 of the 3-member cluster $1 again (same data dir and
# ports) after $3 seconds, in the background; ETCD_PIDS[$2] is etcd's pid.
rd_restart_etcd_member() {
    rd_etcd_member "$1" "$2"
    ( sleep "$3"; exec "${ETCD_CMD[@]}" ) >>"$T/etcd-$2.log" 2>&1 &
    ETCD_PIDS[$2]=$!
    PIDS+=("$!")
    return 0
}

# rd_stop_until PID END_MS LOG: SIGSTOP PID now and SIGCONT it at END_MS
# (epoch ms), from a background helper whose pid is left in HELPER.
# Nothing else may end the stop early: the kernel itself sends SIGHUP and
# SIGCONT to a process group with a stopped member when the group becomes
# orphaned (the shell that started a harness in the background exits),
# and that once turned a hung trainer of chaos.sh into a 12.8 s pause
# that no step timeout saw. The helper looks every 20 ms and stops it
# again, appending "PID MS STATE" to LOG each time (and "PID MS" to
# LOG.seen each time it finds it stopped after running).
rd_stop_until() {
    local pid=$1 end=$2 log=$3
    kill -STOP "$pid"
    (
        # kill returns before the stop takes effect: only a process seen
        # stopped and then running again was continued by someone.
        local t line st seen=0
        while t=${EPOCHREALTIME/./}; [ "${t:0:13}" -lt "$end" ]; do
            read -r line <"/proc/$pid/stat" 2>/dev/null || break
            st=${line##*) }; st=${st%% *}
            if [ "$st" = T ] || [ "$st" = t ]; then
                [ "$seen" = 1 ] || echo "$pid ${t:0:13}" >>"$log.seen"
                seen=1
            else
                kill -STOP "$pid"
                [ "$seen" = 1 ] && echo "$pid ${t:0:13} $st" >>"$log"
                seen=0
            fi
            sleep 0.02
        done
        kill -CONT "$pid"
    ) &
    HELPER=$!
}

# The command prefix that runs a program on host $1, in HOST_CMD. Every
# part execs the next, so $! is the program's own pid (a shell function
# would leave a subshell in between, and killing it would miss the
# program).
rd_host_cmd() {
    HOST_CMD=(env)
    [ "$NETNS" = 1 ] && HOST_CMD=(ip netns exec "${PREFIX}h$1" env)
    return 0
}

# Node $1's daemon for job $3 with --min-nodes $2, one trainer, socket
# $T/node$1.sock (program $B/ringd, log $T/ringd-$1.log); waits (bounded)
# for the socket. Sets DPID[$1] (the caller declares DPID associative) and
# leaves HOST_CMD set for node $1's trainer.
rd_start_daemon() {
    local i=$1 min=$2 job=$3 dev=lo
    [ "$NETNS" = 1 ] && dev=eth0
    rd_host_cmd "$i"
    "${HOST_CMD[@]}" UCX_NET_DEVICES=$dev UCX_TCP_CM_REUSEADDR=y \
        UCX_WARN_UNUSED_ENV_VARS=n "$B/ringd" --etcd "$ETCD_URL" \
        "${ETCD_SEC[@]}" --job "$job" --node-id "node$i" --host "host$i" \
        --socket "$T/node$i.sock" --trainers 1 --lease-ttl 2 \
        --min-nodes "$min" --metrics off >"$T/ringd-$i.log" 2>&1 &
    DPID[$i]=$!
    PIDS+=($!)
    for _ in $(seq 200); do [ -S "$T/node$i.sock" ] && break; sleep 0.02; done
    [ -S "$T/node$i.sock" ] || die "node$i's daemon did not start:
$(tail -5 "$T/ringd-$i.log")"
}

# The EXIT trap of the demos: kill (by pid) what is in PIDS and still one
# of our running children (bash's job table: the pid of one that exited
# earlier may belong to another process by now), reap them, remove the
# $1 namespaces, and T unless DEMO_KEEP=1 ($2 names the demo).
rd_cleanup() {
    local run p
    run=" $(jobs -rp | tr '\n' ' ') "
    for p in "${PIDS[@]}"; do
        [[ "$run" == *" $p "* ]] && kill -9 "$p" 2>/dev/null
    done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    [ "$NETNS" = 1 ] && chaos/netns.sh down "$PREFIX" "$1"
    if [ "${DEMO_KEEP:-0}" = 1 ]; then echo "$2: kept $T"; else rm -rf "$T"; fi
}

# Recovery from a step log $1 (lines "step S gen G rank R world W hash H
# t_ms T ...") and the kill's time $2 (epoch ms): GEN0 and STEP0, the
# newest generation and step logged before the kill; FIRST_STEP,
# FIRST_GEN and FIRST_MS, the first step after it of a later generation
# (a step logged just after the kill in the old generation was reduced
# with the dead node's data: it says nothing about recovery); and
# KILL_TO_STEP, FIRST_MS - $2 in whole ms, or "none".
rd_kill_to_step() {
    read -r GEN0 STEP0 < <(awk -v k="$2" '$1 == "step" && $12 + 0 <= k {
        if ($4 + 0 >= g) { g = $4 + 0; s = $2 } } END { print g + 0, s + 0 }' \
        "$1")
    FIRST_STEP= FIRST_GEN= FIRST_MS=
    read -r FIRST_STEP FIRST_GEN FIRST_MS < <(awk -v k="$2" -v g="$GEN0" \
        '$1 == "step" && $12 + 0 > k && $4 + 0 > g {
            print $2, $4, $12; exit }' "$1")
    KILL_TO_STEP=none
    [ -n "${FIRST_MS:-}" ] && KILL_TO_STEP=$(awk -v a="$FIRST_MS" -v k="$2" \
        'BEGIN { printf "%d", a - k }')
    return 0
}

# The view changes and re-formed rings in daemon log $1, one
# "EPOCH_MS what" line each, for a timeline.
rd_ring_events() {
    local ts rest v
    grep -h "ring backend: view" "$1" | while read -r ts rest; do
        v=$(echo "$rest" | sed -n 's/.*ring backend: \(view .*\)/\1/p')
        echo "$(date -d "$ts" +%s%3N) etcd $v"
    done
    grep -h "syncing -> ready" "$1" | while read -r ts rest; do
        echo "$(date -d "$ts" +%s%3N) ring re-formed, state agreed"
    done
}

# rd_timeline WHAT JOINER_LOG DONE [EXTRA]: the demos' timeline, node1's
# view, with EXTRA's "EPOCH_MS what" lines among its events, from
# T0, KILL_MS/KILL_STEP, JOIN_MS, END_MS, the FIRST_*/GEN0/STEP0 that
# rd_kill_to_step set and node1's ring events; then the recovery figure and
# the joiner's first step from its step log.
rd_timeline() {
    local what=$1 jlog=$2 done_msg=$3 extra=${4:-} joined
    rel() { awk -v t="$1" -v z="$T0" 'BEGIN { printf "%+8.2fs", (t - z) / 1000 }'; }
    echo
    echo "timeline (node1's view; times from the start):"
    {
        echo "$T0 job started: 4 nodes, $what"
        echo "$KILL_MS SIGKILL node2's daemon (node1 at step $KILL_STEP)"
        echo "$JOIN_MS node5 started"
        echo "$END_MS $done_msg"
        [ -n "${FIRST_MS:-}" ] && echo "${FIRST_MS%.*} first step of" \
            "generation $FIRST_GEN after the kill: step $FIRST_STEP (the" \
            "last before it: generation $GEN0, step $STEP0)"
        rd_ring_events "$T/ringd-1.log"
        [ -n "$extra" ] && cat "$extra"
    } | sort -n | while read -r t msg; do echo "  $(rel "$t")  $msg"; done
    joined=$(awk '$1 == "step" { print $2; exit }' "$jlog" 2>/dev/null)
    echo "  kill to the first step of a later generation (${FIRST_GEN:-none}," \
         "step ${FIRST_STEP:-none}): ${KILL_TO_STEP} ms"
    echo "  node5's first step: step ${joined:-none}" \
         "($(grep -c . "$jlog" 2>/dev/null || echo 0) steps)"
}
