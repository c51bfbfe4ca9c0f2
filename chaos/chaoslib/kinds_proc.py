"""Fault kinds on the nodes' processes: kills, stops, joins, drains, a
trainer's reconnect, a flood of connections."""

import os
import re
import signal
import subprocess
import time

from chaoslib.cluster import Die, now_ms, read_text
from chaoslib.kindbase import Kind, count_lines, kill_now
from chaoslib.run import RECOVER_S


def replace(run, v):
    n = run.nodes.start_node(1)
    run.log("  node%d started as node%s's replacement" % (n, v))


class KillDaemon(Kind):
    """SIGKILL a daemon; its trainer goes too, a fresh node replaces it."""
    name = "kill_daemon"
    new_generation = True

    def inject(self, run, v, r, fms, pre):
        nd = run.nodes
        run.log("fault %s: SIGKILL node%s's daemon (step %d)"
                % (self.name, v, pre))
        run.cl.procs.kill_reap(nd.dpid[v])
        nd.drop_live(v)
        run.record(self.name, fms, v)
        run.cl.procs.kill_reap(nd.tpid[v])
        replace(run, v)


class KillTrainer(Kind):
    """SIGKILL a trainer. First the job must go on without it (20 s);
    else, as a supervisor would, it is restarted, the fault counts as a
    hang and the time to resume with it is reported apart."""
    name = "kill_trainer"
    new_generation = True

    def inject(self, run, v, r, fms, pre):
        nd = run.nodes
        run.log("fault %s: SIGKILL node%s's trainer (step %d)"
                % (self.name, v, pre))
        run.cl.procs.kill_reap(nd.tpid[v])
        nd.drop_live(v)
        if run.record(self.name, fms, v, within=20) is None:
            run.hang("  %s: HANG: no step in 20 s without a new trainer: "
                     "restarting it" % self.name)
            run.needed_restart += 1
            nd.live.append(v)
            nd.start_trainer(v)
            saved = list(run.times.get(self.name, []))
            if not run.record(self.name, fms, None):
                return False
            run.unrecover(self.name)
            run.restart_ms.append(run.times[self.name][-1])
            run.times[self.name] = saved
        else:
            nd.live.append(v)
            nd.start_trainer(v)
        run.log("  node%s's trainer restarted" % v)

    def notes(self, run):
        if not run.needed_restart:
            return []
        after = "".join(" %d" % x for x in run.restart_ms) or " never"
        return ["  kill_trainer: %d of %d made no progress in 20 s without "
                "the node's trainer (counted as hangs, not recovered); with "
                "a new trainer the job resumed after:%s ms"
                % (run.needed_restart, run.inj.get(self.name, 0), after)]


class HangDaemon(Kind):
    """SIGSTOP a daemon for 3 s: its lease expires, it is evicted, then
    rejoins."""
    name = "hang_daemon"
    new_generation = True

    def inject(self, run, v, r, fms, pre):
        nd = run.nodes
        run.log("fault %s: SIGSTOP node%s's daemon for 3 s (step %d)"
                % (self.name, v, pre))
        run.cl.stop_for(nd.dpid[v], fms, 3000)
        nd.drop_live(v)
        run.record(self.name, fms, v)
        run.cl.settle()
        nd.live.append(v)
        run.log("  node%s's daemon continued" % v)


class SlowTrainer(Kind):
    """A trainer paused past the ring deadline (10 s) but not the step
    timeout: nobody may be evicted; the job waits."""
    name = "slow_trainer"

    def inject(self, run, v, r, fms, pre):
        g0 = run.logs.gen_at(fms)
        run.log("fault %s: SIGSTOP node%s's trainer for 12 s (step %d)"
                % (self.name, v, pre))
        run.cl.stop_for(run.nodes.tpid[v], fms, 12000)
        run.cl.settle()
        run.record(self.name, fms, None)
        g1 = run.logs.gen_at(now_ms())
        if g1 != g0:
            run.evicted.append("slow_trainer: the view changed (%d -> %d) "
                               "for a slow trainer" % (g0, g1))
            run.log("  %s: EVICTION: generation %d -> %d"
                    % (self.name, g0, g1))


class HungTrainer(Kind):
    """A trainer stopped past --step-timeout: its node steps out, the
    others go on; continued 5 s later, it rejoins."""
    name = "hung_trainer"
    new_generation = True

    def inject(self, run, v, r, fms, pre):
        nd = run.nodes
        ms = run.cfg.step_timeout_ms + 5000
        run.log("fault %s: SIGSTOP node%s's trainer for %d s (step %d)"
                % (self.name, v, ms // 1000, pre))
        run.cl.stop_for(nd.tpid[v], fms, ms)
        nd.drop_live(v)
        run.record(self.name, fms, v)
        run.cl.settle()
        nd.live.append(v)
        run.log("  node%s's trainer continued" % v)


_VIEW = r".*mb node%s: view ([0-9]+), [0-9]+ members, index ([0-9]+).*"


class KillAdjacent(Kind):
    """Two ring neighbours' daemons SIGKILLed at once (ring order: each
    daemon's index in the newest view the daemons logged)."""
    name = "kill_adjacent"
    new_generation = True

    def precondition(self, run):
        # Two of three or fewer killed would leave a ring of one.
        return None if run.grow_first(self.name, 4) else False

    def ring(self, run):
        rows = []
        for k in run.nodes.live:
            rx = re.compile(_VIEW % k)
            last = None
            for line in read_text(run.cl.path("ringd-%s.log" % k)
                                  ).splitlines():
                m = rx.match(line)
                if m:
                    last = (int(m.group(1)), int(m.group(2)), k)
            if last:
                rows.append(last)
        rows.sort(key=lambda x: (-x[0], x[1], "%d %d %s" % x))
        ring = [x[2] for x in rows if x[0] == rows[0][0]] if rows else []
        return ring if len(ring) >= 2 else sorted(run.nodes.live)

    def inject(self, run, v, r, fms, pre):
        nd, procs = run.nodes, run.cl.procs
        ring = self.ring(run)
        i = r % len(ring)
        v, w = ring[i], ring[(i + 1) % len(ring)]
        run.log("fault %s: SIGKILL node%s's and node%s's daemons at once "
                "(step %d)" % (self.name, v, w, pre))
        kill_now(run, nd.dpid[v], nd.dpid[w])
        procs.kill_reap(nd.dpid[v])
        procs.kill_reap(nd.dpid[w])
        nd.drop_live(v)
        nd.drop_live(w)
        run.record(self.name, fms, v)
        procs.kill_reap(nd.tpid[v])
        procs.kill_reap(nd.tpid[w])
        replace(run, v)
        replace(run, w)


class TrainerClose(Kind):
    """A trainer drops its connection (no BYE) in a step (SIGUSR1) or
    between two steps (SIGUSR2) and reconnects at once; the job must go
    on. Recovery: the first step of a new generation when the view
    changed, else the first step not in flight at the fault; the
    trainer's own next step shows it is back."""
    name = "trainer_close"

    def inject(self, run, v, r, fms, pre):
        sig, where = signal.SIGUSR1, "in a step"
        if r % 2 == 1:
            sig, where = signal.SIGUSR2, "between two steps"
        tlog = run.cl.path("trainer-%s.log" % v)
        g0 = run.logs.gen_at(fms)
        n0 = count_lines(tlog, "^connection closed")
        run.log("fault %s: node%s's trainer closes its connection %s and "
                "reconnects (SIG%s; step %d)" % (self.name, v, where,
                                                  sig.name[3:], pre))
        run.cl.procs.signal(run.nodes.tpid[v], sig)
        p0 = run.max_step() + 2
        back = run.until_step([v], p0, fms)
        if back is None:
            run.hang("  trainer_close: HANG: node%s's trainer made no step "
                     "within %ds" % (v, RECOVER_S))
            return
        if count_lines(tlog, "^connection closed") <= n0:
            run.other_bad.append("trainer_close: node%s's trainer did not "
                                 "close its connection (no 'connection "
                                 "closed' line)" % v)
        g1 = run.logs.gen_at(now_ms())
        if g1 > g0:
            res = run.logs.first_newgen(g0, run.nodes.live, fms)
            run.tc_newgen += 1
            how = "a new generation, %d -> %d" % (g0, g1)
        else:
            res = run.logs.first_after(p0, run.nodes.live, fms)
            run.tc_samegen += 1
            how = "no view change"
        res = res or back
        run.recovered(self.name, res[1] - fms)
        run.log("  trainer_close: recovered: step %d completed %d ms after "
                "the fault (%s); node%s's trainer back at step %d"
                % (res[0], res[1] - fms, how, v, back[0]))

    def notes(self, run):
        if self.name not in run.inj:
            return []
        return ["  trainer_close: %d with a view change (the row: to the "
                "first step of the new generation), %d without (to the "
                "first step not in flight at the fault)"
                % (run.tc_newgen, run.tc_samegen)]


class ScaleUp(Kind):
    """An extra node; the time until it completes a step of its own."""
    name = "scale_up"

    def inject(self, run, v, r, fms, pre):
        n = run.nodes.start_node(1)
        run.log("fault %s: node%d started (step %d)" % (self.name, n, pre))
        run.record(self.name, fms, None, joiner=[n])


class ScaleDown(Kind):
    """`ringctl drain nodeK`: its daemon must exit 0 (its trainer too);
    with 2 nodes left, a node is started first."""
    name = "scale_down"
    new_generation = True

    def precondition(self, run):
        return None if run.grow_first(self.name, 3) else False

    def inject(self, run, v, r, fms, pre):
        cl, nd = run.cl, run.nodes
        run.log("fault %s: ringctl drain node%s (step %d)"
                % (self.name, v, pre))
        dlog = cl.path("drain-%s.log" % v)
        with open(dlog, "wb") as out:
            rc = subprocess.run(
                [os.path.join(run.cfg.build, "ringctl"), "--etcd",
                 cl.etcd_val("ETCD_URL")] + cl.etcd.get("ETCD_SEC", []) +
                ["--job", "chaos", "drain", "node%s" % v],
                stdout=out, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            raise Die("ringctl drain node%s failed: %s"
                      % (v, read_text(dlog).rstrip("\n")))
        nd.drop_live(v)
        cl.procs.expect[nd.dpid[v]] = "drained"
        cl.procs.expect[nd.tpid[v]] = "drained"
        run.record(self.name, fms, v)
        if not cl.procs.wait_exit(nd.dpid[v], 300, 0.05):
            raise Die("node%s's daemon did not exit after its drain" % v)


class FdExhaust(Kind):
    """chaos/fd-flood.py holds every connection it can make to the
    victim's socket for 4 s (the daemons run at ulimit -n NOFILE). The
    row: the longest time without a step of the victim's trainer during
    the flood; a view change, no client served within 10 s of the end,
    too many log lines or the daemon's own work out of descriptors fail
    the run."""
    name = "fd_exhaust"

    def precondition(self, run):
        if not os.access("/usr/bin/python3", os.X_OK):
            return ("no /usr/bin/python3",
                    "no /usr/bin/python3 for the flooder")
        return None

    def inject(self, run, v, r, fms, pre):
        cl = run.cl
        g0 = run.logs.gen_at(fms)
        rlog = cl.path("ringd-%s.log" % v)
        l0 = read_text(rlog).count("\n")
        run.log("fault %s: flooding node%s's socket with connections for 4 s"
                " (its daemon: ulimit -n %d; step %d)"
                % (self.name, v, run.cfg.nofile, pre))
        with open(cl.path("flood-%d.log" % run.nfaults), "wb") as out:
            p = subprocess.Popen(["/usr/bin/python3", "chaos/fd-flood.py",
                                  run.nodes.sock(v), "4"],
                                 stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT)
        cl.helpers.append(p)
        cl.helper = p
        cl.settle()
        self.check(run, v, fms, now_ms(), g0, l0)

    def check(self, run, v, fms, fend, g0, l0):
        cl, nofile = run.cl, run.cfg.nofile
        if run.until_step([v], run.max_step() + 1, fend) is None:
            run.hang("  fd_exhaust: HANG: node%s's trainer made no step "
                     "within %ds of the flood's end" % (v, RECOVER_S))
            return
        ok = False
        for _ in range(100):
            if cl.run_quiet([os.path.join(run.cfg.build, "ringctl"),
                             "--socket", run.nodes.sock(v), "status"]) == 0:
                ok = True
                break
            time.sleep(0.1)
        gap = run.logs.gap_in([v], fms, fend)
        n = run.logs.count_in(v, fms, fend)
        text = read_text(cl.path("ringd-%s.log" % v))
        lines = text.count("\n") - l0
        emf = [x for x in text.split("\n")[l0:]
               if "accept: " not in x and "Too many open files" in x]
        if emf:
            run.other_bad.append(
                "fd_exhaust: the flood ran node%s's daemon itself out of "
                "descriptors: %d lines such as '%s'" % (v, len(emf),
                                                        emf[0][24:150]))
        g1 = run.logs.gen_at(now_ms())
        if not ok:
            run.other_bad.append("fd_exhaust: node%s's daemon served no new "
                                 "client (ringctl status) within 10 s of the"
                                 " flood's end" % v)
        if lines > 2 * nofile + 50:
            run.other_bad.append("fd_exhaust: node%s's daemon logged %d "
                                 "lines for one flood (bound %d)"
                                 % (v, lines, 2 * nofile + 50))
        if g1 != g0:
            run.other_bad.append("fd_exhaust: the view changed (%d -> %d) "
                                 "while node%s's socket was flooded"
                                 % (g0, g1, v))
        if n > 0:
            run.recovered(self.name, gap)
        flood = read_text(cl.path("flood-%d.log" % run.nfaults)).split("\n")
        flood = [x for x in flood if x] or [""]
        accepts = sum(1 for x in text.split("\n") if "accept: " in x)
        run.log("  fd_exhaust: %s; node%s's trainer made %d steps during the"
                " flood, longest without one %d ms; the daemon logged %d "
                "lines (%d accept warnings so far); ringctl status after the"
                " flood: %s; generation %d -> %d"
                % (flood[-1], v, n, gap, lines, accepts,
                   "served" if ok else "NOT SERVED", g0, g1))

    def notes(self, run):
        if self.name not in run.inj:
            return []
        return ["  fd_exhaust: the row is the longest time without a step "
                "of the flooded node's trainer during the flood (daemons at "
                "ulimit -n %d)" % run.cfg.nofile]
