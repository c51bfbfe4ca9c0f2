#!/usr/bin/python3
"""bench/torch-layer.py - what the Python layer adds to a step over the C
client, for the same collectives.

Steps made only of collectives (no model), on 2 nodes on loopback (its
own etcd, two ringd daemons, one trainer each), three ways, interleaved
round by round:

  c      build/bench/coll-steps: libringd from C
  torch  ringd.torch: rt.allreduce_async_ per bucket, then Handle.wait
         each (the calls DistributedOptimizer makes)
  dopt   DistributedOptimizer.synchronize() over one parameter per
         bucket (its bucket bookkeeping, binding, issue and wait)

Every way's step: step_begin, one asynchronous f32 avg allreduce per
bucket (all issued before the first wait), a wait for each, step_end,
timed whole (wall), and the trainer process's CPU time in it (what the
layer itself spends, far less disturbed by a loaded machine). Two
bucket sets: the buckets DistributedOptimizer makes at bucket_cap_mb=25
for bench/torch-overhead.py's MLP (25.2 M parameters), and 64 small
buckets of 16 KiB, where per-call costs dominate. Prints a
TSV table (median over every timed step of every round, rank 0's) and
the last line `torch-layer: mlp_pct=<x> small_pct=<y> mlp_cpu_ms=<a>
small_cpu_ms=<b>` (torch over c: wall time in percent, the goal being
< 5, and the trainer's extra CPU time per step).

    /usr/bin/python3 bench/torch-layer.py [--reps 3] [--steps 30]
"""
import argparse
import importlib.util
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLP_DIMS = (1024, 4096, 4096, 1024)
WAYS = ("c", "torch", "dopt")


def overhead_bench():
    """bench/torch-overhead.py's Bench (etcd, daemons, processes)."""
    spec = importlib.util.spec_from_file_location(
        "torch_overhead", os.path.join(ROOT, "bench", "torch-overhead.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.Bench


def mlp_buckets(cap_mb=25):
    """Bucket sizes in bytes, as DistributedOptimizer groups the MLP's
    parameters: in reverse order, a bucket closed before it passes cap."""
    sizes = []
    for i in range(len(MLP_DIMS) - 1):
        sizes += [MLP_DIMS[i] * MLP_DIMS[i + 1] * 4, MLP_DIMS[i + 1] * 4]
    out, cur, cap = [], 0, int(cap_mb * (1 << 20))
    for n in reversed(sizes):
        if cur and cur + n > cap:
            out.append(cur)
            cur = 0
        cur += n
    out.append(cur)
    return out


SETS = {"mlp": mlp_buckets(), "small": [16 << 10] * 64}


def worker(o):
    """One Python trainer of the torch or dopt way; writes each step's
    wall and CPU time (ms), one step per line."""
    import torch
    import ringd.torch as rt
    c = rt.init(o.socket, name="torch-layer")
    sizes = [int(s) for s in o.buckets.split(",")]
    if o.worker == "torch":
        ts = [rt.zeros(n // 4, client=c) for n in sizes]

        def body():
            hs = [rt.allreduce_async_(t, op="avg", client=c) for t in ts]
            for h in hs:
                h.wait()
    else:
        ps = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.zeros(n // 4)) for n in sizes])
        d = rt.DistributedOptimizer(torch.optim.SGD(ps.parameters(), lr=0),
                                    named_parameters=ps.named_parameters(),
                                    bucket_cap_mb=1e-6, client=c)
        assert len(d.buckets) == len(sizes)
        body = d.synchronize
    times = []
    for i in range(o.warmup + o.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        c.step_begin()
        body()
        c.step_end()
        if i >= o.warmup:
            times.append(((time.perf_counter() - t0) * 1e3,
                          (time.process_time() - c0) * 1e3))
    with open(o.out, "w") as f:
        f.write("".join("%.4f %.4f\n" % t for t in times))
    c.close()
    return 0


def run_way(b, o, way, bset, rnd):
    ds = b.daemons("tl%d-%s-%s-%d" % (os.getpid(), way, bset, rnd))
    sizes = ",".join(str(n) for n in SETS[bset])
    ws = []
    for r, (_, sock) in enumerate(ds):
        out = b.path("%s-%s-%d-%d.txt" % (way, bset, rnd, r))
        if way == "c":
            argv = [os.path.join(ROOT, o.build, "bench", "coll-steps"),
                    sock, str(o.steps), str(o.warmup), out, sizes]
        else:
            argv = [sys.executable, os.path.abspath(__file__), "--worker",
                    way, "--socket", sock, "--buckets", sizes, "--out", out,
                    "--steps", str(o.steps), "--warmup", str(o.warmup)]
        ws.append((b.spawn(argv, out + ".log"), out))
    for p, out in ws:
        rc = p.wait(o.timeout)
        if rc != 0:
            with open(out + ".log") as f:
                sys.stderr.write(f.read()[-3000:])
            sys.exit("torch-layer: %s worker failed (%s)" % (way, rc))
    for p, _ in ds:
        p.terminate()
        p.wait(30)
    with open(ws[0][1]) as f:
        return [tuple(float(x) for x in line.split()) for line in f]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", choices=("torch", "dopt"))
    ap.add_argument("--socket")
    ap.add_argument("--buckets")
    ap.add_argument("--out")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    o = ap.parse_args()
    if o.worker:
        return worker(o)
    b = overhead_bench()(o)
    times = {(w, s): [] for s in SETS for w in WAYS}
    try:
        b.start_etcd()
        for rnd in range(o.reps):
            for s in SETS:
                for w in WAYS:
                    times[(w, s)] += run_way(b, o, w, s, rnd)
    finally:
        b.close()
    med = {k: statistics.median(w for w, _ in t) for k, t in times.items()}
    cpu = {k: statistics.median(c for _, c in t) for k, t in times.items()}
    print("# 2 nodes x 1 trainer on loopback, %d round(s) of %d steps; "
          "mlp: %d buckets %s MiB; small: 64 x 16 KiB" %
          (o.reps, o.steps, len(SETS["mlp"]),
           "+".join("%.1f" % (n / 2 ** 20) for n in SETS["mlp"])))
    print("buckets\tway\tmedian_ms\tmin_ms\tmax_ms\tover_c_pct\t"
          "cpu_ms\tcpu_over_c_ms\tsteps")
    for (w, s), t in times.items():
        wall = [x for x, _ in t]
        print("%s\t%s\t%.3f\t%.3f\t%.3f\t%.1f\t%.3f\t%.3f\t%d" % (
            s, w, med[(w, s)], min(wall), max(wall),
            (med[(w, s)] - med[("c", s)]) * 100 / med[("c", s)],
            cpu[(w, s)], cpu[(w, s)] - cpu[("c", s)], len(t)))
    pct = {s: (med[("torch", s)] - med[("c", s)]) * 100 / med[("c", s)]
           for s in SETS}
    extra = {s: cpu[("torch", s)] - cpu[("c", s)] for s in SETS}
    print("torch-layer: mlp_pct=%.1f small_pct=%.1f mlp_cpu_ms=%.3f "
          "small_cpu_ms=%.3f" % (pct["mlp"], pct["small"], extra["mlp"],
                                 extra["small"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
