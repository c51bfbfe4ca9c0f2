# chaos/report.sh - sourced by chaos.sh last: the report (one row per
# fault kind, the checkpoint, restart, accuracy and step lines, every
# violation, the closing key=value lines) written to $T/report.txt.
# shellcheck shell=bash
stats() { # median p95 max of the numbers in $1
    echo "$1" | tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 }
        END { if (NR == 0) { print "- - -"; exit }
              m = v[int((NR + 1) / 2)]; p = v[int(NR * 0.95 + 0.999)]; if (p == "") p = v[NR]
              print m, p, v[NR] }'
}
{
echo "chaos report: seed $SEED, $NODES nodes, $STEPS steps," \
     "$(( (END_MS - T0) / 1000 )) s, $([ $NETNS = 1 ] && echo namespaces || echo loopback)"
printf '  %-13s %8s %9s %10s %8s %8s  %s\n' kind injected recovered median_ms p95_ms max_ms skipped
for kind in "${ALL_KINDS[@]}"; do
    [ -n "${INJ[$kind]:-}${SKIP[$kind]:-}" ] || continue
    read -r med p95 mx < <(stats "${TIMES[$kind]:-}")
    printf '  %-13s %8s %9s %10s %8s %8s  %s\n' "$kind" "${INJ[$kind]:-0}" \
        "${REC[$kind]:-0}" "$med" "$p95" "$mx" "${SKIP[$kind]:-}"
done
echo "  (time: from the fault to the first step completed on another node" \
     "in a later view generation than any step logged before the fault" \
     "(kill, hang, link_down, scale_down), or for the others the first" \
     "one that was not in flight at the fault, from the hash logs' t_ms;" \
     "daemon_restart, rolling_restart: until the restarted node's own" \
     "trainer completes a step in a later generation;" \
     "job_restart: to the restarted job's first step; etcd_kill: the" \
     "longest time without a step until one after etcd's return)"
[ -n "${NEEDED_RESTART:-}" ] && echo "  kill_trainer: $NEEDED_RESTART of ${INJ[kill_trainer]}" \
    "made no progress in 20 s without the node's trainer (counted as hangs," \
    "not recovered); with a new trainer the job resumed after:${RESTART_MS:- never} ms"
for m in "${RESTART_LINES[@]}"; do echo "  $m"; done
if [ ${#RESTART_GAPS[@]} -gt 0 ]; then
    read -r gmed _ gmax < <(stats "${RESTART_GAPS[*]}")
    echo "  daemon restarts: the other nodes' longest time without a step while" \
         "a node restarted: median $gmed ms, max $gmax ms (${#RESTART_GAPS[@]} restarts)"
fi
[ -n "${INJ[trainer_close]:-}" ] && echo "  trainer_close: ${TC_NEWGEN:-0} with a" \
    "view change (the row: to the first step of the new generation)," \
    "${TC_SAMEGEN:-0} without (to the first step not in flight at the fault)"
[ "$(stray_conts)" = 0 ] || echo "  stops: $(stray_conts) SIGCONT(s) from" \
    "elsewhere ended a fault's SIGSTOP early (the kernel's, when the process" \
    "group that started the harness was orphaned, or anyone's): stopped again"
for kind in "${!GREW[@]}"; do
    echo "  $kind: too few nodes for it: ${GREW[$kind]} node(s)" \
         "started first, each awaited to its first step (not faults)"
done
[ -n "${INJ[daemon_etcd]:-}" ] && echo "  daemon_etcd: the row is from etcd's" \
    "return (healthy) to the survivors' first step in a new view"
[ -n "${INJ[fd_exhaust]:-}" ] && echo "  fd_exhaust: the row is the longest time" \
    "without a step of the flooded node's trainer during the flood" \
    "(daemons at ulimit -n $NOFILE)"
[ -n "${INJ[slow_disk]:-}" ] && echo "  slow_disk: the row is the longest time" \
    "without a step while the disk was slow; ${SD_SKIPS:-0} checkpoints" \
    "skipped meanwhile (the previous one still being written)"
[ -n "$CKPT_LINE" ] && echo "  checkpoints: $CKPT_LINE"
[ -n "${ETCD_FENCED:-}" ] && echo "  etcd_kill: daemons fenced themselves (lease not renewed within" \
    "the TTL), per kill that fenced any:$ETCD_FENCED (the row above: the longest time without a step)"
echo "  final accuracy: ${ACCS:-none}(reference $REF_ACC, tolerance $TOL)"
echo "  steps: reached $((MAXS + 1)) of $STEPS; lost $LOST; hash mismatches $DUP;" \
     "unexpected exits $CRASHES"
if [ "$STALE" != 0 ]; then
    echo "  $([ "$STRICT" = 0 ] && echo "WARNING (CHAOS_STRICT=0)" || echo FAILED):" \
         "$STALE step(s) completed by an evicted replica whose hash" \
         "differs from the job's (the replica was overwritten when it" \
         "rejoined; a daemon gap, see chaos/README.md):"
    sed 's/^/    /' "$T/stale.txt"
fi
[ -n "$PLOT" ] && echo "  loss plot: $PLOT (report: $OUTDIR/chaos-$SEED.txt)"
[ -n "$PLOT_NOTE" ] && echo "  $PLOT_NOTE"
for m in "${FAIL[@]}"; do echo "  VIOLATION: $m"; done
[ ${#FAIL[@]} = 0 ] && echo "  all checks passed"
if [ "$KEEP" = 1 ]; then echo "  logs: $T (kept)"
elif [ ${#FAIL[@]} != 0 ]; then echo "  logs removed; rerun with --keep to keep them"; fi
read -r KMED _ _ < <(stats "${TIMES[kill_daemon]:-} ${TIMES[kill_trainer]:-}")
read -r _ _ HMAX < <(stats "${TIMES[hang_daemon]:-} ${TIMES[link_down]:-}")
echo "chaos: stale_steps=$STALE"
REPORTED=1
echo "chaos: faults=$NFAULTS recovered=$NREC lost_steps=$LOST" \
     "duplicated_steps=$DUP hangs=$HANGS kill_recovery_median_ms=$KMED" \
     "hang_recovery_max_ms=$HMAX"
} >"$T/report.txt"
