#!/usr/bin/python3
"""The ringd package against a real ringd started with --trainers 2 (by
tests/test-client-python.c): two trainers as two threads, one Client
each (libringd calls release the GIL), going through the same phases,
one step each.

--part numpy: every ringd dtype (bf16 as uint16 bits), clear errors for
bad arrays, 500 buffers in one step freed when dropped.
--part torch: tensors in ringd memory reduced in place (zero copy), every
dtype, NotContiguous / NotRingdMemory / UnsupportedDtype, a
DistributedOptimizer of 200 buckets, buckets split at module boundaries,
500 tensors in one step freed when
dropped, allreduce_async_ returning before the peer issued; the
DistributedOptimizer staged (staging=True) equal to it bitwise.
--part fakecuda: the CUDA staging logic (staging.Device) on CPU tensors
with torch.cuda faked (fake_cuda.py), its calls checked against the
CUDA protocol (check_cuda_log). Exits 0 and prints "PASS <part>", or
"SKIP ..." when torch cannot be imported.
"""
import argparse
import gc
import sys
import threading

import numpy as np

import ringd

NEL = 8


def daemon_maps(pid):
    with open("/proc/%d/maps" % pid) as f:
        return f.read().count("memfd:ringd-buffer")


def run_phases(sock, phases):
    """Each phase(c, rank, sync) runs on both trainers inside one step;
    sync() is a barrier between the two. Raises the first failure."""
    bar = threading.Barrier(2, timeout=120)
    errs = []

    def trainer():
        try:
            c = ringd.Client(sock, name="binding.py")
            for phase in phases:
                v = c.step_begin()
                assert v.world == 2, v
                phase(c, v.rank, bar.wait)
                c.step_end()
            c.close()
        except BaseException as e:  # re-raised in the main thread
            errs.append(e)
            bar.abort()
    th = [threading.Thread(target=trainer) for _ in range(2)]
    for t in th:
        t.start()
    for t in th:
        t.join(300)
    if errs:
        raise errs[0]


def expect_raise(call, exc, text, msgs):
    try:
        call()
    except exc as e:
        assert text in str(e), (text, str(e))
        if isinstance(e, ringd.Error):
            assert e.code == ringd.EINVAL, e.code
        msgs.append("%s: %s" % (type(e).__name__, e))
    else:
        raise AssertionError("no %s for %s" % (exc.__name__, text))


def freeing_phases(o, alloc, reduce_one, say):
    """Phases: count the daemon's mappings, 500 buffers in one step, then
    all freed once dropped."""
    base = {}

    def before(c, rank, sync):
        gc.collect()    # earlier phases' cycles (optimizer hooks), both
        sync()          # clients' garbage found before either collects
        c.collect()
        sync()
        if rank == 0:
            base["n"] = daemon_maps(o.daemon_pid)
        sync()

    def many(c, rank, sync):
        bufs = [alloc(c) for _ in range(500)]
        for i, b in enumerate(bufs):
            b[:] = (rank + 1) * i
            reduce_one(c, b)
        assert all((b == 3 * i).all() for i, b in enumerate(bufs))
        assert c.buffers() == 500, c.buffers()
        sync()
        if rank == 0:
            n = daemon_maps(o.daemon_pid)
            assert n == base["n"] + 1000, (n, base)
        sync()

    def after(c, rank, sync):
        c.collect()
        assert c.buffers() == 0, c.buffers()
        sync()
        if rank == 0:
            n = daemon_maps(o.daemon_pid)
            assert n == base["n"], (n, base)
            print(say)
        sync()
    return [before, many, after]


def bf16_bits(x):
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(
        np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def numpy_phases(o):
    want = np.arange(1, NEL + 1) * 3.0  # rank 0 gives 1x, rank 1 2x

    def dtypes(c, rank, sync):
        for name in ("f32", "f64", "f16", "i32", "i64", "u8"):
            a = c.buffer(NEL, name)
            a[:] = np.arange(1, NEL + 1) * (rank + 1)
            c.allreduce(a, "sum")
            assert np.array_equal(a.astype(np.float64), want), (name, a)
        b = c.buffer(NEL, "bf16")
        assert b.dtype == np.uint16
        b[:] = bf16_bits(np.arange(1, NEL + 1) * (rank + 1))
        c.allreduce(b, "sum", dtype="bf16")
        assert np.array_equal(bf16_value(b), want), bf16_value(b)
        m = c.buffer(NEL, "bf16")
        m[:] = bf16_bits(np.full(NEL, 2.0 + rank))
        c.allreduce(m, "max", dtype=ringd.BF16)
        assert (bf16_value(m) == 3.0).all(), bf16_value(m)
        if rank == 0:
            print("dtypes ok: f32 f64 f16 bf16 i32 i64 u8")

    def bad(c, rank, sync):
        a = c.buffer((4, 4), np.float32)
        msgs = []
        expect_raise(lambda: c.allreduce(a[:, 1]), ringd.Error,
                     "not contiguous", msgs)
        expect_raise(lambda: c.buffer(4, np.int16), ringd.Error,
                     "no dtype int16", msgs)
        expect_raise(lambda: c.allreduce(np.zeros(4, np.float32)),
                     ringd.Error, "not inside a buffer", msgs)
        expect_raise(lambda: c.allreduce(a.view(np.complex64)),
                     ringd.Error, "no dtype complex64", msgs)
        a[:] = rank + 1
        c.allreduce(a, "sum")  # the daemon is unharmed
        assert (a == 3).all()
        if rank == 0:
            print("bad input:\n  " + "\n  ".join(msgs))

    return [dtypes, bad] + freeing_phases(
        o, lambda c: c.buffer(4, np.float32),
        lambda c, b: c.allreduce(b, "sum"),
        "500 buffers reduced in one step, then freed")


def torch_phases(o):
    import torch
    import ringd.torch as rt

    dts = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
           torch.int32, torch.int64, torch.uint8]
    want = torch.arange(1, NEL + 1, dtype=torch.float64) * 3

    def dtypes(c, rank, sync):
        for dt in dts:
            t = rt.zeros(NEL, dtype=dt, client=c)
            ptr = t.data_ptr()
            t.copy_(torch.arange(1, NEL + 1) * (rank + 1))
            r = rt.allreduce_(t, op="sum", client=c)
            assert r is t and t.data_ptr() == ptr  # in place, zero copy
            assert torch.equal(t.double(), want), (dt, t)
        # A contiguous slice of a ringd tensor reduces only itself.
        m = rt.zeros((4, 4), client=c)
        m.fill_(rank + 1)
        rt.allreduce_(m[1:3], op="avg", client=c)
        assert (m[1:3] == 1.5).all() and (m[0] == rank + 1).all(), m
        if rank == 0:
            print("torch dtypes ok:", " ".join(str(d) for d in dts))

    def bad(c, rank, sync):
        msgs = []
        m = rt.zeros((4, 4), client=c)
        expect_raise(lambda: rt.allreduce_(m.t(), client=c),
                     rt.NotContiguous, "not contiguous", msgs)
        expect_raise(lambda: rt.allreduce_(torch.zeros(4), client=c),
                     rt.NotRingdMemory, "not in ringd memory", msgs)
        expect_raise(lambda: rt.zeros(4, dtype=torch.int16, client=c),
                     rt.UnsupportedDtype, "no dtype torch.int16", msgs)
        expect_raise(lambda: rt.allreduce_(
            torch.zeros(2, dtype=torch.complex64), client=c),
            rt.UnsupportedDtype, "no dtype torch.complex64", msgs)
        expect_raise(lambda: rt.allreduce_(m.view(torch.int8), client=c),
                     rt.UnsupportedDtype, "no dtype torch.int8", msgs)
        m.fill_(rank + 1)
        rt.allreduce_(m, op="sum", client=c)  # the daemon is unharmed
        assert (m == 3).all()
        if rank == 0:
            print("torch bad input:\n  " + "\n  ".join(msgs))

    held = {}

    def differ(c, rank, sync):
        # A parameter that differs across trainers: a clear error naming
        # it (and not the one that is equal), once.
        m = torch.nn.Linear(4, 2)
        with torch.no_grad():   # not from torch's RNG: the threads share it
            m.weight.copy_(torch.arange(8.0).view(2, 4) / 8)
            m.bias.fill_(0.5)
            if rank == 1:
                m.bias[1] += 1e-6
        opt = torch.optim.Adam(m.parameters(), lr=0.1)
        d = rt.DistributedOptimizer(opt, named_parameters=m.named_parameters(),
                                    client=c)
        m(torch.ones(3, 4)).sum().backward()
        try:
            d.step()
        except ValueError as e:
            assert "parameters differ across trainers: bias;" in str(e), e
            if rank == 0:
                print("differing parameters: ValueError:", e)
        else:
            raise AssertionError("differing parameters not detected")
        held[rank] = (m, opt, d)

    def broadcast(c, rank, sync):
        m, opt, d = held[rank]
        if rank == 1:
            opt.param_groups[0]["lr"] = 0.5
        rt.broadcast_parameters(m.state_dict(), root_rank=0, client=c)
        rt.broadcast_optimizer_state(opt, root_rank=0, client=c)
        assert opt.param_groups[0]["lr"] == 0.1
        d.zero_grad()
        m(torch.ones(3, 4) * (rank + 1)).sum().backward()
        d.step()  # checked again (a new view), equal now, then reduced
        held[rank] = torch.cat([p.detach().reshape(-1)
                                for p in m.parameters()])
        sync()
        if rank == 0:
            assert torch.equal(held[0], held[1]), held
            print("after broadcast_parameters: replicas identical")

    def many_buckets(c, rank, sync):
        # More buckets than ringd lets a client have outstanding
        # (MAX_OUTSTANDING): the optimizer waits for the oldest first.
        n = ringd.MAX_OUTSTANDING + 72
        ps = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.full((4,), float(i))) for i in range(n)])
        opt = torch.optim.SGD(ps.parameters(), lr=1.0)
        d = rt.DistributedOptimizer(opt,
                                    named_parameters=ps.named_parameters(),
                                    bucket_cap_mb=1e-6, client=c)
        assert len(d.buckets) == n, len(d.buckets)
        sum(p.sum() * (rank + 1) * (i + 1)
            for i, p in enumerate(ps)).backward()
        d.step()    # gradients (rank+1)*(i+1), averaged: 1.5*(i+1)
        for i, p in enumerate(ps):
            assert torch.equal(p.detach(), torch.full((4,), i - 1.5 * (i + 1))
                               ), (i, p)
        d.close()
        if rank == 0:
            print("%d buckets in one step, past the cap of %d outstanding" %
                  (n, ringd.MAX_OUTSTANDING))

    def compressed(c, rank, sync):
        # bf16 compression: a float32 bucket is reduced in place with the
        # daemon's wire format, a float64 one cast into a bf16 buffer
        # (values rounded: 0.3, 0.6 and their mean are not bf16 numbers).
        p32 = torch.nn.Parameter(torch.zeros(8))
        p64 = torch.nn.Parameter(torch.zeros(8, dtype=torch.float64))
        ps = torch.nn.ParameterList([p32, p64])
        d = rt.DistributedOptimizer(torch.optim.SGD(ps.parameters(), lr=1.0),
                                    named_parameters=ps.named_parameters(),
                                    compression=rt.Compression.bf16,
                                    client=c)
        b32, b64 = d._bucket_of[id(p32)], d._bucket_of[id(p64)]
        assert b32.wire is b32.flat and b32.wire_name == "bf16"
        assert b64.wire.dtype == torch.bfloat16 and b64.wire is not b64.flat
        w = (rank + 1) * 0.3
        ((p32 * w).sum() + (p64 * w).sum()).backward()
        d.step()    # averaged gradient 0.45, lr 1
        e32 = float((p32.detach() + 0.45).abs().max())
        e64 = float((p64.detach() + 0.45).abs().max())
        assert e32 < 1e-6, p32     # one node: the daemon reduces in f32
        assert 1e-5 < e64 < 1e-2, p64
        d.close()
        if rank == 0:
            print("bf16: float32 bucket in place (error %.1g), float64 "
                  "cast (error %.1g)" % (e32, e64))

    def module_buckets(c, rank, sync):
        # A bucket of 1 MiB or more closes where the module changes, so
        # the last layer's gradients go out before the layer below it
        # has run its backward (all four would fit one 25 MB bucket).
        m = torch.nn.Sequential(torch.nn.Linear(512, 512),
                                torch.nn.Linear(512, 512))
        with torch.no_grad():   # equal on both (torch's RNG is shared)
            for p in m.parameters():
                p.fill_(0.01)
        d = rt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                    named_parameters=m.named_parameters(),
                                    client=c)
        names = [[d.names[id(p)] for p in b.params] for b in d.buckets]
        assert names == [["1.bias", "1.weight"], ["0.bias", "0.weight"]], \
            names
        d.trace = []
        m(torch.ones(2, 512) * (rank + 1)).sum().backward()
        d.step()
        ev = d.trace
        assert ev.index(("issue", 0)) < ev.index(("hook", "0.bias")), ev
        d.close()
        if rank == 0:
            print("buckets split at the module boundary: %s" % names)

    def staged(c, rank, sync):
        # The same model twice, its gradients in ringd memory (a) and
        # staged through copies (b, staging=True: .grad stays autograd's
        # tensor): the same parameters, bitwise, with 2 passes per step,
        # 2 steps of Adam and 3 buckets.
        def make():
            m = torch.nn.Sequential(torch.nn.Linear(6, 5),
                                    torch.nn.Linear(5, 3))
            with torch.no_grad():   # not torch's RNG: the threads share it
                for i, p in enumerate(m.parameters()):
                    p.copy_(torch.linspace(-1, 1, p.numel()).view_as(p) *
                            (i + 1) / 3)
            return m
        ma, mb = make(), make()
        oa = torch.optim.Adam(ma.parameters(), lr=0.05)
        ob = torch.optim.Adam(mb.parameters(), lr=0.05)
        cap = 20 * 4 / float(1 << 20)   # 20 floats a bucket
        da = rt.DistributedOptimizer(oa, named_parameters=ma.named_parameters(),
                                     backward_passes_per_step=2,
                                     bucket_cap_mb=cap, client=c)
        db = rt.DistributedOptimizer(ob, named_parameters=mb.named_parameters(),
                                     backward_passes_per_step=2,
                                     bucket_cap_mb=cap, client=c,
                                     staging=True)
        assert len(db.buckets) == 3, [b.params for b in db.buckets]
        assert all(type(b).__name__ == "_StagedBucket" for b in db.buckets)
        x = torch.linspace(-2, 2, 4 * 6).view(4, 6) * (rank + 1)
        for step in range(2):
            for m, d in ((ma, da), (mb, db)):
                d.zero_grad()
                for j in range(2):
                    m(x[2 * j:2 * j + 2] + step).pow(2).sum().backward()
                d.step()
        for (n, pa), pb in zip(ma.named_parameters(), mb.parameters()):
            assert torch.equal(pa, pb), (n, pa, pb)
            assert torch.equal(pa.grad, pb.grad), n
            assert c.owns(pa.grad.data_ptr(), 4)
            assert not c.owns(pb.grad.data_ptr(), 4), n
        assert not torch.equal(mb[0].weight, make()[0].weight)  # it moved
        held[("staged", rank)] = torch.cat([p.detach().reshape(-1)
                                            for p in mb.parameters()])
        da.close()
        db.close()
        # bf16 through staging: the bucket is a bf16 ringd buffer, cast
        # before the copy; 0.3 and 0.6 are not bf16 numbers.
        p = torch.nn.Parameter(torch.zeros(8))
        ps = torch.nn.ParameterList([p])
        d = rt.DistributedOptimizer(torch.optim.SGD(ps.parameters(), lr=1.0),
                                    named_parameters=ps.named_parameters(),
                                    compression=rt.Compression.bf16,
                                    client=c, staging=True)
        assert d.buckets[0].host.dtype == torch.bfloat16
        ((p * (rank + 1) * 0.3).sum()).backward()
        d.step()
        err = float((p.detach() + 0.45).abs().max())
        assert 1e-5 < err < 1e-2, p
        assert p.grad.dtype == torch.float32
        d.close()
        # A device ringd cannot stage: named, before any collective.
        q = torch.nn.Parameter(torch.zeros(4, device="meta"))
        qs = torch.nn.ParameterList([q])
        try:
            rt.DistributedOptimizer(torch.optim.SGD(qs.parameters(), lr=1.0),
                                    named_parameters=qs.named_parameters(),
                                    client=c)
        except rt.UnsupportedDevice as e:
            assert "parameter 0 is on meta" in str(e), e
            msg = str(e)
        else:
            raise AssertionError("a meta parameter was accepted")
        sync()
        if rank == 0:
            assert torch.equal(held[("staged", 0)], held[("staged", 1)]), \
                held
            print("staged: equal to the in-region path bitwise (k=2, "
                  "3 buckets), replicas identical; bf16 staged error "
                  "%.1g; UnsupportedDevice: %s" % (err, msg))
        sync()

    issued = threading.Event()

    def really_async(c, rank, sync):
        # Rank 1 issues only once rank 0's issue has returned (or after
        # 60 s, so that a blocking rank 0 still completes and the failure
        # is named, not a hang).
        t = rt.zeros(NEL, client=c)
        t.fill_(rank + 1)
        if rank == 0:
            h = rt.allreduce_async_(t, op="sum", client=c)
            issued.set()
        else:
            early = issued.wait(60)
            h = rt.allreduce_async_(t, op="sum", client=c)
        assert h.wait() is t and (t == 3).all(), t
        assert h.done() and h.wait() is t       # released: waits no more
        u = rt.zeros(NEL, client=c)
        u.fill_(rank + 1)
        h = rt.allreduce_async_(u, op="max", client=c)
        for _ in range(10 ** 7):
            if h.done():
                break
        assert h.done() and (h.wait() == 2).all(), u
        # Asserted last: rank 0 needs the peer through the phase.
        assert rank == 0 or early, \
            "allreduce_async_ blocked until the peer issued"
        if rank == 0:
            print("allreduce_async_: issued before the peer, done() polled")

    def reduce_async(c, t):
        h = rt.allreduce_async_(t, op="sum", client=c)
        assert h.wait() is t

    # really_async last: when it fails, no later step waits for the
    # failed trainer.
    return [dtypes, bad, differ, broadcast, many_buckets, compressed,
            module_buckets, staged] + freeing_phases(
        o, lambda c: rt.zeros((2, 3), client=c), reduce_async,
        "500 tensors reduced in one step, then freed") + [really_async]


def check_cuda_log(log, hosts):
    """What staging.Device was asked to do (tests/py/fake_cuda.py's log)
    is the CUDA protocol: every transfer asynchronous, on the side
    stream, between equal dtypes (casts on the device); each copy into
    ringd memory (hosts: (address, bytes) ranges) after the side stream
    waited for an event of the caller's stream; each allreduce after an
    event recorded behind its buffer's last copy was waited for; each
    copy back after the side stream waited for the caller's stream, and
    the caller's stream waits for an event behind the last one. Returns
    (copies in, copies back)."""
    def into(ptr):
        return any(a <= ptr < a + n for a, n in hosts)
    on = {}                 # event id -> stream it was recorded on
    side_wait = None        # the side stream's last wait
    last_in = {}            # host address -> index of its last copy in
    n_in = n_out = 0
    last_out = None
    for i, e in enumerate(log):
        if e[0] == "record":
            on[e[2]] = (e[1], i)
        elif e[0] in ("wait_event", "wait_stream") and e[1] != "default":
            side_wait = e
        elif e[0] == "copy":
            _, stream, sdt, ddt, ptr, _ = e
            assert stream != "default", (i, e)
            assert sdt == ddt, ("a cast in the transfer", i, e)
            if into(ptr):
                assert side_wait and side_wait[0] == "wait_event" and \
                    on[side_wait[2]][0] == "default", (i, e, side_wait)
                side_wait = None    # one wait per copy in
                base = max(a for a, _ in hosts if a <= ptr)
                last_in[base] = i
                n_in += 1
            else:
                assert side_wait == ("wait_stream", stream, "default"), \
                    (i, e, side_wait)
                n_out += 1
                last_out = i
        elif e[0] == "allreduce" and e[1] in last_in:
            start = last_in[e[1]]
            done = [ev for ev, (st, k) in on.items()
                    if st != "default" and start < k < i]
            assert any(("synchronize", ev) in log[start:i] or
                       ("query", ev) in log[start:i] for ev in done), \
                ("allreduce before its copies were waited for", i)
    assert last_out is not None
    tail = log[last_out:]
    rec = [e[2] for e in tail if e[0] == "record" and e[1] != "default"]
    assert any(("wait_event", "default", ev) in tail for ev in rec), \
        "the caller's stream does not wait for the copies back"
    return n_in, n_out


def fakecuda_phases(o):
    """staging.Device (the CUDA path) on CPU tensors, with torch.cuda
    faked (tests/py/fake_cuda.py): the DistributedOptimizer's results
    are the in-region path's, bitwise; its log is the CUDA protocol
    (check_cuda_log); buckets page-locked once and unlocked when
    collected; elastic.State's staged tensors go through the region
    page-locked once."""
    import mmap
    import torch
    import ringd.torch as rt
    from ringd.torch import elastic, staging
    import fake_cuda
    fake_cuda.install()

    def make():
        m = torch.nn.Sequential(torch.nn.Linear(6, 5),
                                torch.nn.Linear(5, 3))
        with torch.no_grad():
            for i, p in enumerate(m.parameters()):
                p.copy_(torch.linspace(-1, 1, p.numel()).view_as(p) *
                        (i + 1) / 3)
        return m

    def pinned(fake, host):
        nb = host.numel() * host.element_size()
        size = fake.registered.get(host.data_ptr())
        return size is not None and size >= nb and \
            size % mmap.PAGESIZE == 0

    def dopt(c, rank, sync):
        fake = fake_cuda.FakeCuda()
        ma, mb = make(), make()
        oa = torch.optim.Adam(ma.parameters(), lr=0.05)
        ob = torch.optim.Adam(mb.parameters(), lr=0.05)
        cap = 20 * 4 / float(1 << 20)
        da = rt.DistributedOptimizer(oa, named_parameters=ma.named_parameters(),
                                     backward_passes_per_step=2,
                                     bucket_cap_mb=cap, client=c)
        with fake:
            db = rt.DistributedOptimizer(
                ob, named_parameters=mb.named_parameters(),
                backward_passes_per_step=2, bucket_cap_mb=cap, client=c,
                staging=True)
        assert len(db.buckets) == 3
        assert all(isinstance(b.stager, staging.Device) for b in db.buckets)
        assert all(pinned(fake, b.host) for b in db.buckets), fake.registered
        assert len(fake.registered) == 3
        x = torch.linspace(-2, 2, 4 * 6).view(4, 6) * (rank + 1)
        for step in range(2):
            for m, d in ((ma, da), (mb, db)):
                with (fake if d is db else contextlib_null()):
                    d.zero_grad()
                    for j in range(2):
                        m(x[2 * j:2 * j + 2] + step).pow(2).sum().backward()
                    d.step()
        for (n, pa), pb in zip(ma.named_parameters(), mb.parameters()):
            assert torch.equal(pa, pb), n
        hosts = [(b.host.data_ptr(), b.host.numel() * 4) for b in db.buckets]
        n_in, n_out = check_cuda_log(fake.log, hosts)
        assert (n_in, n_out) == (2 * 4, 2 * 4), (n_in, n_out)
        assert fake.log.count(("allreduce", db.buckets[0].host.data_ptr())) \
            == 2
        # bf16: cast on the "device" before the copy, widened after.
        fake2 = fake_cuda.FakeCuda()
        p = torch.nn.Parameter(torch.zeros(8))
        ps = torch.nn.ParameterList([p])
        with fake2:
            d = rt.DistributedOptimizer(
                torch.optim.SGD(ps.parameters(), lr=1.0),
                named_parameters=ps.named_parameters(),
                compression=rt.Compression.bf16, client=c, staging=True)
            ((p * (rank + 1) * 0.3).sum()).backward()
            d.step()
        host = d.buckets[0].host
        assert host.dtype == torch.bfloat16 and pinned(fake2, host)
        copies = [e for e in fake2.log if e[0] == "copy"]
        assert [e[2] for e in copies] == [torch.bfloat16] * 2, copies
        check_cuda_log(fake2.log, [(host.data_ptr(), 16)])
        err = float((p.detach() + 0.45).abs().max())
        assert 1e-5 < err < 1e-2, p
        for dd in (da, db, d):
            dd.close()
        del da, db, d, dd, host
        gc.collect()
        assert fake.registered == {} and fake2.registered == {}, \
            "buckets still page-locked once collected"
        if rank == 0:
            print("fake cuda: DistributedOptimizer staged through the side "
                  "stream (%d copies in, %d back) equals the in-region path "
                  "bitwise; bf16 cast on the device (error %.1g); buckets "
                  "unlocked when collected" % (n_in, n_out, err))

    def state(c, rank, sync):
        fake = fake_cuda.FakeCuda()
        m = make()
        opt = torch.optim.Adam(m.parameters(), lr=0.05)
        with fake:
            st = elastic.State(model=m, optimizer=opt, client=c,
                               staging=True)
        regs = [e for e in fake.log if e[0] == "register"]
        assert len(regs) == 1 and regs[0][1] == st._pinned.data_ptr(), regs
        assert regs[0][2] >= st.nbytes and regs[0][2] % mmap.PAGESIZE == 0
        assert len(st._staged) == 4 + 3 * 4
        saved = [t.detach().clone() for _, t, _ in st._staged]
        del fake.log[:]
        with fake:
            st.commit()
        copies = [e for e in fake.log if e[0] == "copy"]
        assert len(copies) == len(saved) and all(
            e[1] != "default" for e in copies), copies
        marks = [e[2] for e in fake.log if e[0] == "record" and
                 e[1] != "default"]
        assert ("synchronize", marks[-1]) in fake.log, fake.log
        with torch.no_grad():
            for _, t, _ in st._staged:
                t.add_(1)
        del fake.log[:]
        with fake:
            st.restore()
        for (_, t, _), want in zip(st._staged, saved):
            assert torch.equal(t, want)
        check_cuda_log(fake.log, [(st._pinned.data_ptr(), st.nbytes)])
        marks = [e[2] for e in fake.log if e[0] == "record" and
                 e[1] != "default"]
        assert ("synchronize", marks[-1]) in fake.log, fake.log
        if rank == 0:
            print("fake cuda: elastic.State's %d staged tensors through the "
                  "region page-locked once, copied on the side stream at "
                  "commit and restore" % len(saved))

    return [dopt, state]


def contextlib_null():
    import contextlib
    return contextlib.nullcontext()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--daemon-pid", type=int, required=True)
    ap.add_argument("--part", choices=("numpy", "torch", "fakecuda"),
                    required=True)
    o = ap.parse_args()
    if o.part in ("torch", "fakecuda"):
        try:
            import torch  # noqa: F401
        except ImportError as e:
            print("SKIP torch cannot be imported: %s" % e)
            return 0
        phases = (torch_phases if o.part == "torch" else fakecuda_phases)(o)
    else:
        phases = numpy_phases(o)
    run_phases(o.socket, phases)
    print("PASS", o.part)
    return 0


if __name__ == "__main__":
    sys.exit(main())
