#!/usr/bin/python3
"""bench/torch-overhead.py - what ringd.torch costs a training step.

One model (an MLP 1024-4096-4096-1024, 25.2 M parameters, SGD), three
ways, in the same run, interleaved round by round:

  local   one process, no communication: the floor
  ringd   DistributedOptimizer, --procs nodes on loopback (default 2:
          etcd, a ringd daemon per node, one trainer each)
  ddp     torch.nn.parallel.DistributedDataParallel, gloo, --procs
          processes

Each way runs --steps timed steps after --warmup untimed ones, --reps
rounds; a way's figure is the median over every timed step of every
round (rank 0's). Prints a TSV table, then the last line
`torch: overhead_pct=<x> step_ms=<x> ddp_step_ms=<x>` (overhead: ringd
over local). Needs `make all` (build/ringd, build/libringd.so) and etcd.

    /usr/bin/python3 bench/torch-overhead.py [--reps 5] [--steps 20]
        [--procs 4]
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
        begin, end = c.step_begin, c.step_end
    else:
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        begin = end = lambda: None
        if o.worker == "ddp":
            import torch.distributed as dist
            dist.init_process_group(
                "gloo", init_method="tcp://127.0.0.1:%d" % o.port,
                rank=o.rank, world_size=o.procs)
            m = torch.nn.parallel.DistributedDataParallel(m)
    for i in range(o.warmup + o.steps):
        t0 = time.perf_counter()
        begin()
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        end()
        if i >= o.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    with open(o.out, "w") as f:
        json.dump(times, f)
    return 0


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

    def spawn(self, argv, log):
        p = subprocess.Popen(argv, env=self.env, stdout=open(log, "w"),
                             stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def path(self, name):
        return os.path.join(self.tmp, name)

    def start_etcd(self):
        port = free_port()
        peer = free_port()
        self.etcd_url = "http://127.0.0.1:%d" % port
        self.spawn(["etcd", "--name", "bench", "--data-dir",
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

    def daemons(self, job, nodes=2):
        ds = []
        for n in "abcdefgh"[:nodes]:
            sock = self.path("%s-%s.sock" % (job, n))
            ds.append((self.spawn(
                [os.path.join(ROOT, self.o.build, "ringd"), "--etcd",
                 self.etcd_url, "--job", job, "--node-id", n, "--socket",
                 sock, "--trainers", "1", "--min-nodes", str(nodes),
                 "--metrics", "off"], self.path("%s-%s.log" % (job, n))),
                sock))
        for _, sock in ds:
            wait_for(lambda: os.path.exists(sock), "ringd socket " + sock)
        return ds

    def run_way(self, way, rnd):
        o = self.o
        n = 1 if way == "local" else o.procs
        extra = [[] for _ in range(n)]
        ds = []
        if way == "ringd":
            ds = self.daemons("tb%d-%d" % (os.getpid(), rnd), n)
            extra = [["--socket", s] for _, s in ds]
        elif way == "ddp":
            port = free_port()
            extra = [["--port", str(port)] for _ in range(n)]
        ws = []
        for r in range(n):
            out = self.path("%s-%d-%d.json" % (way, rnd, r))
            argv = [sys.executable, os.path.abspath(__file__), "--worker",
                    way, "--rank", str(r), "--out", out, "--batch",
                    str(o.batch), "--steps", str(o.steps), "--warmup",
                    str(o.warmup), "--threads", str(o.threads),
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
        with open(ws[0][1]) as f:
            return json.load(f)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", choices=("local", "ringd", "ddp"))
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--socket")
    ap.add_argument("--port", type=int)
    ap.add_argument("--out")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--procs", type=int, default=2,
                    help="processes of ringd and of ddp (ringd: that many "
                    "nodes, one trainer each; at most 8)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per process (the same for all)")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    o = ap.parse_args()
    if o.worker:
        return worker(o)
    b = Bench(o)
    try:
        b.start_etcd()
        times = {"local": [], "ringd": [], "ddp": []}
        for rnd in range(o.reps):
            for way in times:
                times[way] += b.run_way(way, rnd)
    finally:
        b.close()
    med = {w: statistics.median(t) for w, t in times.items()}
    nparams = sum(DIMS[i] * DIMS[i + 1] + DIMS[i + 1]
                  for i in range(len(DIMS) - 1))
    print("model: MLP %s, %.1f M parameters, batch %d per process, "
          "%d round(s) of %d steps, %d processes" % (
              "-".join(map(str, DIMS)), nparams / 1e6, o.batch, o.reps,
              o.steps, o.procs))
    print("way\tprocs\tmedian_ms\tmin_ms\tmax_ms\tsteps")
    for w, t in times.items():
        print("%s\t%d\t%.1f\t%.1f\t%.1f\t%d" % (
            w, 1 if w == "local" else o.procs, med[w], min(t), max(t),
            len(t)))
    print("torch: overhead_pct=%.1f step_ms=%.1f ddp_step_ms=%.1f" % (
        (med["ringd"] - med["local"]) * 100 / med["local"], med["ringd"],
        med["ddp"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
