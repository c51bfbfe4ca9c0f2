"""Fault kinds on what the nodes stand on: links (through iproute2,
iptables and tc in the namespaces netns.sh made), etcd (restarted
through cluster.sh), the checkpoint disk, and restarts of daemons and
of the whole job."""

import datetime
import glob
import hashlib
import os
import re
import subprocess
import time

from chaoslib.cluster import Die, now_ms, now_s, read_text, grep_count
from chaoslib.kindbase import Kind, kill_now, node_list
from chaoslib.kinds_proc import replace
from chaoslib.run import RECOVER_S


class _NetKind(Kind):
    def precondition(self, run):
        if not run.cl.netns:
            return ("no namespaces", "no network namespaces")
        return None


class LinkDown(_NetKind):
    """The victim's veth down for 4 s: a partition."""
    name = "link_down"
    new_generation = True

    def inject(self, run, v, r, fms, pre):
        cl, nd = run.cl, run.nodes
        d = cl.veth(nd.hostof[v])
        run.log("fault %s: %s (node%s) down for 4 s (step %d)"
                % (self.name, d, v, pre))
        cl.link_down.append(d)
        subprocess.run(["ip", "link", "set", d, "down"])
        cl.later(fms, 4000, subprocess.run, ["ip", "link", "set", d, "up"])
        nd.drop_live(v)
        run.record(self.name, fms, v)
        cl.settle()
        nd.live.append(v)
        run.log("  %s up" % d)


class PacketLoss(_NetKind):
    """30% of the packets in and out of the victim's namespace dropped
    (iptables -m statistic) for 4 s."""
    name = "packet_loss"

    def inject(self, run, v, r, fms, pre):
        cl = run.cl
        ns = cl.ns(run.nodes.hostof[v])
        cl.ipt_ns.append(ns)
        run.log("fault %s: 30%% packet loss in and out of node%s for 4 s "
                "(step %d)" % (self.name, v, pre))
        for chain in ("INPUT", "OUTPUT"):
            subprocess.run(["ip", "netns", "exec", ns, "iptables", "-I",
                            chain, "-m", "statistic", "--mode", "random",
                            "--probability", "0.3", "-j", "DROP"])
        cl.later(fms, 4000, subprocess.run,
                 ["ip", "netns", "exec", ns, "iptables", "-F"])
        run.record(self.name, fms, v)
        cl.settle()
        run.log("  node%s's packet loss removed" % v)


class SlowLink(_NetKind):
    """tc tbf 10mbit on the victim's veth for 4 s."""
    name = "slow_link"

    def inject(self, run, v, r, fms, pre):
        cl = run.cl
        d = cl.veth(run.nodes.hostof[v])
        cl.qdisc_dev.append(d)
        run.log("fault %s: tbf 10mbit on %s (node%s) for 4 s (step %d)"
                % (self.name, d, v, pre))
        subprocess.run(["tc", "qdisc", "add", "dev", d, "root", "tbf",
                        "rate", "10mbit", "burst", "32kbit", "latency",
                        "50ms"])
        cl.later(fms, 4000, subprocess.run,
                 ["tc", "qdisc", "del", "dev", d, "root"])
        run.record(self.name, fms, v)
        cl.settle()
        run.log("  %s's qdisc removed" % d)


def fences(run):
    return grep_count(run.cl.ringd_logs(), "-> FENCED")


def kill_etcd(run, pid):
    run.cl.etcd_old.append(pid)
    run.cl.procs.signal(pid, 9)
    run.cl.procs.wait(pid)


def restart_etcd(run, delay, what):
    """etcd (single member) again on its data dir after delay seconds
    (rd_restart_etcd), awaited healthy (bounded, 30 s)."""
    cl = run.cl
    cl.bridge("rd_restart_etcd", delay)
    cl.etcd_adopt(cl.etcd_val("ETCD_PID"))
    cl.single_etcd = [int(cl.etcd_val("ETCD_PID"))]
    if cl.bridge("rd_wait_etcd", 30) != 0:
        raise Die("etcd did not come back within 30 s of %s (see %s)"
                  % (what, cl.path("etcd.log")))


class EtcdKill(Kind):
    """SIGKILL etcd (with --etcd3: one member, drawn from the seed),
    started again 3 s later. The row: the longest time without any
    completed step, from the kill until a step after etcd's return."""
    name = "etcd_kill"

    def kill_member(self, run, r, pre):
        cl = run.cl
        m = r % 3
        ep = cl.etcd_pids()[m]
        port = cl.etcd["EPS"][m]
        url = "%s://127.0.0.1:%s/v3/maintenance/status" % (
            cl.etcd_val("ETCD_SCHEME"), port)
        out = subprocess.run(cl.etcd["ETCD_CURL"] + [
            "-fs", "-m", "1", "-X", "POST", url, "-d", "{}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True).stdout
        x = re.match(r'.*"member_id":"([0-9]*)".*"leader":"([0-9]*)".*',
                     out)
        role = "role unknown"
        if x:
            role = "the leader" if x.group(1) == x.group(2) else "a follower"
        run.log("fault %s: SIGKILL etcd member %d of 3 (%s, pid %d), "
                "restarted on its data dir 3 s later (step %d)"
                % (self.name, m, role, ep, pre))
        kill_etcd(run, ep)
        cl.bridge("rd_restart_etcd_member", "chaos", m, 3)
        cl.etcd_adopt(cl.etcd_pids()[m])
        if cl.bridge("rd_wait_etcd", 30, port) != 0:
            raise Die("etcd member %d did not come back within 30 s of "
                      "etcd_kill (see %s)" % (m, cl.path("etcd-%d.log" % m)))

    def inject(self, run, v, r, fms, pre):
        cl = run.cl
        f0 = fences(run)
        if run.cfg.etcd3:
            self.kill_member(run, r, pre)
        else:
            pid = cl.single_etcd[0]
            run.log("fault %s: SIGKILL etcd (pid %d), restarted on its data "
                    "dir 3 s later (step %d)" % (self.name, pid, pre))
            kill_etcd(run, pid)
            restart_etcd(run, 3, "etcd_kill")
        back = now_ms()
        run.log("  etcd healthy again %d ms after the kill" % (back - fms))
        s0 = run.max_step() + 2
        deadline = now_s() + RECOVER_S
        while True:
            res = run.logs.first_after(s0, run.nodes.live, back)
            if res or now_s() >= deadline:
                break
            run.check_alive()
            time.sleep(0.05)
        fenced = fences(run) - f0
        if not res:
            run.hang("  %s: HANG: no step within %ds of etcd's return"
                     % (self.name, RECOVER_S))
            return
        ts, _ = run.logs.stamps(None, fms, res[1])
        p, gap = fms, 0
        for x in ts:
            gap = max(gap, x - p)
            p = x
        run.recovered(self.name, gap)
        run.log("  %s: recovered: step %d completed %d ms after etcd was "
                "back; the longest time without a step was %d ms; %d "
                "daemon(s) fenced themselves"
                % (self.name, res[0], res[1] - back, gap, fenced))
        if fenced:
            run.etcd_fenced.append(fenced)

    def notes(self, run):
        if not run.etcd_fenced:
            return []
        return ["  etcd_kill: daemons fenced themselves (lease not renewed "
                "within the TTL), per kill that fenced any:%s (the row "
                "above: the longest time without a step)"
                % "".join(" %d" % n for n in run.etcd_fenced)]


class DaemonEtcd(Kind):
    """A daemon SIGKILLed together with etcd, etcd back 4 s later. The
    job must resume from etcd's return in a view without the dead node
    (the restarted etcd renews every lease, the dead node's too)."""
    name = "daemon_etcd"

    def precondition(self, run):
        if run.cfg.etcd3:
            return ("3-member etcd",
                    "with --etcd3 one member down is no outage")
        return None

    def inject(self, run, v, r, fms, pre):
        cl, nd = run.cl, run.nodes
        g0 = run.logs.gen_at(fms)
        pid = cl.single_etcd[0]
        run.log("fault %s: SIGKILL node%s's daemon and etcd (pid %d) at "
                "once; etcd restarted on its data dir 4 s later (step %d)"
                % (self.name, v, pid, pre))
        kill_now(run, nd.dpid[v], pid)
        cl.procs.kill_reap(nd.dpid[v])
        kill_etcd(run, pid)
        nd.drop_live(v)
        restart_etcd(run, 4, "daemon_etcd")
        self.wait(run, v, fms, g0)
        cl.procs.kill_reap(nd.tpid[v])
        replace(run, v)

    def bad_views(self, run, g0, iso):
        """Views logged since etcd's return with more members than there
        are survivors: the dead node counted."""
        rx = re.compile(r".*mb node[0-9]*: view ([0-9]*), ([0-9]*) "
                        r"members.*")
        n, found = len(run.nodes.live), set()
        for k in run.nodes.live:
            for line in read_text(run.cl.path("ringd-%s.log" % k)
                                  ).splitlines():
                f = line.split()
                m = rx.match(line) if f and f[0] >= iso else None
                if m and m.group(1) and int(m.group(1)) > g0 and \
                        int(m.group(2) or 0) > n:
                    found.add("view %s: %s members" % m.groups())
        return "".join(x + ";" for x in sorted(found)[:3])

    def wait(self, run, v, fms, g0):
        back = now_ms()
        iso = datetime.datetime.fromtimestamp(
            back // 1000, datetime.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%S") + ".%03dZ" % (back % 1000)
        run.log("  etcd healthy again %d ms after the kill" % (back - fms))
        deadline = now_s() + RECOVER_S
        while True:
            res = run.logs.first_newgen(g0, run.nodes.live, fms)
            if res:
                break
            if now_s() >= deadline:
                run.hang("  daemon_etcd: HANG: no step in a new view within"
                         " %ds of etcd's return" % RECOVER_S)
                return
            run.check_alive()
            time.sleep(0.05)
        bad = self.bad_views(run, g0, iso)
        if bad:
            run.other_bad.append(
                "daemon_etcd: views after etcd's return count node%s, killed"
                " with etcd, as a member (%s %d survivors)"
                % (v, bad, len(run.nodes.live)))
        run.recovered(self.name, res[1] - back)
        run.log("  daemon_etcd: recovered: step %d (generation %d; %d at the"
                " fault) completed %d ms after etcd was back, %d ms after "
                "the kill%s" % (res[0], res[2], g0, res[1] - back,
                                res[1] - fms,
                                "; DEAD NODE IN A VIEW: " + bad if bad
                                else ""))

    def notes(self, run):
        if self.name not in run.inj:
            return []
        return ["  daemon_etcd: the row is from etcd's return (healthy) to "
                "the survivors' first step in a new view"]


def step_dir(run, st):
    return os.path.join(run.cl.ckjob, "step-%020d" % st)


def md5_files(d):
    """{path relative to the checkpoint directory: md5} of a step's
    files, as `md5sum chaos/step-S/*` run there lists them."""
    out = {}
    for p in sorted(glob.glob(os.path.join(d, "*"))):
        if os.path.isfile(p):
            with open(p, "rb") as f:
                out["chaos/%s/%s" % (os.path.basename(d),
                                     os.path.basename(p))] = \
                    hashlib.md5(f.read()).hexdigest()
    return out


class DiskFull(Kind):
    """dd fills the checkpoint file system for 4 s: checkpoints fail,
    training must not notice, the complete ones must stay intact."""
    name = "disk_full"

    def precondition(self, run):
        if not run.cl.ckpt_mounted:
            why = run.cl.ckpt_note or "no tmpfs"
            return (why, why)
        return None

    def check_and_free(self, run, fms, before, blast, sums, bad):
        """At fault + 4 s, while the disk is still full (nothing can be
        completed or retired then): the checkpoints complete before are
        there byte for byte (one may be gone only if a newer one
        completed: retention); then the space is freed."""
        for st in before:
            d = step_dir(run, st)
            if not os.path.isfile(os.path.join(d, "MANIFEST.json")):
                if run.cl.newest_ckpt() <= blast:
                    bad.append("disk_full: the checkpoint of step %d is no "
                               "longer complete" % st)
            else:
                want = {p: h for p, h in sums.items()
                        if p.startswith("chaos/%s/" % os.path.basename(d))}
                now = md5_files(d)
                diff = sorted(os.path.basename(p) for p, h in want.items()
                              if now.get(p) != h)
                if not want or diff:
                    bad.append("disk_full: the checkpoint of step %d "
                               "changed while the disk was full (%s)"
                               % (st, ", ".join(diff) or "no files"))
        try:
            os.unlink(os.path.join(run.cl.ckdir, "fill"))
        except OSError:
            pass
        run.log("  disk_full: the fill file removed %d ms after the fault"
                % (now_ms() - fms))

    def inject(self, run, v, r, fms, pre):
        cl = run.cl
        before = cl.ckpt_steps()
        blast = cl.newest_ckpt()
        sums = {}
        for st in before:
            sums.update(md5_files(step_dir(run, st)))
        with open(cl.path("ckpt-sums.%d" % run.nfaults), "w") as f:
            f.writelines("%s  %s\n" % (h, p) for p, h in sums.items())
        bstr = "".join("%d " % s for s in before)
        run.log("fault %s: checkpoint file system (%s %s) filled for 4 s "
                "(step %d; complete checkpoints: %s)"
                % (self.name, run.cfg.ckpt_tmpfs_size,
                   "ext4" if cl.ckpt_loop else "tmpfs", pre, bstr or "none"))
        subprocess.run(["dd", "if=/dev/zero", "of=" + os.path.join(
            cl.ckdir, "fill"), "bs=64k", "status=none"],
            stderr=subprocess.DEVNULL)
        df = subprocess.run(["df", "-h", "--output=used,avail", cl.ckdir],
                            stdout=subprocess.PIPE, text=True).stdout
        used = (df.strip().split("\n")[-1].split() + ["", ""])[:2]
        run.log("  checkpoint file system: %s used, %s free" % tuple(used))
        bad = []
        cl.later(fms, 4000, self.check_and_free, run, fms, before, blast,
                 sums, bad)
        run.record(self.name, fms, None)
        cl.settle()
        run.ckpt_bad.extend(bad)
        run.df_freed = run.max_step()
        run.log("  space freed at step %d; %d checkpoint failures logged so "
                "far; older checkpoints %s%s"
                % (run.df_freed, cl.ckpt_failures(),
                   "(%s) " % bstr if bstr else "",
                   "DAMAGED" if bad else "intact"))


class SlowDisk(Kind):
    """The checkpoint loop device throttled to 4 KiB/s and 2 I/Os a
    second for 4 s (blkio, root cgroup). The row: the longest time
    without a step of any node meanwhile; a view change, or no newer
    checkpoint within 30 s of the lift, fails the run."""
    name = "slow_disk"

    def precondition(self, run):
        if not run.cl.ckpt_loop:
            why = run.cl.slow_note or "no loop device"
            return (why, why)
        return None

    def inject(self, run, v, r, fms, pre):
        cl = run.cl
        g0 = run.logs.gen_at(fms)
        sk0 = cl.ckpt_skips()
        blast = cl.newest_ckpt()
        run.log("fault %s: checkpoint disk %s throttled to 4 KiB/s, 2 IOPS "
                "for 4 s (step %d; newest complete checkpoint: %d)"
                % (self.name, cl.ckpt_loop, pre, blast))
        if not cl.disk_throttle(4096, 2):
            raise Die("cannot throttle " + cl.ckpt_loop)
        cl.later(fms, 4000, cl.disk_throttle, 0)
        cl.settle()
        self.check(run, fms, g0, sk0, blast)

    def check(self, run, fms, g0, sk0, blast):
        cl, live = run.cl, run.nodes.live
        if run.until_step(live, run.max_step() + 1, fms) is None:
            run.hang("  slow_disk: HANG: no step within %ds" % RECOVER_S)
            return
        gap = run.logs.gap_in(live, fms, fms + 4000)
        g1 = run.logs.gen_at(now_ms())
        if g1 != g0:
            run.other_bad.append("slow_disk: the view changed (%d -> %d) "
                                 "while the checkpoint disk was slow"
                                 % (g0, g1))
        deadline = now_s() + 30
        while cl.newest_ckpt() <= blast and now_s() < deadline:
            run.check_alive()
            time.sleep(0.1)
        if cl.newest_ckpt() <= blast:
            run.ckpt_bad.append("slow_disk: no checkpoint newer than step %d"
                                " completed within 30 s of the disk being "
                                "fast again" % blast)
        n = cl.ckpt_skips() - sk0
        run.sd_skips += n
        run.recovered(self.name, gap)
        run.log("  slow_disk: longest time without a step while slow: %d ms;"
                " %d checkpoint(s) skipped (the previous one still being "
                "written); newest complete checkpoint now %d; generation %d "
                "-> %d" % (gap, n, cl.newest_ckpt(), g0, g1))

    def notes(self, run):
        if self.name not in run.inj:
            return []
        return ["  slow_disk: the row is the longest time without a step "
                "while the disk was slow; %d checkpoints skipped meanwhile "
                "(the previous one still being written)" % run.sd_skips]


class JobRestart(Kind):
    """Every daemon and trainer SIGKILLed at once, started again on the
    same hosts with fresh node ids; the job must resume from the newest
    complete checkpoint (checked at the end, checks.py)."""
    name = "job_restart"

    def precondition(self, run):
        if run.cfg.ckpt_every == 0:
            return ("checkpoints off", "checkpoints off")
        return None

    def reap_old(self, run, old):
        """Reap the killed; one that had died on its own is a crash."""
        procs, nd = run.cl.procs, run.nodes
        for k in old:
            for p in (nd.dpid[k], nd.tpid[k]):
                if p in procs.status:
                    continue
                st = procs.wait(p)
                procs.handled.add(p)
                if st == 137:
                    procs.expect[p] = "killed"
                else:
                    procs.expect[p] = "crashed"
                    nd.crash_notes.append(
                        "%s (pid %d) had exited with status %d before the "
                        "job_restart" % (procs.role[p], p, st))

    def inject(self, run, v, r, fms, pre):
        cl, nd = run.cl, run.nodes
        old = list(nd.live)
        kill_now(run, *[p for k in old for p in (nd.dpid[k], nd.tpid[k])])
        self.reap_old(run, old)
        # Nothing writes checkpoints now: the newest complete one is final.
        c = cl.newest_ckpt()
        cl.run_quiet(["cp", "-a", cl.ckjob,
                      cl.path("ckpt-at-restart.%d" % run.nfaults)])
        run.log("fault %s: SIGKILLed every daemon and trainer (%s; step %d, "
                "newest complete checkpoint: step %d)"
                % (self.name, node_list(old), pre, c))
        kpre = run.max_step()
        nd.live = []
        new = [nd.start_node(len(old), nd.hostof[k]) for k in old]
        run.log("  restarted as %s on the same hosts (last step before the "
                "kill: %d)" % (node_list(new), kpre))
        run.restarts.append((fms, c, kpre, old, new))
        run.record(self.name, fms, None, joiner=new)

    def notes(self, run):
        return ["  " + x for x in run.restart_lines]


class DaemonRestart(Kind):
    """`systemctl reload ringd` on one node: SIGUSR2, the exit (75)
    awaited, the daemon started again 1 s later. Recovery: until the
    node's own trainer completes a step in a later generation."""
    name = "daemon_restart"
    new_generation = True

    def inject(self, run, v, r, fms, pre):
        run.log("fault %s: SIGUSR2 node%s's daemon, started again 1 s after"
                " its exit (step %d)" % (self.name, v, pre))
        run.nodes.restart_daemon(v)
        if run.record(self.name, fms, None, joiner=[v]):
            run.restart_gap(self.name, v, fms)

    def notes(self, run):
        g = sorted(run.restart_gaps)
        if not g:
            return []
        return ["  daemon restarts: the other nodes' longest time without a "
                "step while a node restarted: median %d ms, max %d ms (%d "
                "restarts)" % (g[(len(g) + 1) // 2 - 1], g[-1], len(g))]


class RollingRestart(Kind):
    """An upgrade rolled over every live node, one at a time: ringctl
    generation, the node's daemon_restart, ringctl wait-member before the
    next. Each node's time is a sample of the row; the fault is
    recovered once every node is back."""
    name = "rolling_restart"
    new_generation = True

    def steps_needed(self, run):
        return run.cfg.per * (len(run.nodes.live) + 2) // 2

    def ringctl(self, run, *args):
        cl = run.cl
        return [os.path.join(run.cfg.build, "ringctl"), "--etcd",
                cl.etcd_val("ETCD_URL")] + cl.etcd.get("ETCD_SEC", []) + [
            "--job", "chaos"] + list(args)

    def one(self, run, k):
        """Restart node k; True once it is back (recorded)."""
        cl, bad = run.cl, run.nodes.restart_bad
        fms = now_ms()
        rlog = cl.path("roll-%s.log" % k)
        with open(rlog, "w") as err:
            g = subprocess.run(self.ringctl(run, "generation"), text=True,
                               stdout=subprocess.PIPE, stderr=err)
        if g.returncode != 0:
            bad.append("ringctl generation failed: " +
                       read_text(rlog).rstrip("\n"))
            return False
        run.nodes.restart_daemon(k)
        with open(rlog, "a") as out:
            rc = subprocess.run(self.ringctl(
                run, "--timeout", str(RECOVER_S), "wait-member",
                "node%s" % k, g.stdout.rstrip("\n")), stdout=out,
                stderr=subprocess.STDOUT).returncode
        lines = read_text(rlog).splitlines() or [""]
        if rc != 0:
            bad.append("node%s not back after its restart: %s"
                       % (k, lines[-1]))
            return False
        run.log("  node%s: %s" % (k, lines[0][:120]))
        if not run.record(self.name, fms, None, joiner=[k]):
            return False
        run.restart_gap(self.name, k, fms)
        return True

    def inject(self, run, v, r, fms, pre):
        run.log("fault %s: every node's daemon restarted in turn (%s; step "
                "%d)" % (self.name, " ".join(map(str, run.nodes.live)), pre))
        nback = 0
        for k in list(run.nodes.live):
            if not self.one(run, k):
                break
            nback += 1
        # One fault, one recovery (each node's time is in the row).
        if nback > 0:
            run.unrecover(self.name, nback)
            if nback == len(run.nodes.live):
                run.nrec += 1
                run.rec[self.name] += 1
