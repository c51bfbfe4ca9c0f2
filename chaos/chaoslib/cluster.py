"""The run's machinery: the temp dir, hosts (chaos/netns.sh), etcd
(chaos/cluster.sh, called through a bash bridge), the checkpoint file
system, background helpers, logging and the cleanup on every exit path.
"""

import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from chaoslib.hashlog import HashLogs
from chaoslib.procs import Procs

THROTTLE = "/sys/fs/cgroup/blkio/blkio.throttle"

# Runs one cluster.sh function with the state the last call left in
# T/cluster.env (CH_SAVE=1: the call's state is saved there again), and
# writes the variables the harness reads to T/cluster.vars, one per line:
# the name, then each element, tab-separated.
BRIDGE = r'''
set -u
T=$CH_T; NETNS=$CH_NETNS; PREFIX=$CH_PREFIX; SUBNET=$CH_SUBNET; PIDS=()
die() { echo "chaos: $*" >&2; exit 1; }
. chaos/cluster.sh
[ -f "$T/cluster.env" ] && . "$T/cluster.env"
stop_wait() { rd_stop_until "$@"; wait "$HELPER"; }
"$@"; rc=$?
if [ "${CH_SAVE:-0}" = 1 ]; then
    # (declare -p fails on the names that are not set, listing the rest)
    declare -p ETCD_URL EP ETCD_PID ETCD_PIDS EPS ETCD_CMD ETCD_SEC \
        ETCD_SCHEME ETCD_CURL ETCD_TLS_ARGS ETCD_SECURE \
        >"$T/cluster.env.new" 2>/dev/null
    mv "$T/cluster.env.new" "$T/cluster.env"
    for v in ETCD_URL ETCD_PID ETCD_PIDS EPS ETCD_SEC ETCD_SCHEME \
             ETCD_CURL ETCD_SECURE; do
        declare -n r=$v
        printf '%s' "$v"
        for x in ${r[@]+"${r[@]}"}; do printf '\t%s' "$x"; done
        printf '\n'
        unset -n r
    done >"$T/cluster.vars"
fi
exit $rc
'''


def now_ms():
    return int(time.time() * 1000)


def now_s():
    return int(time.time())


class Die(Exception):
    """chaos: MESSAGE on stderr, exit 1 (after the cleanup)."""


def read_text(path):
    try:
        with open(path, "r", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def grep_count(paths, pattern):
    rx = re.compile(pattern)
    return sum(1 for p in paths for line in read_text(p).splitlines()
               if rx.search(line))


class Cluster:
    def __init__(self, cfg):
        self.cfg = cfg
        self.root = cfg.root
        self.B = cfg.build
        self.T = tempfile.mkdtemp(prefix="ringd-chaos.", dir="/tmp")
        self.prefix = ("ch%d" % os.getpid())[:8]
        self.maxslot = min(cfg.nodes + 4 * cfg.faults + 1, 50)
        self.netns = False
        self.subnet = ""
        self.procs = Procs()
        self.logs = HashLogs(self.T)
        self.t0 = now_ms()
        self.keep = cfg.keep
        self.reported = False
        self.helpers = []         # Popen or threading.Thread
        self.helper = None        # the latest: `settle` waits for it
        self.ipt_ns, self.qdisc_dev, self.link_down = [], [], []
        self.ckdir = os.path.join(self.T, "ckpt")
        self.ckjob = os.path.join(self.ckdir, "chaos")
        self.ckpt_mounted = False
        self.ckpt_loop = ""
        self.ckpt_note = self.slow_note = ""
        self.etcd = {}
        self.etcd_old = []
        self.single_etcd = []     # the one etcd's pid (without --etcd3)
        self.cleaned = False

    # ---- logging ------------------------------------------------------
    def log(self, msg):
        d = now_ms() - self.t0
        print("chaos: [%d.%ds] %s" % (d // 1000, d % 1000 // 100, msg),
              flush=True)

    def path(self, *parts):
        return os.path.join(self.T, *parts)

    # ---- hosts ----------------------------------------------------------
    def hosts_up(self):
        """Namespaces from netns.sh where they can be made; else
        loopback (and says so)."""
        ok = (os.environ.get("CHAOS_NETNS", "1") != "0" and
              os.geteuid() == 0 and
              subprocess.run(["chaos/netns.sh", "check"],
                             stderr=subprocess.DEVNULL).returncode == 0)
        if ok:
            r = subprocess.run(["chaos/netns.sh", "up", self.prefix,
                                str(self.maxslot)], stdout=subprocess.PIPE,
                               text=True)
            if r.returncode != 0:
                raise Die("cannot make namespaces")
            self.subnet = r.stdout.strip().split("subnet=")[-1]
            self.netns = True
            print("chaos: nodes are network namespaces %sh1..%d on a "
                  "private bridge, %s.0/24" % (self.prefix, self.maxslot,
                                               self.subnet), flush=True)
        else:
            print("chaos: network namespaces are not available here (root "
                  "and ip netns needed, or CHAOS_NETNS=0); running the nodes"
                  " as processes on loopback: link-down, packet-loss and "
                  "slow-link faults are skipped", flush=True)

    def host_cmd(self, host):
        """The prefix that runs a program on a host (each part execs the
        next, so the pid is the program's): rd_host_cmd."""
        if self.netns:
            return ["ip", "netns", "exec", "%sh%s" % (self.prefix, host),
                    "env"]
        return ["env"]

    def veth(self, host):
        return "%sv%s" % (self.prefix, host)

    def ns(self, host):
        return "%sh%s" % (self.prefix, host)

    # ---- cluster.sh ---------------------------------------------------------
    def _bridge_env(self, save):
        env = dict(os.environ, CH_T=self.T, CH_NETNS="1" if self.netns
                   else "0", CH_PREFIX=self.prefix, CH_SUBNET=self.subnet,
                   CH_SAVE="1" if save else "0")
        return env

    def bridge(self, *args):
        """Run a cluster.sh function; its exit status. The etcd state it
        leaves is read back into self.etcd; etcds it started (orphaned
        when the bash exits) are ours, as a subreaper."""
        argv = ["bash", "-c", BRIDGE, "bridge"] + [str(a) for a in args]
        rc = subprocess.run(argv, env=self._bridge_env(True)).returncode
        for line in read_text(self.path("cluster.vars")).splitlines():
            x = line.split("\t")
            self.etcd[x[0]] = x[1:]
        return rc

    def bridge_bg(self, *args):
        """A cluster.sh function in the background, in a session of its
        own (the cleanup ends it and its subshells by process group)."""
        argv = ["bash", "-c", BRIDGE, "bridge"] + [str(a) for a in args]
        p = subprocess.Popen(argv, env=self._bridge_env(False),
                             stdin=subprocess.DEVNULL,
                             start_new_session=True)
        self.helpers.append(p)
        self.helper = p
        return p

    def start_etcd(self):
        """etcd through cluster.sh (rd_start_etcd, or rd_start_etcd3 with
        --etcd3): ports found free, TLS and auth, retried on a port taken
        meanwhile."""
        if self.bridge("rd_start_etcd3" if self.cfg.etcd3 else
                       "rd_start_etcd", "chaos") != 0:
            raise Die("")
        if self.cfg.etcd3:
            for p in self.etcd_pids():
                self.etcd_adopt(p)
            print("chaos: etcd: 3 members, client ports " +
                  " ".join(self.etcd["EPS"]), flush=True)
        else:
            self.etcd_adopt(self.etcd_val("ETCD_PID"))
            self.single_etcd = [int(self.etcd_val("ETCD_PID"))]
        print("chaos: etcd at %s (%s)" % (
            self.etcd_val("ETCD_URL"),
            "TLS, password auth" if self.etcd_val("ETCD_SECURE") == "1"
            else "plain http, no auth"), flush=True)

    def etcd_val(self, name):
        v = self.etcd.get(name, [])
        return v[0] if v else ""

    def etcd_adopt(self, pid):
        self.procs.adopt(int(pid), "etcd", "ok")

    def etcd_pids(self):
        return [int(p) for p in self.etcd.get("ETCD_PIDS", []) if p]

    # ---- background helpers --------------------------------------------
    def later(self, fms, ms, fn, *args):
        """fn(*args) ms milliseconds after the fault at fms, in a thread
        (so the recovery is measured while the fault lasts)."""
        stop = threading.Event()

        def body():
            delay = (fms + ms - now_ms()) / 1000.0
            if delay > 0 and stop.wait(delay):
                return
            fn(*args)
        t = threading.Thread(target=body, daemon=True)
        t.stop = stop
        t.start()
        self.helpers.append(t)
        self.helper = t

    def settle(self):
        h = self.helper
        if isinstance(h, threading.Thread):
            h.join()
        elif h is not None:
            h.wait()

    def stop_for(self, pid, fms, ms):
        """SIGSTOP pid now; rd_stop_until continues it at fms + ms and
        stops it again if anything else continues it meanwhile (counted
        in T/cont)."""
        os.kill(pid, signal.SIGSTOP)
        self.bridge_bg("stop_wait", pid, fms + ms, self.path("cont"))

    def stray_conts(self):
        return len(read_text(self.path("cont")).splitlines())

    def run_quiet(self, argv):
        return subprocess.run(argv, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode

    # ---- the checkpoint directory --------------------------------------
    def ckpt_loop_mount(self):
        """ext4 on a loop device (slow_disk can throttle it); the reason
        when it cannot be made."""
        size = self.cfg.ckpt_tmpfs_size
        if os.geteuid() != 0:
            return "root needed"
        if not os.access(THROTTLE + ".write_bps_device", os.W_OK):
            return "no blkio throttle (%s.write_bps_device)" % THROTTLE
        img = self.path("ckpt.img")
        if (self.run_quiet(["truncate", "-s", size, img]) != 0 or
                self.run_quiet(["mkfs.ext4", "-q", "-F", "-m", "0", "-E",
                                "lazy_itable_init=0,lazy_journal_init=0",
                                img]) != 0):
            return "mkfs.ext4 failed"
        r = subprocess.run(["losetup", "-f", "--show", img], text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            return "losetup: " + r.stdout.strip()
        self.ckpt_loop = r.stdout.strip()
        r = subprocess.run(["mount", "-o", "noatime", self.ckpt_loop,
                            self.ckdir], text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
        if r.returncode != 0:
            return r.stdout.strip()
        self.ckpt_mounted = True
        return None

    def ckpt_setup(self, plan_kinds):
        os.makedirs(self.ckdir, exist_ok=True)
        cfg = self.cfg
        if cfg.ckpt_every == 0:
            self.ckpt_note = "checkpoints off (CHAOS_CKPT_INTERVAL=0)"
            self.slow_note = self.ckpt_note
        elif "disk_full" in plan_kinds or "slow_disk" in plan_kinds:
            why = self.ckpt_loop_mount()
            if why is not None:
                self.slow_note = ("no loop device for the checkpoints: " +
                                  why[:200])
                if self.ckpt_loop:
                    self.run_quiet(["losetup", "-d", self.ckpt_loop])
                self.ckpt_loop = ""
                r = None
                if os.geteuid() == 0:
                    r = subprocess.run(
                        ["mount", "-t", "tmpfs", "-o", "size=%s,mode=0755"
                         % cfg.ckpt_tmpfs_size, "chaos-ckpt", self.ckdir],
                        text=True, stderr=subprocess.PIPE)
                if r is not None and r.returncode == 0:
                    self.ckpt_mounted = True
                else:
                    self.ckpt_note = ("no file system for the checkpoints "
                                      "(root needed): " +
                                      (r.stderr.strip() if r else ""))
                    self.slow_note = self.ckpt_note
        if cfg.ckpt_every != 0:
            fs = ""
            if self.ckpt_mounted:
                fs = " (a %s of %s)" % (
                    "ext4 on " + self.ckpt_loop if self.ckpt_loop
                    else "tmpfs", cfg.ckpt_tmpfs_size)
            print("chaos: checkpoints every %d steps in %s%s"
                  % (cfg.ckpt_every, self.ckdir, fs), flush=True)

    def ckpt_args(self):
        if self.cfg.ckpt_every == 0:
            return []
        return ["--ckpt-interval", str(self.cfg.ckpt_every),
                "--ckpt-dir", self.ckdir]

    def ckpt_steps(self):
        """Complete checkpoints (a MANIFEST.json in their directory)."""
        out = []
        for m in glob.glob(os.path.join(self.ckjob, "step-*",
                                        "MANIFEST.json")):
            if os.path.isfile(m):
                d = os.path.basename(os.path.dirname(m))[len("step-"):]
                if d.isdigit():
                    out.append(int(d))
        return sorted(out)

    def newest_ckpt(self):
        s = self.ckpt_steps()
        return s[-1] if s else -1

    def ringd_logs(self):
        return sorted(glob.glob(self.path("ringd-*.log")))

    def ckpt_failures(self):
        return grep_count(self.ringd_logs(),
                          r"checkpoint of step [0-9]* (failed|not completed)")

    def ckpt_skips(self):
        return grep_count(self.ringd_logs(),
                          r"checkpoint of step [0-9]* skipped")

    def disk_throttle(self, bps, iops=0):
        """The checkpoint loop device's read and write limits for every
        process (the root blkio cgroup); 0 lifts them."""
        try:
            rdev = os.stat(self.ckpt_loop).st_rdev
        except OSError:
            return False
        mm = "%d:%d" % (os.major(rdev), os.minor(rdev))
        try:
            for w in ("read", "write"):
                with open("%s.%s_bps_device" % (THROTTLE, w), "w") as f:
                    f.write("%s %s\n" % (mm, bps))
                with open("%s.%s_iops_device" % (THROTTLE, w), "w") as f:
                    f.write("%s %s\n" % (mm, iops))
        except OSError:
            return False
        return True

    # ---- cleanup ----------------------------------------------------------
    def cleanup(self):
        if self.cleaned:
            return
        self.cleaned = True
        self.procs.kill_all()
        for h in self.helpers:
            if isinstance(h, threading.Thread):
                h.stop.set()
            elif h.poll() is None:
                try:
                    os.killpg(h.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
                h.wait()
        for ns in self.ipt_ns:
            self.run_quiet(["ip", "netns", "exec", ns, "iptables", "-F"])
        for d in self.qdisc_dev:
            self.run_quiet(["tc", "qdisc", "del", "dev", d, "root"])
        for d in self.link_down:
            self.run_quiet(["ip", "link", "set", d, "up"])
        if self.netns:
            subprocess.run(["chaos/netns.sh", "down", self.prefix,
                            str(self.maxslot)])
        if self.ckpt_loop:
            self.disk_throttle(0)
        if self.ckpt_mounted:
            try:
                os.unlink(os.path.join(self.ckdir, "fill"))
            except OSError:
                pass
            if self.keep:
                self.run_quiet(["cp", "-a", self.ckdir,
                                self.path("ckpt.kept")])
            if self.run_quiet(["umount", self.ckdir]) != 0:
                self.run_quiet(["umount", "-l", self.ckdir])
            self.ckpt_mounted = False
        if self.ckpt_loop:
            self.run_quiet(["losetup", "-d", self.ckpt_loop])
        if self.keep:
            if not self.reported:
                print("chaos: kept " + self.T, flush=True)
        else:
            shutil.rmtree(self.T, ignore_errors=True)
        sys.stdout.flush()
