"""Node control: each node is a slot (node id nodeK) on a host (a
namespace), running one ringd daemon and one C trainer."""

import os
import re
import signal
import time

from chaoslib.cluster import Die, read_text

_LAST_WORDS = re.compile(r"Assertion|Segmentation fault| error \[")
_NOISE = re.compile(r"^(step|data|gemm|joined|collective)")


def last_words(path):
    """An assertion or error line if there is one (a backtrace ends with
    a rule), else the last line; at most 200 characters."""
    lines = read_text(path).splitlines()
    hits = [x for x in lines if _LAST_WORDS.search(x)]
    if hits and hits[-1]:
        return hits[-1][:200]
    rest = [x for x in lines if not _NOISE.match(x)]
    return rest[-1][:200] if rest else ""


class Nodes:
    def __init__(self, cl):
        self.cl = cl
        self.procs = cl.procs
        self.cfg = cl.cfg
        self.live = []       # slots meant to be running
        self.dpid, self.tpid, self.hostof = {}, {}, {}
        self.next = 1        # next fresh slot
        self.nexthost = 1    # next fresh host; a job restart reuses its
        self.crash_notes = []
        self.restart_bad = []

    def sock(self, k):
        return self.cl.path("node%s.sock" % k)

    def start_trainer(self, k):
        cfg, cl = self.cfg, self.cl
        argv = cl.host_cmd(self.hostof[k]) + [
            os.path.join(cfg.build, "examples/trainer"), "--socket",
            self.sock(k), "--cpu", "--steps", str(cfg.steps),
            "--log-every", str(cfg.steps // 4)]
        if cfg.step_delay_ms > 0:
            argv += ["--step-delay-ms", str(cfg.step_delay_ms)]
        if cfg.async_n > 0:
            argv += ["--async", str(cfg.async_n)]
        argv += ["--hash-log", cl.path("hash-%s.log" % k)]
        self.tpid[k] = self.procs.start(argv, cl.path("trainer-%s.log" % k),
                                        "trainer node%s" % k)

    def start_daemon(self, k, min_nodes):
        """The slot's daemon (node id, host and socket of the slot), until
        its socket is there; a restart starts it again with the same."""
        cfg, cl = self.cfg, self.cl
        dev = "eth0" if cl.netns else "lo"
        argv = cl.host_cmd(self.hostof[k]) + [
            "UCX_NET_DEVICES=" + dev, "UCX_TCP_CM_REUSEADDR=y",
            "UCX_WARN_UNUSED_ENV_VARS=n", "prlimit",
            "--nofile=%d:%d" % (cfg.nofile, cfg.nofile),
            os.path.join(cfg.build, "ringd"), "--etcd",
            cl.etcd_val("ETCD_URL")] + cl.etcd.get("ETCD_SEC", []) + [
            "--job", "chaos", "--node-id", "node%s" % k, "--host",
            "host%s" % self.hostof[k], "--socket", self.sock(k),
            "--trainers", "1", "--lease-ttl", "2", "--min-nodes",
            str(min_nodes), "--metrics", "off", "--step-timeout",
            str(cfg.step_timeout_ms)] + cl.ckpt_args()
        log = cl.path("ringd-%s.log" % k)
        self.dpid[k] = self.procs.start(argv, log, "daemon node%s" % k)
        for _ in range(250):
            if os.path.exists(self.sock(k)):
                return
            time.sleep(0.02)
        if not os.path.exists(self.sock(k)):
            tail = "\n".join(read_text(log).splitlines()[-5:])
            raise Die("node%s's daemon did not start:\n%s" % (k, tail))

    def start_node(self, min_nodes, host=None):
        """A fresh slot (node id), on a fresh host unless one is given;
        returns the slot."""
        k = self.next
        if host is None:
            host = self.nexthost
            if host > self.cl.maxslot:
                raise Die("out of hosts")
            self.nexthost += 1
        self.next += 1
        self.hostof[k] = host
        self.start_daemon(k, min_nodes)
        self.start_trainer(k)
        self.live.append(k)
        return k

    def drop_live(self, k):
        self.live = [x for x in self.live if x != k]

    def restart_daemon(self, k):
        """What `systemctl reload ringd` does on the slot's node: SIGUSR2
        (the daemon drains for a restart and exits 75), the unit's
        RestartSec=1, the daemon started again on the same socket. The
        slot's trainer waits for it and must survive."""
        dp, tp = self.dpid[k], self.tpid[k]
        self.procs.expect[dp] = "restarted"
        self.procs.signal(dp, signal.SIGUSR2)
        if not self.procs.wait_exit(dp, 300, 0.05):
            self.restart_bad.append("node%s's daemon did not exit within 15"
                                    " s of SIGUSR2" % k)
            self.procs.kill_reap(dp)
        else:
            rc = self.procs.status[dp]
            self.procs.handled.add(dp)
            if rc != 75:
                self.restart_bad.append("node%s's daemon exited %d on "
                                        "SIGUSR2, not 75" % (k, rc))
        time.sleep(1)  # the unit's RestartSec=1: systemd's delay
        self.start_daemon(k, 1)
        if not self.procs.alive(tp):
            self.restart_bad.append("node%s's trainer did not outlive its "
                                    "daemon's restart" % k)

    def check_alive(self):
        """A live node's process that exited on its own is a crash: it is
        recorded (the run fails) and the node carries on: a trainer is
        restarted on its daemon, a node whose daemon died is replaced by
        a fresh one. One per call; False when it found one."""
        p_ = self.procs
        for k in list(self.live):
            for p in (self.dpid[k], self.tpid[k]):
                if p_.alive(p) or p in p_.handled:
                    continue
                p_.handled.add(p)
                rc = p_.status[p]
                who = p_.role[p].split()[0]
                if (self.cl.logs.max_step() >= self.cfg.steps - 1 and
                        who == "trainer" and rc == 0):
                    continue
                p_.expect[p] = "crashed"
                lf = self.cl.path("%s-%s.log" % (
                    "ringd" if who == "daemon" else "trainer", k))
                note = "%s (pid %d) exited with status %d unprompted: %s" % (
                    p_.role[p], p, rc, last_words(lf))
                self.crash_notes.append(note)
                self.cl.log("CRASH: " + note)
                if who == "trainer" and p_.alive(self.dpid[k]):
                    self.start_trainer(k)
                    self.cl.log("  node%s's trainer restarted" % k)
                else:
                    self.drop_live(k)
                    for q in (self.dpid[k], self.tpid[k]):
                        if q not in p_.status:
                            p_.kill_reap(q)
                    n = self.start_node(1)
                    self.cl.log("  node%d started as node%s's replacement"
                                % (n, k))
                return False
        return True

    def check_all_alive(self):
        for _ in range(8):
            if self.check_alive():
                return
