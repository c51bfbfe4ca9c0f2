#!/usr/bin/python3
"""Client.allreduce_async / broadcast_async / wait / test, allgather and
barrier against a real ringd started with --trainers 2 (by
tests/test-dmn-async.c): two trainers as two threads, one Client each,
issuing the same sequence and waiting in different orders. Exits 0 and
prints "PASS async"."""
import argparse
import sys
import threading

import numpy as np

import ringd

try:
    import torch
except ImportError:
    torch = None

K = 8
N = 1000


def trainer(sock, errs):
    try:
        c = ringd.Client(sock, name="async_binding.py")
        for step in range(2):
            v = c.step_begin()
            assert v.world == 2, v
            bufs = [c.buffer(N, np.float32) for _ in range(K)]
            for i, b in enumerate(bufs):
                b[:] = (v.rank + 1) * (np.arange(N) + i + step)
            hs = [c.allreduce_async(b, op="sum") for b in bufs]
            bc = c.buffer(16, np.uint8)
            bc[:] = 7 if v.rank == 1 else 0
            hb = c.broadcast_async(bc, root=1)
            order = hs[::-1] if v.rank == 0 else hs
            for h in order:
                c.wait(h)
            for _ in range(10 ** 6):
                if c.test(hb):
                    break
            else:
                raise AssertionError("the broadcast never completed")
            for i, b in enumerate(bufs):
                want = 3 * (np.arange(N) + i + step)
                assert np.array_equal(b, want.astype(np.float32)), (i, b[:4])
            assert (bc == 7).all(), bc
            try:
                c.wait(hs[0])
                raise AssertionError("a double wait was accepted")
            except ringd.Error as e:
                assert e.code == ringd.EINVAL, e
            one = c.buffer(ringd.MAX_OUTSTANDING + 1, np.float32)
            many = [c.allreduce_async(one[i:i + 1], op="max")
                    for i in range(ringd.MAX_OUTSTANDING)]
            try:
                c.allreduce_async(one[-1:], op="max")
                raise AssertionError("no limit on outstanding handles")
            except ringd.Error as e:
                assert e.code == ringd.ELIMIT, e
            for h in many:
                c.wait(h)
            ag = c.buffer((2, 5), np.int64)
            ag[:] = -1  # the other row: zeroed by the library
            ag[v.rank] = np.arange(5) + 100 * v.rank
            c.allgather(ag)
            assert np.array_equal(ag, [np.arange(5), np.arange(5) + 100]), ag
            c.barrier()
            fb = [c.buffer(N, np.float32) for _ in range(4)]
            for i, b in enumerate(fb):
                b[:] = (v.rank + 1) * (np.arange(N) - i)
            with c.group():
                gh = [c.allreduce_async(b, op="sum") for b in fb]
            for h in gh:
                c.wait(h)
            for i, b in enumerate(fb):
                want = (3 * (np.arange(N) - i)).astype(np.float32)
                assert np.array_equal(b, want), (i, b[:4])
            # Per-call wire compression: one node rounds nothing.
            fb[0][:] = (v.rank + 1) * np.arange(N)
            c.wait(c.allreduce_async(fb[0], op="sum", wire="bf16"))
            assert np.array_equal(fb[0], 3 * np.arange(N, dtype=np.float32))
            for bad, kw in (("int32", {"wire": "f16"}), ("f32", {"wire": 8})):
                arr = fb[1].view(np.int32) if bad == "int32" else fb[1]
                try:
                    c.allreduce_async(arr, op="sum", **kw)
                except ringd.Error as e:
                    assert e.code == ringd.EINVAL, e
                else:
                    raise AssertionError("wire %r on %s taken" % (kw, bad))
            if torch is not None:
                # A torch tensor over ringd memory, bf16 on the wire.
                _, mv = c.raw_buffer(2 * N)
                t = torch.frombuffer(mv, dtype=torch.bfloat16)
                t[:] = float(v.rank + 1)
                c.wait(c.allreduce_async(t, op="sum"))
                assert bool((t == 3.0).all()), t[:4]
            c.step_end()
        c.close()
    except BaseException as e:  # re-raised in the main thread
        errs.append(e)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    a = ap.parse_args()
    errs = []
    th = [threading.Thread(target=trainer, args=(a.socket, errs))
          for _ in range(2)]
    for t in th:
        t.start()
    for t in th:
        t.join(120)
    if errs:
        raise errs[0]
    print("PASS async")


if __name__ == "__main__":
    sys.exit(main())
