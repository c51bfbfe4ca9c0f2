"""DDP on the ringd torch.distributed backend (tests/test-client-ddp.c).

--mode unit: each collective of the backend against closed-form values
  (allreduce sum/avg/max/min and coalesced, broadcast, allgather,
  _allgather_base, reduce_scatter, barrier), tensors in and out of ringd
  memory; prints "PASS ddp unit".
--mode ddp: a BatchNorm CNN in DistributedDataParallel, trained through
  ringd.torch.distributed.run on an ElasticSampler's shares of a fixed
  global batch; logs "final digest D" (parameters and buffers) and saves
  the parameters to --out.
  With --inject K, the K-th attempt's first allreduce still in flight
  fails (the client's test() raises ringd.Reshape once, as a view change
  does): its future completes while backward waits, and the step must be
  redone, not applied twice (torch's DDP died there with SIGSEGV).
--mode ref: the same model on the whole global batch in one process.
--compare A B TOL: parameters of A and B within TOL.
"""
import argparse
import hashlib
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

GLOBAL_BATCH = 8
N = 256


def model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 8 * 8, 16), nn.ReLU(),
                         nn.Linear(16, 3))


def data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N, 1, 8, 8, generator=g)
    y = (x.mean(dim=(1, 2, 3)) > 0).long() + (x[:, 0, 0, 0] > 1).long()
    return x, y


def digest(m):
    h = hashlib.blake2b(digest_size=8)
    for _, t in sorted(m.state_dict().items()):
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def log(args, msg):
    with open(args.log, "a") as f:
        f.write(msg + "\n")


def unit(args):
    import ringd.torch as rt
    import ringd.torch.distributed as rdist
    rt.init(socket=args.socket)
    v = rdist.init_process_group()
    r, n = v.rank, v.world
    ok = []

    def eq(name, got, want):
        if not torch.equal(got, want):
            print("FAIL %s: %s != %s" % (name, got, want))
            sys.exit(1)
        ok.append(name)
    t = torch.full((5,), float(r + 1))
    dist.all_reduce(t)
    eq("allreduce sum", t, torch.full((5,), n * (n + 1) / 2.0))
    t = torch.full((3,), float(r + 1))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    eq("allreduce max", t, torch.full((3,), float(n)))
    t = torch.full((3,), float(r + 1))
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    eq("allreduce min", t, torch.ones(3))
    t = torch.full((4,), float(2 * r), dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    eq("allreduce avg", t, torch.full((4,), float(n - 1), dtype=torch.float64))
    a, b = rt.zeros(3), torch.zeros(2, 2)     # in ringd memory, and not
    a += r
    b += 10 * r
    dist.all_reduce_coalesced([a, b])
    s = n * (n - 1) / 2.0
    eq("coalesced a", a, torch.full((3,), s))
    eq("coalesced b", b, torch.full((2, 2), 10 * s))
    t = torch.arange(6, dtype=torch.int64) * (r + 1)
    dist.broadcast(t, src=n - 1)
    eq("broadcast", t, torch.arange(6, dtype=torch.int64) * n)
    outs = [torch.zeros(2) for _ in range(n)]
    dist.all_gather(outs, torch.full((2,), float(r)))
    eq("allgather", torch.stack(outs),
       torch.arange(n, dtype=torch.float32).repeat_interleave(2).view(n, 2))
    flat = torch.zeros(n, 3)
    dist._all_gather_base(flat, torch.full((3,), float(r) + 0.5))
    eq("allgather base", flat[:, 0], torch.arange(n) + 0.5)
    out = torch.zeros(2)
    dist.reduce_scatter(out, [torch.full((2,), float(i + r)) for i in
                              range(n)])
    eq("reduce_scatter", out, torch.full((2,), float(n * r + s)))
    w = dist.all_reduce(torch.ones(1), async_op=True)
    w.wait()
    dist.barrier()
    ok.append("barrier")
    syncbn(r, n, ok)
    rdist.group().flush()
    rt.client().step_end()
    rdist.destroy()
    print("PASS ddp unit (%d checks, rank %d of %d)" % (len(ok), r, n))


def syncbn(r, n, ok):
    """rdist.SyncBatchNorm over this rank's share of a batch against one
    BatchNorm2d on the whole batch: the outputs and input gradients of the
    share, the weight and bias gradients summed over the ranks, and the
    running statistics."""
    import ringd.torch.distributed as rdist
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4 * n, 3, 5, 5, generator=g) * 2 + 1
    w = torch.randn(4 * n, 3, 5, 5, generator=g)
    ref = nn.BatchNorm2d(3)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5, generator=g)
        ref.bias.uniform_(-0.5, 0.5, generator=g)
    sbn = rdist.SyncBatchNorm.convert_sync_batchnorm(
        nn.Sequential(nn.BatchNorm2d(3)))[0]
    sbn.load_state_dict(ref.state_dict())
    xr = x.clone().requires_grad_(True)
    (ref(xr) * w).sum().backward()
    share = slice(4 * r, 4 * (r + 1))
    xs = x[share].clone().requires_grad_(True)
    ys = sbn(xs)
    (ys * w[share]).sum().backward()

    def close(name, got, want):
        err = (got - want).abs().max().item()
        if err > 1e-4:
            print("FAIL syncbn %s: off by %g" % (name, err))
            sys.exit(1)
        ok.append("syncbn " + name)
    close("output", ys.detach(), nn.functional.batch_norm(
        x, None, None, ref.weight.detach(), ref.bias.detach(), True)[share])
    close("input grad", xs.grad, xr.grad[share])
    gw, gb = sbn.weight.grad.clone(), sbn.bias.grad.clone()
    dist.all_reduce(gw)
    dist.all_reduce(gb)
    close("weight grad", gw, ref.weight.grad)
    close("bias grad", gb, ref.bias.grad)
    close("running mean", sbn.running_mean, ref.running_mean)
    close("running var", sbn.running_var, ref.running_var)


def ddp(args):
    import ringd.torch as rt
    import ringd.torch.distributed as rdist
    from ringd.torch import elastic
    rt.init(socket=args.socket)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x, y = data()
    sampler = elastic.ElasticSampler(x, batch_size=GLOBAL_BATCH //
                                     args.trainers, shuffle=False)
    state = elastic.State(model=net, optimizer=opt, sampler=sampler)
    losses = []
    attempts = {"n": 0, "armed": False}
    if args.inject:
        real_test = rt.client().test

        def test(h):
            if attempts["armed"]:
                attempts["armed"] = False
                log(args, "injected a failure into attempt %d" %
                    attempts["n"])
                import ringd
                raise ringd.Reshape(ringd.ERESHAPE, "injected")
            return real_test(h)
        rt.client().test = test

    def setup(v):
        log(args, "setup rank %d world %d step %d" % (v.rank, v.world,
                                                      v.step))
        # Buckets of 4 KiB (the first one too): several allreduces in
        # flight while backward goes on, each bucket's ringd buffer made
        # in the first steps while the completion thread tests the
        # handles before it (a real model's 25 MiB buckets do the same).
        if args.inject:
            # One bucket, issued before its failure is seen: backward
            # then ends normally and only the optimizer's guard stops
            # the update (with several, the next bucket's issue raises).
            return DDP(net)
        dist._DEFAULT_FIRST_BUCKET_BYTES = 4096
        return DDP(net, bucket_cap_mb=4096 / (1 << 20))

    def step(state, v, m):
        if sampler.done():
            return False
        idx = torch.tensor(list(sampler.batch()), dtype=torch.long)
        attempts["n"] += 1
        attempts["armed"] = attempts["n"] == args.inject
        opt.zero_grad()
        out = m(x[idx])
        # DDP averages over the world: scale so the step equals one
        # process's mean over the global batch however it is split.
        loss = nn.functional.cross_entropy(out, y[idx], reduction="sum")
        (loss * v.world / GLOBAL_BATCH).backward()
        opt.step()
        losses.append(loss.item())
        if args.slow:
            import time
            time.sleep(args.slow)   # widens the window for kills/joins
        log(args, "step %d world %d" % (v.step, v.world))
        return True
    rdist.run(step, state, setup, steps=args.steps)
    log(args, "final digest %s" % digest(net))
    torch.save(net.state_dict(), args.out)


def ref(args):
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x, y = data()
    for s in range(args.steps):
        i = torch.arange(s * GLOBAL_BATCH, (s + 1) * GLOBAL_BATCH) % N
        opt.zero_grad()
        nn.functional.cross_entropy(net(x[i]), y[i]).backward()
        opt.step()
    torch.save(net.state_dict(), args.out)


def compare(a, b, tol):
    sa, sb = torch.load(a), torch.load(b)
    worst = max((sa[k] - sb[k]).abs().max().item() for k in sa)
    print("max difference %.3g (tolerance %g)" % (worst, tol))
    sys.exit(0 if worst <= tol else 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="ddp")
    p.add_argument("--socket")
    p.add_argument("--log", default="/dev/null")
    p.add_argument("--out", default="/dev/null")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--slow", type=float, default=0.0)
    p.add_argument("--inject", type=int, default=0)
    p.add_argument("--trainers", type=int, default=2)
    p.add_argument("--compare", nargs=3)
    args = p.parse_args()
    if args.compare:
        compare(args.compare[0], args.compare[1], float(args.compare[2]))
    {"unit": unit, "ddp": ddp, "ref": ref}[args.mode](args)


if __name__ == "__main__":
    main()
