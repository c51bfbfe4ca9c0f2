#!/usr/bin/env python3
"""trainer.py - the MLP digits classifier of trainer.c, in numpy, trained
data-parallel through the ringd Python binding (the ringd package in client/python).

Same data (scikit-learn's digits from Debian's python3-sklearn, else a
deterministic synthetic set), same model (64 -> hidden ReLU -> 10), same
step protocol: parameters in the state region, gradients averaged with
allreduce, the step redone on ringd.Reshape, ringd.Disconnected and
ringd.Fenced (a fenced node's step_begin is retried every 100 ms, up to a
minute, until the node is back in the job). Batches are drawn with numpy's
generator seeded by (seed, step), so any world size computes the same
global update. --hash-log writes a blake2b-64 of the parameters per step
("step S gen G rank R world W hash H t_ms T loss L", as trainer.c).
"""
import argparse
import gzip
import hashlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "client", "python"))

DIGITS = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
NIN, NOUT, NTRAIN = 64, 10, 1500


def load_data(kind):
    if kind != "synthetic" and os.path.exists(DIGITS):
        with gzip.open(DIGITS, "rt") as f:
            a = np.loadtxt(f, delimiter=",", dtype=np.float32)
        x, y, src = a[:, :NIN] / 16.0, a[:, NIN].astype(np.int64), DIGITS
    elif kind == "digits":
        sys.exit("trainer.py: %s missing (install python3-sklearn)" % DIGITS)
    else:
        rng = np.random.default_rng(12345)
        proto = (rng.random((NOUT, NIN)) > 0.5).astype(np.float32)
        y = np.arange(1797) % NOUT
        x = proto[y] * 0.6 + rng.random((1797, NIN), dtype=np.float32) * 0.4
        src = "synthetic (deterministic prototypes + noise)"
    perm = np.random.default_rng(777).permutation(len(y))
    return x[perm].astype(np.float32), y[perm], src


def layout(h):
    sizes = [h * NIN, h, NOUT * h, NOUT]
    offs = np.cumsum([0] + sizes)
    return offs, int(offs[-1])


def views(vec, h):
    offs, _ = layout(h)
    return (vec[offs[0]:offs[1]].reshape(h, NIN), vec[offs[1]:offs[2]],
            vec[offs[2]:offs[3]].reshape(NOUT, h), vec[offs[3]:offs[4]])


def forward(p, x):
    w1, b1, w2, b2 = p
    z1 = x @ w1.T + b1
    a1 = np.maximum(z1, 0)
    z2 = a1 @ w2.T + b2
    z2 = np.exp(z2 - z2.max(axis=1, keepdims=True))
    return z1, a1, z2 / z2.sum(axis=1, keepdims=True)


def gradients(p, g, x, y, scale):
    """Fill g with the gradient of the shard, times scale; returns
    (loss sum, correct)."""
    w1, b1, w2, b2 = p
    gw1, gb1, gw2, gb2 = g
    if len(y) == 0:
        for a in g:
            a[...] = 0
        return 0.0, 0
    z1, a1, prob = forward(p, x)
    loss = float(-np.log(np.maximum(prob[np.arange(len(y)), y],
                                    1e-12)).sum())
    correct = int((prob.argmax(axis=1) == y).sum())
    dz2 = prob
    dz2[np.arange(len(y)), y] -= 1
    dz2 *= scale
    gw2[...] = dz2.T @ a1
    gb2[...] = dz2.sum(axis=0)
    da1 = (dz2 @ w2) * (z1 > 0)
    gw1[...] = da1.T @ x
    gb1[...] = da1.sum(axis=0)
    return loss, correct


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--hash-log")
    ap.add_argument("--data", default="auto",
                    choices=["auto", "digits", "synthetic"])
    ap.add_argument("--target-acc", type=float, default=0)
    ap.add_argument("--no-daemon", action="store_true")
    o = ap.parse_args()

    x, y, src = load_data(o.data)
    print("data: %s, %d train / %d test" % (src, NTRAIN, len(y) - NTRAIN),
          flush=True)
    _, n = layout(o.hidden)
    client = None
    if o.no_daemon:
        params, grads = np.zeros(n, np.float32), np.zeros(n, np.float32)
    else:
        import ringd
        client = ringd.Client(o.socket, name="trainer.py")
        params = client.buffer(n, np.float32)
        grads = client.buffer(n, np.float32)
    rng = np.random.default_rng(o.seed)
    p, g = views(params, o.hidden), views(grads, o.hidden)
    p[0][...] = rng.uniform(-1, 1, p[0].shape) / np.sqrt(NIN)
    p[2][...] = rng.uniform(-1, 1, p[2].shape) / np.sqrt(o.hidden)
    if client:
        client.state(params)
    hlog = open(o.hash_log, "a") if o.hash_log else None

    step, rank, world, gen = 0, 0, 1, 1
    fenced_tries = 0
    while True:
        if client:
            try:
                v = client.step_begin()
            except ringd.Stopped as e:      # ringrun stops the job
                print("stopping: %s" % e, flush=True)
                break
            except ringd.Shutdown:
                print("daemon drains: stopping", flush=True)
                break
            except ringd.Fenced:
                # the node lost its lease: wait (up to a minute) for it
                # to rejoin, as trainer.c does
                fenced_tries += 1
                if fenced_tries > 600:
                    raise
                time.sleep(0.1)
                continue
            fenced_tries = 0
            step, rank, world, gen = v.step, v.rank, v.world, v.generation
            if v.restored:
                print("joined at step %d: parameters restored" % step)
        if step >= o.steps:
            break
        idx = np.random.default_rng([o.seed, step]).integers(
            0, NTRAIN, o.batch)
        lo, hi = o.batch * rank // world, o.batch * (rank + 1) // world
        loss, _ = gradients(p, g, x[idx[lo:hi]], y[idx[lo:hi]],
                            world / o.batch)
        if client:
            try:
                client.allreduce(grads, "avg")
            except (ringd.Reshape, ringd.Disconnected, ringd.Fenced) as e:
                # fenced: step_begin waits until the node is back in the
                # job (and its state restored)
                print("collective: %s; redoing the step" % e, flush=True)
                continue
        params -= np.float32(o.lr) * grads
        if client:
            try:
                client.step_end()
            except ringd.Error as e:
                print("trainer.py: step_end: %s" % e, file=sys.stderr,
                      flush=True)
                continue  # step_begin reconnects
        if hlog:
            h = hashlib.blake2b(params.tobytes(), digest_size=8).hexdigest()
            hlog.write("step %d gen %d rank %d world %d hash %s t_ms %d "
                       "loss %.5f\n" % (step, gen, rank, world, h,
                                        int(time.time() * 1000),
                                        loss / max(hi - lo, 1)))
            hlog.flush()
        if (step + 1) % o.log_every == 0 and rank == 0:
            acc = (forward(p, x[NTRAIN:])[2].argmax(axis=1)
                   == y[NTRAIN:]).mean()
            print("step %5d  world %d  shard_loss %.4f  test_acc %.4f"
                  % (step + 1, world, loss / max(hi - lo, 1), acc),
                  flush=True)
        if not client:
            step += 1
    acc = float((forward(p, x[NTRAIN:])[2].argmax(axis=1)
                 == y[NTRAIN:]).mean())
    h = hashlib.blake2b(params.tobytes(), digest_size=8).hexdigest()
    print("final: test_accuracy %.4f hash %s" % (acc, h), flush=True)
    del p, g, params, grads
    if client:
        client.close()
    if o.target_acc and acc < o.target_acc:
        sys.exit(3)


if __name__ == "__main__":
    main()
