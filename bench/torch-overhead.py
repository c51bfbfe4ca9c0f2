#!/usr/bin/python3
"""bench/torch-overhead.py - what ringd.torch costs a training step.

One model (an MLP 1024-4096-4096-1024, 25.2 M parameters, SGD), up to
four ways, in the same run, interleaved round by round:

  local      one process, no communication: the floor
  ringd      DistributedOptimizer, --procs trainers on loopback (default
             2: etcd, a ringd daemon per node, --per-node trainers on
             each, default 1)
  ddp        torch.nn.parallel.DistributedDataParallel, gloo, --procs
             processes
  ddp-ringd  the same DistributedDataParallel on the `ringd`
             torch.distributed backend (ringd.torch.distributed), on the
             ringd way's daemons and trainers (not in the default --ways:
             `--ways local,ringd,ddp,ddp-ringd`)

Each way runs --steps timed steps after --warmup untimed ones, --reps
rounds; a way's figure is the median over every timed step of every
round (rank 0's). Prints a TSV table, then a second one: the CPU time a
step costs each class of process and thread of each way, summed over
the way's processes (trainers' main threads and their other threads;
ringd's daemons split into the main loop, the ring thread, UCX's async
thread and the rest; the etcd the ringd way uses), sampled from
/proc/PID/task/*/schedstat by each trainer just before its first and
after its last timed step, a median over the rounds. Last line
`torch: overhead_pct=<x> step_ms=<x> ddp_step_ms=<x> local_cpu_ms=<x>
ringd_cpu_ms=<x> ddp_cpu_ms=<x>` (overhead: ringd over local; *_cpu_ms:
all the way's processes' CPU per step). Needs `make all` (build/ringd,
build/libringd.so) and etcd.

    /usr/bin/python3 bench/torch-overhead.py [--reps 5] [--steps 20]
        [--procs 4] [--per-node 2] [--ways local,ringd,ddp,ddp-ringd]

With ddp-ringd among the ways the last line adds ddp_ringd_step_ms= and
ddp_ringd_vs_gloo= (the ringd backend's median step time over gloo's,
measured in the same rounds: below 1 is faster).
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIMS = (1024, 4096, 4096, 1024)
# The daemon's threads by name (ringd names its ring thread; UCX 1.13
# names its progress thread "async"); any other is "other".
DAEMON_THREADS = {"ringd-ring": "ring", "async": "ucx_async"}
# Variants of the ringd way: the daemons' environment.
WAY_ENV = {"ringd-fixed": {"RINGD_RING_SPIN_ADAPT": "0"}}


def task_times(pid):
    """{tid: (comm, ns on a CPU, ns runnable waiting)} of a process's
    live threads (a thread gone before the second sample is lost: only
    short-lived helpers, e.g. a resolver, ever are)."""
    base = "/proc/%d/task" % pid
    out = {}
    try:
        tids = os.listdir(base)
    except OSError:
        return out
    for t in tids:
        try:
            with open("%s/%s/comm" % (base, t)) as f:
                comm = f.read().strip()
            with open("%s/%s/schedstat" % (base, t)) as f:
                run, wait = (int(x) for x in f.read().split()[:2])
        except (OSError, ValueError):
            continue
        out[int(t)] = (comm, run, wait)
    return out


def thread_class(kind, pid, tid, comm):
    if kind == "etcd":
        return "etcd"
    if tid == pid:
        return kind + ".main"
    if kind == "daemon":
        return "daemon." + DAEMON_THREADS.get(comm, "other")
    return kind + ".threads"


def cpu_delta(watch, before, after):
    """{class: [run ns, wait ns, threads]} between two samples of the
    processes in watch ([(kind, pid)])."""
    acc = {}
    for (kind, pid), b, a in zip(watch, before, after):
        for tid, (comm, run, wait) in a.items():
            _, run0, wait0 = b.get(tid, (comm, 0, 0))
            c = acc.setdefault(thread_class(kind, pid, tid, comm),
                               [0, 0, 0])
            c[0] += run - run0
            c[1] += wait - wait0
            c[2] += 1
    return acc


def model_and_data(torch, o):
    torch.manual_seed(5)
    layers = []
    for i in range(len(DIMS) - 1):
        layers.append(torch.nn.Linear(DIMS[i], DIMS[i + 1]))
        if i < len(DIMS) - 2:
            layers.append(torch.nn.ReLU())
    m = torch.nn.Sequential(*layers)
    g = torch.Generator()
    g.manual_seed(6 + o.rank)
    x = torch.randn(o.batch, DIMS[0], generator=g)
    y = torch.randn(o.batch, DIMS[-1], generator=g)
    return m, x, y


def worker(o):
    """One process of one way; writes its step times (ms) as JSON."""
    import torch
    torch.set_num_threads(o.threads)
    m, x, y = model_and_data(torch, o)
    times = []
    if o.worker == "ringd":
        import ringd.torch as rt
        c = rt.init(o.socket, name="torch-overhead")
        opt = rt.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=1e-3),
            named_parameters=m.named_parameters())
        whole_world(c, o)
        c.step_end()
        begin, end = c.step_begin, c.step_end
    elif o.worker == "ddp-ringd":
        import ringd.torch as rt
        import ringd.torch.distributed as rdist
        c = rt.init(o.socket, name="torch-overhead-ddp")
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        rdist.init_process_group(view=whole_world(c, o))
        m = torch.nn.parallel.DistributedDataParallel(m)  # in that step
        rdist.group().flush()
        c.step_end()

        def end():
            rdist.group().flush()       # DDP's last bucket, then the end
            c.step_end()
        begin = c.step_begin
    else:
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        begin = end = lambda: None
        if o.worker == "ddp":
            import torch.distributed as dist
            dist.init_process_group(
                "gloo", init_method="tcp://127.0.0.1:%d" % o.port,
                rank=o.rank, world_size=o.procs)
            m = torch.nn.parallel.DistributedDataParallel(m)
    watch = [("trainer", os.getpid())]
    watch += [("daemon", p) for p in o.daemon_pid]
    watch += [("etcd", p) for p in o.etcd_pid]
    before = None
    for i in range(o.warmup + o.steps):
        if i == o.warmup:
            before = [task_times(p) for _, p in watch]
        t0 = time.perf_counter()
        begin()
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        end()
        if i >= o.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    cpu = cpu_delta(watch, before, [task_times(p) for _, p in watch])
    with open(o.out, "w") as f:
        json.dump({"times": times, "cpu": cpu}, f)
    return 0


def whole_world(c, o):
    """Empty steps until every trainer is in the view (a node's trainers
    connect one after another, and a view change inside a timed step
    would be a failure, not a figure); returns the view of the step this
    leaves begun."""
    deadline = time.monotonic() + 120
    while True:
        v = c.step_begin()
        if v.world == o.procs:
            return v
        if time.monotonic() > deadline:
            sys.exit("torch-overhead: the view never held %d trainers "
                     "(world %d)" % (o.procs, v.world))
        c.step_end()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, what, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            sys.exit("torch-overhead: %s did not happen in %d s" %
                     (what, timeout_s))
        time.sleep(0.02)


class Bench:
    def __init__(self, o):
        self.o = o
        self.tmp = tempfile.mkdtemp(prefix="ringd-torchbench.")
        self.procs = []
        self.env = dict(os.environ,
                        RINGD_LIB=os.path.join(ROOT, o.build, "libringd.so"),
                        PYTHONPATH=os.path.join(ROOT, "client/python"),
                        UCX_NET_DEVICES="lo", UCX_TCP_CM_REUSEADDR="y",
                        UCX_WARN_UNUSED_ENV_VARS="n")

    def spawn(self, argv, log, env=None):
        p = subprocess.Popen(argv, env=dict(self.env, **(env or {})),
                             stdout=open(log, "w"), stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def path(self, name):
        return os.path.join(self.tmp, name)

    def start_etcd(self):
        port = free_port()
        peer = free_port()
        self.etcd_url = "http://127.0.0.1:%d" % port
        self.etcd = self.spawn(["etcd", "--name", "bench", "--data-dir",
                    self.path("etcd"), "--listen-client-urls", self.etcd_url,
                    "--advertise-client-urls", self.etcd_url,
                    "--listen-peer-urls", "http://127.0.0.1:%d" % peer,
                    "--initial-advertise-peer-urls",
                    "http://127.0.0.1:%d" % peer, "--initial-cluster",
                    "bench=http://127.0.0.1:%d" % peer,
                    "--log-level", "warn"], self.path("etcd.log"))

        def up():
            try:
                with socket.create_connection(("127.0.0.1", port), 0.2):
                    return True
            except OSError:
                return False
        wait_for(up, "etcd listening")

    def daemons(self, job, nodes=2, env=None, per_node=1):
        ds = []
        for n in "abcdefgh"[:nodes]:
            sock = self.path("%s-%s.sock" % (job, n))
            ds.append((self.spawn(
                [os.path.join(ROOT, self.o.build, "ringd"), "--etcd",
                 self.etcd_url, "--job", job, "--node-id", n, "--socket",
                 sock, "--trainers", str(per_node), "--min-nodes",
                 str(nodes),
                 "--metrics", "off"], self.path("%s-%s.log" % (job, n)),
                env), sock))
        for _, sock in ds:
            wait_for(lambda: os.path.exists(sock), "ringd socket " + sock)
        return ds

    def run_way(self, way, rnd):
        o = self.o
        n = 1 if way == "local" else o.procs
        extra = [[] for _ in range(n)]
        ds = []
        if way.startswith("ringd") or way == "ddp-ringd":
            k = o.per_node
            ds = self.daemons("tb%d-%d%s" % (os.getpid(), rnd,
                                             way.replace("ringd", "")),
                              n // k, WAY_ENV.get(way), k)
            # The daemons' CPU is counted once, by each node's first
            # trainer.
            extra = [["--socket", ds[r // k][1]] +
                     (["--daemon-pid", str(ds[r // k][0].pid)]
                      if r % k == 0 else []) for r in range(n)]
            extra[0] += ["--etcd-pid", str(self.etcd.pid)]
        elif way == "ddp":
            port = free_port()
            extra = [["--port", str(port)] for _ in range(n)]
        ws = []
        for r in range(n):
            out = self.path("%s-%d-%d.json" % (way, rnd, r))
            argv = [sys.executable, os.path.abspath(__file__), "--worker",
                    "ddp-ringd" if way == "ddp-ringd" else way.split("-")[0],
                    "--rank", str(r), "--out", out,
                    "--batch", str(o.batch), "--steps", str(o.steps),
                    "--warmup", str(o.warmup), "--threads", str(o.threads),
                    "--procs", str(n)] + extra[r]
            ws.append((self.spawn(argv, out + ".log"), out))
        for p, out in ws:
            try:
                rc = p.wait(o.timeout)
            except subprocess.TimeoutExpired:
                rc = "timeout"
            if rc != 0:
                with open(out + ".log") as f:
                    sys.stderr.write(f.read()[-3000:])
                sys.exit("torch-overhead: %s worker failed (%s)" % (way, rc))
        for p, _ in ds:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
        cpu = {}
        for _, out in ws:
            with open(out) as f:
                for k, (run, wait, nthr) in json.load(f)["cpu"].items():
                    c = cpu.setdefault(k, [0, 0, 0])
                    c[0] += run
                    c[1] += wait
                    c[2] += nthr
        with open(ws[0][1]) as f:
            return json.load(f)["times"], cpu

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if self.o.keep:
            print("torch-overhead: kept %s" % self.tmp, file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", choices=("local", "ringd", "ddp",
                                         "ddp-ringd"))
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--socket")
    ap.add_argument("--port", type=int)
    ap.add_argument("--daemon-pid", type=int, action="append", default=[])
    ap.add_argument("--etcd-pid", type=int, action="append", default=[])
    ap.add_argument("--out")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--procs", type=int, default=2,
                    help="processes of ringd and of ddp (ringd: "
                    "--procs / --per-node nodes; at most 8 nodes)")
    ap.add_argument("--per-node", type=int, default=1,
                    help="trainers per ringd node (--procs a multiple "
                    "of it)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per process (the same for all)")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--ways", default="local,ringd,ddp",
                    help="the ways to run, of local,ringd,ddp (the last "
                    "line needs all three), ddp-ringd (DDP on the ringd "
                    "backend) and ringd-fixed (ringd with the fixed spin "
                    "policy, to compare)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temporary directory (logs), say where")
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    o = ap.parse_args()
    if o.worker:
        return worker(o)
    ways = {"local", "ringd", "ddp", "ddp-ringd"} | set(WAY_ENV)
    if not set(o.ways.split(",")) <= ways:
        ap.error("--ways: of " + ", ".join(sorted(ways)))
    if o.per_node < 1 or o.procs % o.per_node or o.procs // o.per_node > 8:
        ap.error("--per-node: --procs (%d) must be a multiple of it, in "
                 "at most 8 nodes" % o.procs)
    b = Bench(o)
    try:
        b.start_etcd()
        times = {w: [] for w in o.ways.split(",")}
        cpus = {w: [] for w in times}   # per round: {class: [ns...]}
        for rnd in range(o.reps):
            for way in times:
                t, cpu = b.run_way(way, rnd)
                times[way] += t
                cpus[way].append(cpu)
    finally:
        b.close()
    med = {w: statistics.median(t) for w, t in times.items()}
    nparams = sum(DIMS[i] * DIMS[i + 1] + DIMS[i + 1]
                  for i in range(len(DIMS) - 1))
    print("model: MLP %s, %.1f M parameters, batch %d per process, "
          "%d round(s) of %d steps, %d processes (ringd: %d a node)" % (
              "-".join(map(str, DIMS)), nparams / 1e6, o.batch, o.reps,
              o.steps, o.procs, o.per_node))
    print("way\tprocs\tmedian_ms\tmin_ms\tmax_ms\tsteps")
    for w, t in times.items():
        print("%s\t%d\t%.1f\t%.1f\t%.1f\t%d" % (
            w, 1 if w == "local" else o.procs, med[w], min(t), max(t),
            len(t)))
    total = print_cpu(cpus, o.steps)
    if not {"local", "ringd", "ddp"} <= set(times):
        return 0
    more = ""
    if "ddp-ringd" in times:
        more = " ddp_ringd_step_ms=%.1f ddp_ringd_vs_gloo=%.3f" % (
            med["ddp-ringd"], med["ddp-ringd"] / med["ddp"])
    print("torch: overhead_pct=%.1f step_ms=%.1f ddp_step_ms=%.1f "
          "local_cpu_ms=%.1f ringd_cpu_ms=%.1f ddp_cpu_ms=%.1f%s" % (
              (med["ringd"] - med["local"]) * 100 / med["local"],
              med["ringd"], med["ddp"], total["local"], total["ringd"],
              total["ddp"], more))
    return 0


def print_cpu(cpus, steps):
    """The second table: per way and class, the CPU ms a step costs (all
    the way's processes of the class together), the time its threads
    waited runnable for a CPU, and its thread count, medians over the
    rounds. Returns each way's total CPU ms a step (the median of the
    rounds' totals)."""
    print("way\tproc\tthreads\tcpu_ms_per_step\twait_ms_per_step")
    total = {}
    for w, rounds in cpus.items():
        for k in sorted({k for r in rounds for k in r}):
            per = [r.get(k, [0, 0, 0]) for r in rounds]
            print("%s\t%s\t%d\t%.1f\t%.1f" % (
                w, k, statistics.median(p[2] for p in per),
                statistics.median(p[0] for p in per) / 1e6 / steps,
                statistics.median(p[1] for p in per) / 1e6 / steps))
        total[w] = statistics.median(
            sum(c[0] for c in r.values()) for r in rounds) / 1e6 / steps
        print("%s\ttotal\t-\t%.1f\t-" % (w, total[w]))
    return total


if __name__ == "__main__":
    sys.exit(main())
