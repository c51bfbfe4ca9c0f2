# chaos/run-check.sh - sourced by chaos.sh at the end of a run: the exit
# status of every process the harness started (etcd aside), processes left
# in the namespaces, and the hash logs: lost, duplicated and stale steps
# (LOST DUP STALE MAXS), and the steps a restarted job replayed (REPLAYED,
# REPLAY_BAD, REPLAY_OTHERW, RESTART_LINES). Failures go to FAIL.
# shellcheck shell=bash
# Exit statuses: every process the harness started, except etcd.
for p in "${PIDS[@]}"; do
    [[ " ${ETCD_PIDS[*]} ${ETCD_OLD[*]} " == *" $p "* ]] && continue
    running_snapshot
    if [ -z "${STATUS[$p]:-}" ] && is_running "$p"; then
        FAIL+=("${ROLE[$p]} (pid $p) still running at the end"); CRASHES=$((CRASHES + 1))
        kill -9 "$p" 2>/dev/null
    fi
    if [ -z "${STATUS[$p]:-}" ]; then wait "$p" 2>/dev/null; STATUS[$p]=$?; fi
    rc=${STATUS[$p]}; want=${EXPECT[$p]}
    # 127 from wait: bash no longer knew the pid (reused before we asked).
    if [ "$rc" = 127 ] && [ "$want" != crashed ]; then
        FAIL+=("${ROLE[$p]} (pid $p): exit status lost (bash forgot it: the pid was reused before it was recorded)")
        CRASHES=$((CRASHES + 1)); continue
    fi
    case "$want:$rc" in
    killed:137|ok:0|drained:0|restarted:75) ;;
    crashed:*) ;;   # counted in CRASH_NOTES
    killed:*) [ "${ROLE[$p]%% *}" = trainer ] && [ "$rc" -lt 128 ] ||
        { FAIL+=("${ROLE[$p]} (pid $p): status $rc, expected SIGKILL"); CRASHES=$((CRASHES + 1)); } ;;
    *) FAIL+=("${ROLE[$p]} (pid $p): exit status $rc ($want expected)"); CRASHES=$((CRASHES + 1)) ;;
    esac
done
for p in "${ETCD_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
for p in "${ETCD_PIDS[@]}"; do wait "$p" 2>/dev/null; done
if [ "$NETNS" = 1 ]; then
    for k in $(seq 1 "$MAXSLOT"); do
        left=$(ip netns pids "${PREFIX}h$k" 2>/dev/null | tr '\n' ' ')
        [ -z "$left" ] || FAIL+=("processes left in ${PREFIX}h$k: $left")
    done
fi
# Hashes: per file the last line per step wins; then per step every
# replica's hash must be the same, and every step 0..STEPS-1 must be there.
# A line of an older generation whose hash differs from the newest
# generation's is an evicted replica that completed a step the job then
# redid without it (stale); differing hashes within one generation are
# duplicated (or divergently applied) steps.
# A job_restart's killed incarnation: its lines from the resume step on
# were redone by the restarted job (compared above where the world size
# is the same), so they are left out here.
declare -A CUT
for r in "${RESTARTS[@]}"; do
    read -r _ rc _ rslots <<<"$r"
    for k in ${rslots%%:*}; do CUT[$k]=$(( rc < 0 ? 0 : rc )); done
done
read -r LOST DUP STALE MAXS < <(
    for f in "$T"/hash-*.log; do
        k=${f##*/hash-}; k=${k%.log}
        [ -f "$f" ] && awk -v f="${f##*/}" -v cut="${CUT[$k]:-}" '$1 == "step" && (cut == "" || $2 < cut + 0) { h[$2] = $10; g[$2] = $4 }
            END { for (s in h) print s, h[s], g[s], f }' "$f"
    done | sort -k1,1n -k3,3n | awk -v n="$STEPS" -v det="$T/stale.txt" '
        { s = $1; if (!(s in top) || $3 > top[s]) { top[s] = $3; th[s] = "" }
          line[s] = line[s] "\n" $0; if ($1 > m) m = $1 }
        { if ($3 == top[s]) { if (th[s] == "") th[s] = $2; else if (th[s] != $2) d[s] = 1 } }
        { all[NR] = $0 }
        END { lost = 0; dup = 0; stale = 0
              for (i = 1; i <= NR; i++) { split(all[i], x, " ")
                  if (x[3] < top[x[1]] && x[2] != th[x[1]]) {
                      stale++; print "step " x[1] ": " x[4] " (gen " x[3] ") hash " x[2] \
                          ", gen " top[x[1]] " hash " th[x[1]] > det } }
              for (s = 0; s < n; s++) if (!(s in th)) lost++
              for (s in d) dup++
              print lost, dup, stale, (m == "" ? -1 : m) }')
# Job restarts: the new incarnation's first step is the newest
# checkpoint's (0 without one: nothing skipped, nothing older), and the
# steps it redid (checkpoint step .. last step before the kill) have the
# hashes they had before, where the world size is the same (the trainer
# is deterministic: a step's result depends only on the parameters, the
# step number and the world size). Only up to the first step done at
# another world size: after it the parameters differ by float rounding,
# and a later step at the old world size may not match.
REPLAYED=0; REPLAY_BAD=0; REPLAY_OTHERW=0; RESTART_LINES=()
for r in "${RESTARTS[@]}"; do
    read -r _ rc rpre rslots <<<"$r"
    ro=${rslots%%:*}; rn=${rslots#*:}
    want=$(( rc < 0 ? 0 : rc ))
    of=(); nf=()
    for k in $ro; do [ -f "$T/hash-$k.log" ] && of+=("$T/hash-$k.log"); done
    for k in $rn; do [ -f "$T/hash-$k.log" ] && nf+=("$T/hash-$k.log"); done
    first=$( [ ${#nf[@]} -gt 0 ] && cat "${nf[@]}" | awk '$1 == "step" && (m == "" || $2 < m) { m = $2 } END { print m }')
    if [ "${first:-}" != "$want" ]; then
        FAIL+=("job_restart: the job resumed at step ${first:-never}, the newest complete checkpoint at the kill was step $rc")
    fi
    rst=$(cat "$T"/trainer-*.log 2>/dev/null | grep -c "^joined at step $want: parameters restored")
    read -r cmp bad otherw < <( { [ ${#of[@]} -gt 0 ] && cat "${of[@]}" | sed 's/^/O /'
                                  [ ${#nf[@]} -gt 0 ] && cat "${nf[@]}" | sed 's/^/N /'; } |
        awk -v lo="$want" -v hi="$rpre" '$2 == "step" && $3 >= lo && $3 <= hi {
              k = $1 SUBSEP $3
              if (!(k in g) || $5 >= g[k]) { g[k] = $5; h[k] = $11; w[k] = $9 } }
            END { for (s = lo; s <= hi; s++) { o = "O" SUBSEP s; n = "N" SUBSEP s
                    if (!(o in h) || !(n in h)) continue
                    if (w[o] != w[n] || sw) { ow++; sw = 1; continue }
                    c++; if (h[o] != h[n]) { b++; if (b <= 3) print "step " s ": " h[o] " before, " h[n] " after" > "/dev/stderr" } }
                  print c + 0, b + 0, ow + 0 }' 2>>"$T/replay.txt")
    REPLAYED=$((REPLAYED + cmp)); REPLAY_BAD=$((REPLAY_BAD + bad)); REPLAY_OTHERW=$((REPLAY_OTHERW + otherw))
    RESTART_LINES+=("job_restart: checkpoint step $rc, last step before the kill $rpre; resumed at step ${first:-never} ($rst trainers restored); $cmp steps replayed with the same world size, $bad with another hash$( [ "$otherw" != 0 ] && echo ", $otherw not compared (other world size)")")
done
