#!/usr/bin/python3
"""chaos/chaos.py - seeded fault injection through a real training job.

  chaos/chaos.sh [-s SEED] [-f FAULTS] [-n NODES] [--quick] [--keep]
                 [--kinds a,b,c] [--plan] [--etcd3]

Starts etcd and NODES (default 4) nodes, each a ringd daemon with one C
trainer, as network namespaces on a private bridge (chaos/netns.sh) or,
where namespaces cannot be made, as processes on loopback (it says so,
and the network faults are then skipped). It injects FAULTS faults drawn
from SEED one at a time, waits for the job to make progress after each,
lets the job finish, then checks the invariants (chaos/README.md) and
prints a report whose last line is
  chaos: faults=<n> recovered=<n> lost_steps=<n> duplicated_steps=<n>
         hangs=<n> kill_recovery_median_ms=<x> hang_recovery_max_ms=<y>
Exit 0 when every check passed, 1 on a violation, 2 on bad usage. The
same SEED gives the same fault sequence. --quick: fewer steps and only
the robust faults (daemon kill, hang, scale up). Everything it starts is
killed by pid and removed on every exit path.

Environment: BUILD (default build), CHAOS_NETNS=0 (loopback),
CHAOS_KINDS (as --kinds; the option wins), CHAOS_ETCD3=1 (as --etcd3),
CHAOS_STEPS_PER_FAULT, CHAOS_STEP_DELAY_MS, CHAOS_ASYNC, CHAOS_NOFILE,
CHAOS_CKPT_INTERVAL, CHAOS_CKPT_TMPFS, CHAOS_STRICT=0, CHAOS_OUT.
"""

import os
import re
import signal
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chaoslib import checks, report                      # noqa: E402
from chaoslib.cluster import Cluster, Die, read_text     # noqa: E402
from chaoslib.draw import Lcg, bash_int, make_plan       # noqa: E402
from chaoslib.kinds import ALL_KINDS, BY_NAME, QUICK_KINDS  # noqa: E402
from chaoslib.nodes import Nodes                         # noqa: E402
from chaoslib.run import Run                             # noqa: E402


def usage():
    sys.stderr.write("usage: %s [-s SEED] [-f FAULTS] [-n NODES] [--quick] "
                     "[--keep] [--plan] [--kinds a,b,c] [--etcd3]\n"
                     "  kinds: %s\n" % (os.environ.get("CHAOS_ARGV0",
                                                        sys.argv[0]),
                                         " ".join(ALL_KINDS)))
    raise SystemExit(2)


def bad(msg):
    sys.stderr.write("chaos: %s\n" % msg)
    raise SystemExit(2)


def env_num(name, default, minimum=0):
    v = os.environ.get(name, "")
    v = v if v != "" else default
    if not re.fullmatch(r"[0-9]+", v) or int(v) < minimum:
        return None
    return int(v)


class Config:
    """The options and environment, checked as chaos.sh checked them."""

    def __init__(self, argv):
        self.seed, self.faults, self.nodes = None, "10", "4"
        self.quick = self.keep = self.plan_only = False
        kinds = os.environ.get("CHAOS_KINDS", "")
        self.etcd3 = os.environ.get("CHAOS_ETCD3", "0") == "1"
        a = list(argv)
        while a:
            o = a.pop(0)
            if o in ("-s", "-f", "-n", "--kinds"):
                if not a:
                    usage()
                v = a.pop(0)
                if o == "-s":
                    self.seed = v
                elif o == "-f":
                    self.faults = v
                elif o == "-n":
                    self.nodes = v
                else:
                    kinds = v
            elif o.startswith("--kinds="):
                kinds = o[len("--kinds="):]
            elif o in ("--quick", "--keep", "--plan", "--etcd3"):
                setattr(self, {"--quick": "quick", "--keep": "keep",
                               "--plan": "plan_only",
                               "--etcd3": "etcd3"}[o], True)
            else:
                usage()
        self.check(kinds)

    def check(self, kinds):
        if self.seed in (None, ""):
            self.seed = str(int.from_bytes(os.urandom(4), "little")
                            % 1000000)
        if not re.fullmatch(r"[0-9]+", self.seed):
            bad("SEED must be a number")
        if not re.fullmatch(r"[0-9]+", self.faults) or \
                int(self.faults) > 200:
            bad("FAULTS must be 0..200")
        self.faults = int(self.faults)
        if not re.fullmatch(r"[0-9]+", self.nodes) or \
                not 2 <= int(self.nodes) <= 8:
            bad("NODES must be 2..8")
        self.nodes = int(self.nodes)
        self.sel = []
        for k in kinds.split(",") if kinds else []:
            if not k:
                continue
            if k not in BY_NAME:
                bad("unknown fault kind '%s' (kinds: %s)"
                    % (k, " ".join(ALL_KINDS)))
            if k not in self.sel:
                self.sel.append(k)
        if kinds and not self.sel:
            bad("--kinds: no kind given")

    def check_env(self):
        """The numbers from the environment (after the plan, as before)."""
        self.build = os.environ.get("BUILD", "build")
        per = "2500" if self.quick else "4000"
        self.per = int(os.environ.get("CHAOS_STEPS_PER_FAULT", "") or per)
        self.steps = self.faults * self.per + 2000
        self.step_delay_ms = env_num("CHAOS_STEP_DELAY_MS", "0")
        if self.step_delay_ms is None:
            bad("CHAOS_STEP_DELAY_MS must be a number of ms")
        self.async_n = env_num("CHAOS_ASYNC", "0")
        if self.async_n is None or self.async_n > 128:
            bad("CHAOS_ASYNC must be a number of pieces, 0..128")
        self.step_timeout_ms = 20000
        self.nofile = env_num("CHAOS_NOFILE", "256", 64)
        if self.nofile is None:
            bad("CHAOS_NOFILE must be a number >= 64")
        self.ckpt_every = env_num("CHAOS_CKPT_INTERVAL", "250")
        if self.ckpt_every is None:
            bad("CHAOS_CKPT_INTERVAL must be a number")
        self.ckpt_tmpfs_size = os.environ.get("CHAOS_CKPT_TMPFS", "") or "16m"
        strict = os.environ.get("CHAOS_STRICT", "") or "1"
        if strict not in ("0", "1"):
            bad("CHAOS_STRICT must be 0 or 1")
        self.strict = strict == "1"
        self.root = os.getcwd()


def plan(cfg):
    """Print the replay line and the plan; the plan (kind, r) pairs."""
    kargs = " --kinds " + ",".join(cfg.sel) if cfg.sel else ""
    print("chaos: seed=%s faults=%d nodes=%d quick=%d (replay: chaos/chaos.sh"
          " -s %s -f %d -n %d%s%s%s)" % (
              cfg.seed, cfg.faults, cfg.nodes, cfg.quick, cfg.seed,
              cfg.faults, cfg.nodes, " --quick" if cfg.quick else "", kargs,
              " --etcd3" if cfg.etcd3 else ""), flush=True)
    try:
        seed = bash_int(cfg.seed)
    except ValueError:
        bad("SEED %s: value too great for base" % cfg.seed)
    kinds = cfg.sel or (QUICK_KINDS if cfg.quick else ALL_KINDS)
    p = make_plan(Lcg(seed), kinds, cfg.faults, cfg.quick)
    return p


def start(cfg, cl, plan_kinds):
    """Hosts, the checkpoint directory, the reference run and etcd."""
    B = cfg.build
    for f in ("ringd", "ringctl", "examples/trainer"):
        if not os.access(os.path.join(B, f), os.X_OK):
            raise Die("%s/%s is missing: run make first" % (B, f))
    if subprocess.run(["sh", "-c", "command -v etcd"],
                      stdout=subprocess.DEVNULL).returncode != 0:
        raise Die("etcd not found: run make deps")
    cl.hosts_up()
    cl.ckpt_setup(plan_kinds)
    ref = cl.path("reference.log")
    with open(ref, "wb") as out:
        if subprocess.run([os.path.join(B, "examples/trainer"), "--no-daemon",
                           "--cpu", "--steps", str(cfg.steps), "--log-every",
                           str(cfg.steps)], stdout=out,
                          stderr=subprocess.STDOUT).returncode != 0:
            raise Die("the reference run failed")
    m = re.search(r"^final: test_accuracy ([0-9.]*)", read_text(ref), re.M)
    ref_acc = m.group(1) if m else ""
    print("chaos: reference (one process, %d steps): test_accuracy %s"
          % (cfg.steps, ref_acc), flush=True)
    cl.start_etcd()
    return ref_acc


def main(argv):
    cfg = Config(argv)
    p = plan(cfg)
    cfg.check_env()
    for kind, _ in p:
        # A rolling restart is a restart per node, one after the other:
        # the job gets steps for each (the nodes a scale_up may add).
        if kind == "rolling_restart":
            cfg.steps += cfg.per * (cfg.nodes + 2) // 2
    print("chaos: plan: " + " ".join(k for k, _ in p), flush=True)
    if cfg.plan_only:
        return 0
    cl = Cluster(cfg)
    try:
        return run_all(cfg, cl, p)
    except Die as e:
        if str(e):
            sys.stderr.write("chaos: %s\n" % e)
        return 1
    finally:
        cl.cleanup()


def run_all(cfg, cl, p):
    ref_acc = start(cfg, cl, {k for k, _ in p})
    nodes = Nodes(cl)
    run = Run(cl, nodes, BY_NAME)
    run.ref_acc = ref_acc
    for _ in range(cfg.nodes):
        nodes.start_node(cfg.nodes)
    cl.log("etcd and %d nodes up; training %d steps" % (cfg.nodes,
                                                         cfg.steps))
    if not run.wait_step(0, 60):
        raise Die("the job did not start (see %s)" % cl.T)
    run.play(p)
    run.finish()
    checks.check_all(run)
    outdir = os.environ.get("CHAOS_OUT", "") or os.path.join(cfg.build,
                                                             "chaos")
    plot, note = report.plot_loss(run, outdir)
    text = report.report(run, outdir, plot, note)
    cl.reported = True
    print("\n" + text, end="", flush=True)
    try:
        os.makedirs(outdir, exist_ok=True)
        with open(os.path.join(outdir, "chaos-%s.txt" % cfg.seed), "w") as f:
            f.write(text)
    except OSError:
        pass
    return 0 if not run.fail else 1


def on_signal(signum, frame):
    raise SystemExit(130)


if __name__ == "__main__":
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    from chaoslib.procs import become_subreaper
    become_subreaper()
    sys.exit(main(sys.argv[1:]))
