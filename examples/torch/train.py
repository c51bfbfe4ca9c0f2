#!/usr/bin/python3
"""train.py - a LeNet-class CNN on scikit-learn's digits (8x8 images,
Debian's python3-sklearn), data-parallel through ringd.torch, or with
--ddp the same model under torch.distributed DDP (gloo) for comparison.

    # ringd: one process per trainer, each connected to its node's ringd
    RINGD_LIB=build/libringd.so PYTHONPATH=client/python \\
        /usr/bin/python3 examples/torch/train.py --socket /tmp/r.sock
    # DDP: start world processes yourself (torchrun 1.13 breaks on 3.11)
    /usr/bin/python3 examples/torch/train.py --ddp --rank R --world W

Through ringd the five lines that matter are rt.init(), ElasticSampler,
DistributedOptimizer, elastic.State and elastic.run: a trainer may die or
join mid-epoch and the job carries on. Prints one line per epoch and
"final: test_accuracy A step_ms S" at the end. --step-log FILE appends
"step S gen G rank R world W hash H t_ms T loss L" once a step's
reduction is done (T: epoch ms; H: blake2b of the parameters; under --ddp
S is the local count and G is 0) and --save FILE writes the final
parameters and buffers as raw bytes: examples/demo-torch.sh reads both.
"""
import argparse
import gzip
import hashlib
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DIGITS = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
NTRAIN = 1500


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.f1 = nn.Linear(32 * 2 * 2, 64)
        self.f2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.f2(F.relu(self.f1(x.flatten(1))))


def load():
    if not os.path.exists(DIGITS):
        sys.exit("train.py: %s missing (install python3-sklearn)" % DIGITS)
    with gzip.open(DIGITS, "rt") as f:
        a = np.loadtxt(f, delimiter=",", dtype=np.float32)
    perm = np.random.default_rng(777).permutation(len(a))
    a = a[perm]
    x = torch.from_numpy(a[:, :64] / 16.0).view(-1, 1, 8, 8)
    y = torch.from_numpy(a[:, 64].astype(np.int64))
    return x[:NTRAIN], y[:NTRAIN], x[NTRAIN:], y[NTRAIN:]


def accuracy(model, x, y):
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32, help="per trainer")
    ap.add_argument("--lr", type=float, default=0.002)
    ap.add_argument("--ddp", action="store_true")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--port", type=int, default=29511)
    ap.add_argument("--step-log")
    ap.add_argument("--save")
    o = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1)
    xtr, ytr, xte, yte = load()
    model = LeNet()
    opt = torch.optim.Adam(model.parameters(), lr=o.lr)
    from ringd.torch.elastic import ElasticSampler
    sampler = ElasticSampler(range(len(ytr)), batch_size=o.batch, seed=1)
    times = []
    slog = open(o.step_log, "a", buffering=1) if o.step_log else None

    def log_step(step, gen, rank, world, loss):
        # The same work under ringd and DDP: hash the parameters' bytes.
        h = hashlib.blake2b(digest_size=8)
        for p in model.parameters():
            h.update(p.detach().numpy().tobytes())
        slog.write("step %d gen %d rank %d world %d hash %s t_ms %.3f "
                   "loss %.5f\n" % (step, gen, rank, world, h.hexdigest(),
                                     time.time() * 1000, loss))

    def one_step(dopt, net, v=None):
        if sampler.done():
            if sampler.epoch + 1 >= o.epochs:
                return False
            print("epoch %d  world %d  test_accuracy %.4f" %
                  (sampler.epoch, sampler.world, accuracy(model, xte, yte)),
                  flush=True)
            sampler.set_epoch(sampler.epoch + 1)
        t0 = time.perf_counter()
        idx = sampler.batch()
        dopt.zero_grad()
        loss = F.cross_entropy(net(xtr[idx]), ytr[idx])
        loss.backward()
        dopt.step()
        times.append(time.perf_counter() - t0)
        if slog is not None:
            if v is None:
                log_step(len(times), 0, o.rank, o.world, float(loss))
            else:
                log_step(v.step, v.generation, v.rank, v.world, float(loss))
        return True

    if o.ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" %
                                o.port, rank=o.rank, world_size=o.world)
        net = nn.parallel.DistributedDataParallel(model)
        sampler.set_world(o.rank, o.world)
        while one_step(opt, net):
            sampler.commit()
        dist.destroy_process_group()
    else:
        import ringd.torch as rt
        from ringd.torch import elastic
        rt.init(o.socket, name="train.py")
        dopt = rt.DistributedOptimizer(
            opt, named_parameters=model.named_parameters())
        state = elastic.State(model=model, optimizer=opt, sampler=sampler)
        elastic.run(lambda s, v: one_step(dopt, model, v), state)
    if o.save:
        with open(o.save, "wb") as f:
            for t in model.state_dict().values():
                f.write(t.detach().contiguous().numpy().tobytes())
    step_ms = 1000 * float(np.median(times[len(times) // 10:]))
    print("final: test_accuracy %.4f step_ms %.2f" %
          (accuracy(model, xte, yte), step_ms), flush=True)


if __name__ == "__main__":
    main()
