# shellcheck shell=bash
# chaos/ckpt-check.sh - sourced by chaos/chaos.sh at this point of its run (it
# shares chaos.sh's variables and functions); kept apart so each file
# stays readable.
# ---- the newest checkpoint restores ----------------------------------------------
# verify_ckpt STEP: restore the newest complete checkpoint (which must be
# STEP's) the way a restarted job does, on a standalone ringd whose
# checkpoint directory points at the job's, with a trainer that stops
# right at the restored step; sets VSTEP and VHASH (the restored
# parameters' hash), empty on failure (the reason in $T/verify-*.log).
# A real restore, not `ringctl verify STEP`: verify checks the shards'
# checksums, this also checks that the restored parameters are the job's.
# verify_ckpt STEP [ROOT]: ROOT (default the job's checkpoint directory)
# is what the standalone daemon sees.
verify_ckpt() {
    local vd="$T/verify" sock="$T/verify.sock" dp tp
    VSTEP=; VHASH=
    rm -rf "$vd" "$sock"
    mkdir -p "$vd" && ln -sfn "${2:-$CKJOB}" "$vd/standalone" || return 0
    UCX_NET_DEVICES=lo UCX_WARN_UNUSED_ENV_VARS=n "$B/ringd" --standalone \
        --socket "$sock" --trainers 1 --metrics off --ckpt-interval 100000000 \
        --ckpt-dir "$vd" >"$T/verify-ringd.log" 2>&1 &
    dp=$!; PIDS+=("$dp"); ROLE[$dp]="daemon verify"; EXPECT[$dp]=ok
    for _ in $(seq 250); do [ -S "$sock" ] && break; sleep 0.02; done
    if [ -S "$sock" ]; then
        "$B/examples/trainer" --socket "$sock" --cpu --steps "$1" \
            >"$T/verify-trainer.log" 2>&1 &
        tp=$!; PIDS+=("$tp"); ROLE[$tp]="trainer verify"; EXPECT[$tp]=ok
        for _ in $(seq 600); do kill -0 "$tp" 2>/dev/null || break; sleep 0.05; done
        kill -0 "$tp" 2>/dev/null && kill_reap "$tp"
        wait "$tp" 2>/dev/null; STATUS[$tp]=${STATUS[$tp]:-$?}
    fi
    kill -TERM "$dp" 2>/dev/null
    for _ in $(seq 200); do kill -0 "$dp" 2>/dev/null || break; sleep 0.05; done
    kill -0 "$dp" 2>/dev/null && kill_reap "$dp"
    wait "$dp" 2>/dev/null; STATUS[$dp]=${STATUS[$dp]:-$?}
    VSTEP=$(sed -n 's/^joined at step \([0-9]*\): parameters restored$/\1/p' \
        "$T/verify-trainer.log" 2>/dev/null | head -1)
    VHASH=$(sed -n 's/^final: test_accuracy [0-9.]* hash \([0-9a-f]*\)$/\1/p' \
        "$T/verify-trainer.log" 2>/dev/null | head -1)
}
CKPT_LINE=
if [ "$CKPT_EVERY" != 0 ]; then
    CSTEP=$(newest_ckpt)
    CKPT_FAILS=$(ckpt_failures)
    if [ "$CSTEP" -lt 0 ]; then
        CKPT_BAD+=("no complete checkpoint at the end of the job")
        CKPT_LINE="none complete"
    else
        verify_ckpt "$CSTEP"
        # The restored state must be the job's after step CSTEP-1 (any
        # replica's, any generation's: the checkpoint's view may have
        # been superseded afterwards).
        WANT=$(cat "$T"/hash-*.log | awk -v s=$((CSTEP - 1)) '$1 == "step" && $2 == s { print $10 }' | sort -u | tr '\n' ' ')
        CKPT_LINE="newest step $CSTEP"
        if [ "${VSTEP:-}" != "$CSTEP" ]; then
            CKPT_BAD+=("the newest checkpoint (step $CSTEP) did not restore on a standalone ringd (restored: ${VSTEP:-nothing}; see verify-*.log): $(grep -i 'checkpoint\|error' "$T/verify-ringd.log" | tail -1)")
        elif [ -z "${VHASH:-}" ] || [[ " $WANT " != *" $VHASH "* ]]; then
            CKPT_BAD+=("the checkpoint of step $CSTEP restored parameters with hash ${VHASH:-?}, not the job's after step $((CSTEP - 1)) (${WANT:-not logged})")
        else
            CKPT_LINE="$CKPT_LINE restored on a standalone ringd, parameters hash $VHASH = the job's after step $((CSTEP - 1))"
        fi
        if [ -n "$DF_FREED" ] && [ "$CSTEP" -le "$DF_FREED" ]; then
            CKPT_BAD+=("no checkpoint completed after the disk was freed at step $DF_FREED (newest: $CSTEP)")
        fi
    fi
    # Every complete checkpoint must restore, not only the newest: each
    # one with only the steps up to it in view (a delta needs its bases).
    # A complete one that does not restore is a violation (a warning
    # with CHAOS_STRICT=0). (The 8 newest, --quick too: retention
    # normally leaves 3-6; bounded for runs with a short
    # CHAOS_CKPT_INTERVAL, which can leave hundreds.)
    NOTRESTORE=(); NALL=0
    for st in $(ckpt_steps | grep -vx "$CSTEP" | tail -8); do
        NALL=$((NALL + 1))
        vr="$T/vroot-$st"; mkdir -p "$vr"
        for d in "$CKJOB"/step-*; do
            ds=${d##*/step-}; [ $((10#$ds)) -le "$st" ] && ln -s "$d" "$vr/"
        done
        verify_ckpt "$st" "$vr"
        WANT=$(cat "$T"/hash-*.log | awk -v s=$((st - 1)) '$1 == "step" && $2 == s { print $10 }' | sort -u | tr '\n' ' ')
        if [ "${VSTEP:-}" != "$st" ] || [[ " $WANT " != *" ${VHASH:-x} "* ]]; then
            NOTRESTORE+=("step $st (restored: ${VSTEP:-nothing}$(grep -o 'step [0-9]* is not restorable' "$T/verify-ringd.log" | head -1 | sed 's/^/; /'))")
        fi
        rm -rf "$vr"
    done
    if [ "$NALL" = 0 ]; then
        CKPT_LINE="$CKPT_LINE; no older complete one to check"
    elif [ ${#NOTRESTORE[@]} = 0 ]; then
        CKPT_LINE="$CKPT_LINE; the $NALL older complete ones restore too"
    else
        CKPT_LINE="$CKPT_LINE; $([ "$STRICT" = 0 ] && echo "WARNING (CHAOS_STRICT=0)" || echo FAILED): ${#NOTRESTORE[@]} of the $NALL older complete ones do not restore: ${NOTRESTORE[*]}"
        [ "$STRICT" = 0 ] ||
            CKPT_BAD+=("${#NOTRESTORE[@]} complete checkpoints do not restore: ${NOTRESTORE[*]}")
    fi
    CKPT_LINE="$CKPT_LINE; $CKPT_FAILS checkpoint write failures logged"
fi

