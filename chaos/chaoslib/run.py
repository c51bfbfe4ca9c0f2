"""The driver: the fault loop over the plan, and the recovery waits the
kinds share (record, until_step, grow_first). Counters and notes live
here; the report reads them."""

import time

from chaoslib.cluster import now_ms, now_s

RECOVER_S = 60      # no step within this long after a fault: a hang
SETTLE_MS = 1500    # quiet time after a recovery before the next fault


class Run:
    def __init__(self, cl, nodes, table):
        self.cl, self.nodes, self.table = cl, nodes, table
        self.cfg = cl.cfg
        self.logs = cl.logs
        self.log = cl.log
        self.nfaults = self.nrec = self.hangs = 0
        self.inj, self.rec, self.skip, self.times = {}, {}, {}, {}
        self.grew = {}
        self.marks = []          # (step, kind) per injected fault
        self.fail_early = False
        self.needed_restart = 0  # kill_trainer: hangs that needed one
        self.restart_ms = []
        self.restarts = []       # job_restart: (fms, ckpt, last, old, new)
        self.restart_gaps = []
        self.ckpt_bad, self.evicted, self.other_bad = [], [], []
        self.df_freed = None     # the step disk_full last freed space at
        self.tc_newgen = self.tc_samegen = 0
        self.sd_skips = 0
        self.etcd_fenced = []
        self.kind = None

    def max_step(self):
        return self.logs.max_step()

    def check_alive(self):
        return self.nodes.check_alive()

    def count_skip(self, kind, why):
        n = int(self.skip.get(kind, "0 x").split(" ")[0])
        self.skip[kind] = "%d (%s)" % (n + 1, why)

    def recovered(self, kind, ms):
        self.nrec += 1
        self.rec[kind] = self.rec.get(kind, 0) + 1
        self.times.setdefault(kind, []).append(ms)

    def unrecover(self, kind, n=1):
        self.nrec -= n
        self.rec[kind] = self.rec.get(kind, 0) - n

    def hang(self, msg):
        self.hangs += 1
        self.log(msg)

    def record(self, kind, fms, victim, joiner=None, within=None):
        """Wait for the job to recover from a fault at fms: True once
        recovered (the time recorded), False on a hang, None when
        `within` (seconds, instead of RECOVER_S) ran out.

        A kind that takes a member out of the job (new_generation) is
        over when the job completes a step in a later view generation
        than any step logged before it; the others at the first step 2
        past the one reached once the fault is in place (the next one may
        have been in flight). With a joiner: its own first step (for a
        restarted daemon, in a later generation)."""
        others = [k for k in self.nodes.live if k != victim]
        pre = self.max_step() + 1
        g0 = None
        if self.table[kind].new_generation:
            g0 = self.logs.gen_at(fms)
        if joiner is not None:
            others, pre = list(joiner), -2
            if kind not in ("daemon_restart", "rolling_restart"):
                g0 = None
        deadline = now_s() + (within or RECOVER_S)
        while True:
            if g0 is not None:
                res = self.logs.first_newgen(g0, others, fms)
            else:
                res = self.logs.first_after(pre + 2, others, fms)
            if res:
                break
            if now_s() >= deadline:
                if within:
                    return None
                self.hang("  %s: HANG: no step completed within %ds"
                          % (kind, RECOVER_S))
                return False
            self.check_alive()
            time.sleep(0.05)
        ms = res[1] - fms
        self.recovered(kind, ms)
        self.log("  %s: recovered: step %d completed %d ms after the fault%s"
                 % (kind, res[0], ms, " (generation %d; %d at the fault)"
                    % (res[2], g0) if g0 is not None else ""))
        return True

    def wait_step(self, s, timeout):
        """Until some trainer logged step s; False after timeout s."""
        deadline = now_s() + timeout
        while self.max_step() < s:
            if now_s() >= deadline:
                return False
            self.check_alive()
            time.sleep(0.1)
        return True

    def until_step(self, slots, first, ms):
        """Wait (RECOVER_S) for a step >= first by a node in slots stamped
        at or after ms: (step, t_ms), or None on the timeout."""
        deadline = now_s() + RECOVER_S
        while True:
            res = self.logs.first_after(first, slots, ms)
            if res:
                return res
            if now_s() >= deadline:
                return None
            self.check_alive()
            time.sleep(0.05)

    def grow_first(self, kind, need):
        """A kind that needs `need` live nodes finds fewer (scale_downs and
        kill_adjacents drift the count down): start nodes until there are
        enough, each awaited to its first step, so that no kind is ever
        skipped for want of nodes. Not faults; False on a hang."""
        while len(self.nodes.live) < need:
            a0 = now_ms()
            n = self.nodes.start_node(1)
            self.log("fault %s: %d nodes, %d needed: node%d started first"
                     % (kind, len(self.nodes.live) - 1, need, n))
            res = self.until_step([n], 0, a0)
            if res is None:
                self.hang("  %s: HANG: the added node%d made no step within "
                          "%ds" % (kind, n, RECOVER_S))
                return False
            self.grew[kind] = self.grew.get(kind, 0) + 1
            self.log("  node%d joined: step %d, %d ms after its start"
                     % (n, res[0], res[1] - a0))
        return True

    def restart_gap(self, kind, k, fms):
        """After a restart's record: the other nodes' longest time without
        a step while slot k was away (from the fault to its first step
        back); they must not have waited for it the whole time."""
        o = [x for x in self.nodes.live if x != k]
        if not o:
            return
        away = self.times[kind][-1]
        gap = self.logs.gap_in(o, fms, fms + away)
        self.restart_gaps.append(gap)
        self.log("  the other nodes' longest time without a step meanwhile: "
                 "%d ms (node%s away %d ms)" % (gap, k, away))
        if gap >= away:
            self.nodes.restart_bad.append(
                "the other nodes made no step for %d ms while node%s's "
                "daemon restarted (away %d ms): they waited for it"
                % (gap, k, away))

    # ---- the fault loop ------------------------------------------------
    def play(self, plan):
        for kind, r in plan:
            time.sleep(SETTLE_MS / 1000)
            self.nodes.check_all_alive()
            k = self.table[kind]
            need = k.steps_needed(self)
            if self.cfg.steps - self.max_step() < need:
                self.count_skip(kind, "job near its end")
                self.log("fault %s: skipped: fewer than %d steps left (raise "
                         "CHAOS_STEPS_PER_FAULT)" % (kind, need))
                self.fail_early = True
                continue
            why = k.precondition(self)
            if why is False:
                break
            if why:
                self.count_skip(kind, why[0])
                self.log("fault %s: skipped (%s)" % (kind, why[1]))
                continue
            live = self.nodes.live
            v = live[r % len(live)]
            pre, fms = self.max_step(), now_ms()
            self.nfaults += 1
            self.inj[kind] = self.inj.get(kind, 0) + 1
            self.marks.append((pre, kind))
            self.kind = kind
            if k.inject(self, v, r, fms, pre) is False:
                break
            if self.hangs > self.needed_restart:
                break

    def finish(self):
        """Until the job's last step, or a hang (no new step for
        RECOVER_S); then the trainers' exits, the daemons drained."""
        steps, procs = self.cfg.steps, self.cl.procs
        self.log("faults done; waiting for step %d" % steps)
        last, since = -2, now_s()
        while True:
            m = self.max_step()
            if m >= steps - 1:
                break
            if m != last:
                last, since = m, now_s()
            if now_s() - since >= RECOVER_S:
                self.hang("HANG: the job stopped at step %d" % m)
                break
            self.check_alive()
            time.sleep(0.2)
        deadline = now_s() + 60
        for k in self.nodes.live:
            while procs.alive(self.nodes.tpid[k]) and now_s() < deadline:
                time.sleep(0.1)
        self.end_ms = now_ms()
        for k in self.nodes.live:
            procs.signal(self.nodes.dpid[k], 15)
        for k in self.nodes.live:
            procs.wait_exit(self.nodes.dpid[k], 300, 0.05)
