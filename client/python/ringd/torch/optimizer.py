"""DistributedOptimizer and the first-sync broadcasts of ringd.torch.

    opt = rt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  compression=rt.Compression.bf16)

Gradients live in fusion buckets: each bucket is one ringd buffer and the
.grad of each of its parameters is a view of it, so backward accumulates
straight into shared memory. Compression of float32 gradients is the
daemon's (16-bit floats between nodes, accumulated in f32, nothing cast
here); other dtypes accumulate into a local bucket that is cast into a
ringd buffer of the wire dtype. A hook on each
parameter's gradient accumulator counts it ready; a bucket whose
parameters are all ready is issued at once (an asynchronous allreduce,
so its reduction overlaps the rest of backward), in bucket order: every
trainer issues the same collectives in the same order, which ringd
requires, because the bucket order is fixed at construction from the
parameter order alone and a bucket is never issued before the ones
ahead of it. step() issues what is left, waits for every handle, then
runs the wrapped optimizer; the hooks never wait.

Parameters that are not on the CPU (CUDA), and CPU ones when staging=True,
are staged instead (ringd/torch/staging.py): .grad stays the tensor
autograd made, each bucket is a ringd buffer of the wire dtype, and a
gradient is copied into it once ready (cast to the wire dtype first, on
the device). A bucket is issued once all its copies are done; after its
wait the result is copied back into each .grad. On CUDA the copies run
on a side stream into the buffer page-locked with cudaHostRegister, and
the caller's stream waits for the copies back before the wrapped step.
"""
import zlib

import torch

import ringd
import ringd.torch as rt
from ringd.torch import staging as staging_mod


# A bucket this full closes at a module boundary (see _make_buckets).
MODULE_SPLIT_BYTES = 1 << 20


# The reductions of gradients (op= of DistributedOptimizer).
Average, Sum, Min, Max = "avg", "sum", "min", "max"
_OPS = (Average, Sum, Min, Max)


class GradChanged(RuntimeError):
    """A bucket's .grad was written while its reduction was in flight
    (clipping or unscaling before step() without synchronize())."""


class Compression:
    """The wire dtype of gradients: none (their own), fp16 or bf16."""
    none = None
    fp16 = torch.float16
    bf16 = torch.bfloat16


def _digest(params):
    """56 bits of the parameters' bytes: CRC-32 and 24 bits of Adler-32,
    read in place. A check for accidents, not adversaries, on the path of
    every view change (and so of a kill's cost): at 25 M parameters 72
    ms of CPU here, against 176 for blake2b in place and 230 for blake2b
    over a copy."""
    crc, adler = 0, 1
    for p in params:
        a = p.detach()
        if a.numel() == 0:
            continue
        if a.device.type != "cpu":
            a = a.cpu()
        if not a.is_contiguous():
            a = a.contiguous()
        mv = a.view(-1).view(torch.uint8).numpy()
        crc, adler = zlib.crc32(mv, crc), zlib.adler32(mv, adler)
    return (crc << 24) | (adler & 0xFFFFFF)


# Compression of a float32 bucket done by the daemon (ringd_wire_t):
# 16-bit floats between nodes, accumulated in f32, with no cast here.
_DAEMON_WIRE = {torch.bfloat16: "bf16", torch.float16: "f16"}


def _daemon_compresses(dtype, wire):
    return (dtype == torch.float32 and wire in _DAEMON_WIRE and
            hasattr(ringd._lib, "ringd_allreduce_wire_async"))


class _Bucket:
    def __init__(self, index, params, dtype, wire, client):
        self.index = index
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.wire_name = None
        if wire is None or wire == dtype or _daemon_compresses(dtype, wire):
            # .grad views straight into ringd memory: nothing is copied.
            self.flat = rt.zeros(self.numel, dtype=dtype, client=client)
            self.wire = self.flat
            if wire is not None and wire != dtype:
                self.wire_name = _DAEMON_WIRE[wire]
        else:
            # Other dtypes: cast into a ringd buffer of the wire dtype.
            self.flat = torch.zeros(self.numel, dtype=dtype)
            self.wire = rt.zeros(self.numel, dtype=wire, client=client)
        self.views = []
        off = 0
        for p in params:
            self.views.append(self.flat[off:off + p.numel()].view_as(p))
            off += p.numel()
        self.ready = 0          # parameters whose gradient is complete
        self.handle = None

    def bind(self):
        """Make each .grad the bucket's view (copying a gradient that
        autograd put elsewhere, e.g. after zero_grad(set_to_none=True))."""
        for p, v in zip(self.params, self.views):
            if p.grad is None:
                v.zero_()
            elif p.grad.data_ptr() != v.data_ptr():
                v.copy_(p.grad)
            p.grad = v

    def reduce(self, client, op="avg", prescale=1.0):
        self.bind()
        if prescale != 1.0:
            self.flat.mul_(prescale)
        if self.wire is not self.flat:
            self.wire.copy_(self.flat)
        # .grad are views of flat: they share its version counter, which
        # any in-place write to one of them bumps (wait() checks it).
        self.version = self.flat._version
        self.handle = rt.allreduce_async_(self.wire, op=op, client=client,
                                          wire=self.wire_name)

    def changed(self):
        return self.flat._version != self.version

    def stage(self, p):
        pass

    def copied(self):
        return True

    def wait(self, scale):
        h, self.handle = self.handle, None
        h.wait()
        if self.changed():
            raise GradChanged(_changed_msg(self))
        if self.wire is not self.flat:
            self.flat.copy_(self.wire)
        if scale != 1.0:
            self.flat.mul_(scale)

    def zero(self):
        self.flat.zero_()
        self.bind()

    def reset(self):
        self.ready = 0
        self.handle = None


class _StagedBucket:
    """A bucket of parameters outside ringd memory: .grad stays where
    autograd keeps it (on the parameter's device); self.host, a ringd
    buffer of the wire dtype, receives each gradient once it is ready and
    gives back the result (see the module's docstring)."""

    def __init__(self, index, params, dtype, wire, client, stager):
        self.index = index
        self.params = params
        self.stager = stager
        self.numel = sum(p.numel() for p in params)
        self.wire_name = None
        self.host = rt.zeros(self.numel, dtype=wire or dtype, client=client)
        stager.register(self.host)
        self.views = []
        off = 0
        for p in params:
            self.views.append(self.host[off:off + p.numel()].view(p.shape))
            off += p.numel()
        self._slot = {id(p): i for i, p in enumerate(params)}
        self.ready = 0
        self.handle = None
        self._staged = set()    # parameters copied in this step
        self._mark = None       # the copies in, once all are issued
        self._back = None       # the copies back of the last wait()
        self._versions = {}     # .grad._version when copied in

    def bind(self):
        """Every parameter has a .grad (zeros at first), as in a bucket
        in ringd memory: backward then accumulates into it the same way
        on both paths, and the copy back has a place to go."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)

    def stage(self, p):
        """p's gradient is complete: issue its copy into the bucket."""
        v = self.views[self._slot[id(p)]]
        if p.grad is None:
            # Written by the CPU: the last copies back must be done.
            self.stager.wait(self._back)
            v.zero_()
        else:
            self.stager.to_host(v, p.grad.detach())
        self._staged.add(id(p))
        self._mark = None
        self._versions[id(p)] = (p.grad._version if p.grad is not None
                                 else None)

    def changed(self):
        return any(self._versions.get(id(p)) != (
            p.grad._version if p.grad is not None else None)
            for p in self.params)

    def copied(self):
        """Whether every copy into the bucket is done (never blocks)."""
        if self._mark is None:
            self._mark = self.stager.mark()
        return self.stager.done(self._mark)

    def reduce(self, client, op="avg", prescale=1.0):
        for p in self.params:
            if id(p) not in self._staged:   # fewer passes, or unused
                self.stage(p)
        self.copied()
        # The allreduce reads the buffer: the copies must have landed.
        self.stager.wait(self._mark)
        if prescale != 1.0:
            self.host.mul_(prescale)
        self.handle = rt.allreduce_async_(self.host, op=op, client=client)

    def wait(self, scale):
        h, self.handle = self.handle, None
        h.wait()
        if self.changed():
            raise GradChanged(_changed_msg(self))
        for p, v in zip(self.params, self.views):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self.stager.to_device(p.grad, v, scale)
        self._back = self.stager.mark()
        self.stager.device_ready()
        self._staged.clear()
        self._mark = None

    def zero(self):
        for p in self.params:
            if p.grad is not None:
                p.grad.detach().zero_()
        self.bind()

    def reset(self):
        """A step starts over (or failed): nothing of it is staged."""
        self.ready = 0
        self.handle = None
        self._staged.clear()
        self._mark = None
        self._versions = {}


def _changed_msg(b):
    return ("DistributedOptimizer: a .grad of bucket %d was written while "
            "its reduction was in flight (clipping or unscaling before "
            "step()?): call opt.synchronize() first, then step() inside "
            "opt.skip_synchronize()" % b.index)


def _check_named(optimizer, named):
    """The trainable parameters of named, checked against the optimizer
    both ways: one the optimizer updates and named lacks would never be
    averaged; one named holds and the optimizer lacks would be reduced
    for nothing. Either is a ValueError naming them."""
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        raise ValueError("named_parameters: duplicate names")
    in_opt = {id(p) for g in optimizer.param_groups for p in g["params"]}
    params = [p for _, p in named if p.requires_grad]
    missing = [n for n, p in named if p.requires_grad and
               id(p) not in in_opt]
    if missing:
        raise ValueError("named_parameters holds parameters the "
                         "optimizer does not update: %s" %
                         ", ".join(missing))
    in_named = {id(p) for _, p in named}
    unnamed = [(gi, pi, tuple(p.shape)) for gi, g in
               enumerate(optimizer.param_groups)
               for pi, p in enumerate(g["params"])
               if id(p) not in in_named]
    if unnamed:
        # It would never be averaged: every replica would drift.
        raise ValueError("the optimizer updates parameters that "
                         "named_parameters lacks (param_groups[g]"
                         "['params'][i] of shape s): %s" % ", ".join(
                             "[%d][%d] %s" % u for u in unnamed))
    return params


class DistributedOptimizer:
    """Wraps a torch optimizer: gradients averaged over the job's trainers
    of the step (ringd's avg divides by that step's trainer count), then
    the wrapped step. backward_passes_per_step=k accumulates k backward
    passes locally and reduces on the k-th; the k gradients are averaged,
    so k passes over batches of b equal one pass over k*b with a mean
    loss. Raises ringd.Reshape from step() (or backward()) when the view
    changed: redo the step (elastic.run does).

    staging: True stages CPU parameters too (their .grad stays autograd's
    tensor, copied into and out of ringd memory), False or None keeps
    the gradients of CPU parameters in ringd memory. Parameters on a
    CUDA device are always staged; any other device raises
    UnsupportedDevice naming the parameter.

    op: Average (the default), Sum, Min or Max (rt.Average, ...).
    gradient_predivide_factor=f (Average only): gradients are divided by
    f before the sum and the result multiplied by f / world, as Horovod's.

    model: its buffers (BatchNorm's running statistics, any registered
    buffer) are broadcast from rank 0 of the step at every step, after
    the gradients (see _sync_buffers), and are part of the equality check
    of each new view. Without model= buffers are left to the caller.

    Clipping and GradScaler: call synchronize(), change .grad, then
    step() inside skip_synchronize(). A .grad written while its bucket's
    reduction is in flight raises GradChanged from step()."""

    def __init__(self, optimizer, named_parameters=None,
                 compression=Compression.none, backward_passes_per_step=1,
                 bucket_cap_mb=25, client=None, check_equal=True,
                 staging=None, op=Average, gradient_predivide_factor=1.0,
                 model=None):
        if op not in _OPS:
            raise ValueError("op %r: use rt.Average, rt.Sum, rt.Min or "
                             "rt.Max" % (op,))
        self.op = op
        self.predivide = float(gradient_predivide_factor)
        if self.predivide <= 0 or (self.predivide != 1.0 and op != Average):
            raise ValueError("gradient_predivide_factor: a positive factor, "
                             "with op=Average only")
        self._skip = False
        self._synced = False
        self.buffers = ([(n, b) for n, b in model.named_buffers()]
                        if model is not None else [])
        self._buf_digests = None
        self._buf_gen = None
        self._buf_pack = None
        self._pre = (model.register_forward_pre_hook(self._pre_forward)
                     if model is not None else None)
        self.optimizer = optimizer
        self.client = rt._pick(client)
        hooks = getattr(self.client, "abandon_hooks", None)
        if self.buffers and hooks is not None:
            hooks.append(self.abandon)
        self.k = int(backward_passes_per_step)
        if self.k < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        if named_parameters is not None:
            named = list(named_parameters)
        else:
            named = [("param.%d" % i, p) for i, p in enumerate(
                p for g in optimizer.param_groups for p in g["params"])]
        params = _check_named(optimizer, named)
        self._stager = {}
        for n, p in named:
            st = staging_mod.stager_for(p, "parameter %s" % n)
            if staging or p.device.type != "cpu":
                self._stager[id(p)] = st
            if compression is not None and not p.dtype.is_floating_point:
                raise rt.UnsupportedDtype("parameter %s is %s: compression "
                                          "applies to floating point" %
                                          (n, p.dtype))
            rt.wire_dtype(p.dtype)
        self.names = {id(p): n for n, p in named}
        self.buckets = self._make_buckets(params, compression,
                                          int(bucket_cap_mb * (1 << 20)))
        self._bucket_of = {}
        for b in self.buckets:
            for p in b.params:
                self._bucket_of[id(p)] = b
            b.bind()
        self._count = {}            # backward passes seen per parameter
        self._next = 0              # the next bucket to reduce, in order
        self._broken = None         # a Reshape raised inside a hook
        self._check = check_equal
        self._checked_gen = None
        # Test hook: a list to receive ("hook", name), ("issue", bucket),
        # ("step",) and ("wait", bucket) events in the order they happen.
        self.trace = None
        self._hooks = []
        for p in params:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hooks.append((acc, acc.register_hook(self._hook(p))))

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, d):
        self.optimizer.load_state_dict(d)

    def _make_buckets(self, params, compression, cap):
        # Reverse registration order is about the order backward produces
        # gradients in, so early buckets fill first. A bucket of
        # MODULE_SPLIT_BYTES or more also closes where the module changes:
        # one module's gradients come from one backward node, the next
        # module's from a later one, so taking the next module's first
        # parameter (a bias, say) would hold the bucket back for that whole
        # node (in bench/torch-overhead.py's MLP, the 16 MiB of the last
        # layer waited for the 4096x4096 layer's backward).
        buckets, cur, cur_bytes = [], [], 0
        split = min(cap, MODULE_SPLIT_BYTES)
        for p in reversed(params):
            nbytes = p.numel() * p.element_size()
            module = self.names[id(p)].rpartition(".")[0]
            kind = (p.dtype, p.device, self._stager.get(id(p)))
            if cur and (cur_bytes + nbytes > cap or cur_kind != kind
                        or (cur_bytes >= split and module != cur_module)):
                buckets.append(cur)
                cur, cur_bytes = [], 0
            cur.append(p)
            cur_bytes += nbytes
            cur_module, cur_kind = module, kind
        if cur:
            buckets.append(cur)
        return [self._bucket(i, ps, compression)
                for i, ps in enumerate(buckets)]

    def _bucket(self, i, ps, compression):
        st = self._stager.get(id(ps[0]))
        if st is None:
            return _Bucket(i, ps, ps[0].dtype, compression, self.client)
        wire = compression if compression != ps[0].dtype else None
        return _StagedBucket(i, ps, ps[0].dtype, wire, self.client, st)

    def _hook(self, p):
        def hook(*_):
            self._synced = False
            n = self._count[id(p)] = self._count.get(id(p), 0) + 1
            if self.trace is not None:
                self.trace.append(("hook", self.names[id(p)]))
            if n == self.k:
                b = self._bucket_of[id(p)]
                b.stage(p)
                b.ready += 1
                # Also when b is not complete: a staged bucket ahead of it
                # may have been complete but its copies still running.
                self._flush(all_buckets=False)
        return hook

    def _flush(self, all_buckets):
        """Issue, in bucket order, every bucket that is complete (all of
        them at step()); never waits for a reduction to finish, except
        for the oldest when ringd's cap on outstanding handles is hit."""
        if self._broken is not None:
            return
        try:
            self._check_equal()
            while self._next < len(self.buckets):
                b = self.buckets[self._next]
                if not all_buckets and (b.ready < len(b.params) or
                                        not b.copied()):
                    return
                self._issue(b)
                self._next += 1
        except (ringd.Error, ValueError) as e:
            # Raised from step(): an exception inside an autograd hook
            # would reach the caller wrapped.
            self._broken = e

    def _issue(self, b):
        if self._next >= ringd.MAX_OUTSTANDING:
            # The cap counts this client's handles; the check's
            # reductions were waited for already.
            self._wait_bucket(self.buckets[self._next -
                                           ringd.MAX_OUTSTANDING])
        b.reduce(self.client, self.op, 1.0 / self.predivide)
        if self.trace is not None:
            self.trace.append(("issue", b.index))

    def _wait_bucket(self, b):
        if b.handle is None:
            return
        if self.trace is not None:
            self.trace.append(("wait", b.index))
        scale = 1.0 / self.k
        if self.predivide != 1.0:
            scale *= self.predivide     # avg already divided by world
        b.wait(scale)

    def _check_equal(self):
        """Before the first reduction of each view: parameters that
        differ across trainers (no broadcast_parameters, a joiner that did
        not restore) are an error, not a silent divergence. Every trainer
        of a new view (joiners in their first step) does it at the same
        step, so all post the same collectives."""
        v = self.client.view
        gen = v.generation if v is not None else None
        if not self._check or gen == self._checked_gen:
            return
        ps = [p for b in self.buckets for p in b.params]
        ds = [_digest([p]) for p in ps]
        # Buffers as the step's first forward found them (forward has
        # moved BatchNorm's statistics since, differently everywhere).
        if self.buffers:
            if self._buf_gen != gen or self._buf_digests is None:
                self._buf_digests = [_digest([t]) for _, t in self.buffers]
            ds += self._buf_digests
            ps = ps + [t for _, t in self.buffers]
        # One allreduce (max) of every digest and its negation: a
        # parameter is equal everywhere when max == -max(-d) == min.
        t = rt.zeros(2 * len(ps), dtype=torch.int64, client=self.client)
        t.copy_(torch.tensor(ds + [-d for d in ds], dtype=torch.int64))
        rt.allreduce_(t, op="max", client=self.client)
        self._checked_gen = gen
        n = len(ps)
        names = dict(self.names)
        names.update({id(b): "buffer " + nm for nm, b in self.buffers})
        bad = [names[id(p)] for i, p in enumerate(ps)
               if int(t[i]) != -int(t[n + i])]
        if bad:
            more = " and %d more" % (len(bad) - 5) if len(bad) > 5 else ""
            raise ValueError("DistributedOptimizer: parameters differ "
                             "across trainers: %s%s; call "
                             "ringd.torch.broadcast_parameters() (and "
                             "model= for buffers) first" %
                             (", ".join(bad[:5]), more))

    def synchronize(self):
        """Issue every bucket not yet issued and wait for all; raises
        ringd.Reshape when the view changed (redo the step). After a
        failure every handle of the step has been waited for and the
        counts start over."""
        if self.trace is not None:
            self.trace.append(("step",))
        passes = max(self._count.values(), default=self.k)
        if passes < self.k:
            raise RuntimeError("DistributedOptimizer.step() after %d of %d "
                               "backward passes" % (passes, self.k))
        self._flush(all_buckets=True)
        err, self._broken = self._broken, None
        try:
            for b in self.buckets:
                try:
                    self._wait_bucket(b)
                except (ringd.Error, GradChanged) as e:
                    # Wait for the rest all the same: none may be left
                    # outstanding into the redone step.
                    if err is None:
                        err = e
            if err is not None:
                self.abandon()
                raise err
            self._sync_buffers()
            self._synced = True
        finally:
            self._reset()

    def _pre_forward(self, *_):
        """The first forward of a step: when the step is redone, buffers
        go back to the values the step started from (the failed attempt
        had moved them, differently on each trainer); otherwise those
        values are kept for a redo (a view that restored the state starts
        from what it restored). In a new view their digests are taken
        for the equality check."""
        v = self.client.view
        key = (v.generation, v.step) if v is not None else None
        last = getattr(self, "_buf_key", None)
        if key is None or key == last:
            return
        self._buf_key = key
        redo = last is not None and last[1] == key[1] and not v.restored
        if redo and self._buf_pack is not None:
            self._unpack_buffers()
        else:
            self._pack_buffers()
        if v.generation != self._buf_gen:
            self._buf_gen = v.generation
            self._buf_digests = [_digest([t]) for _, t in self.buffers]

    def abandon(self):
        """A step attempt failed after its forward (synchronize() raised,
        or elastic.run saw a view change; ringd.Client.abandon_hooks):
        buffers go back to the values the step started from at once, not
        only at the redo's forward. The daemon may take this trainer's
        state region at the next step start, for a joiner or for the
        broadcast that makes every replica equal, and that state must not
        hold the statistics of an attempt that never happened."""
        if self.buffers and self._buf_pack is not None:
            self._unpack_buffers()

    def _pack_buffers(self):
        if not self.buffers:
            return
        if self._buf_pack is None:
            total = sum(t.numel() * t.element_size() for _, t in self.buffers)
            self._buf_pack = rt.zeros(max(total, 1), dtype=torch.uint8,
                                      client=self.client)
            self._buf_views, off = [], 0
            for _, t in self.buffers:
                n = t.numel() * t.element_size()
                self._buf_views.append(self._buf_pack[off:off + n])
                off += n
        for (_, t), pv in zip(self.buffers, self._buf_views):
            pv.copy_(t.detach().contiguous().view(-1).view(torch.uint8))

    def _unpack_buffers(self):
        with torch.no_grad():
            for (_, t), pv in zip(self.buffers, self._buf_views):
                t.copy_(pv.view(t.dtype).view_as(t))

    def _sync_buffers(self):
        """Rank 0's buffers to every trainer, as DDP's broadcast_buffers:
        bitwise equal replicas, and evaluation that does not depend on
        which one is asked. Broadcast rather than averaged: an average of
        running variances is not the variance of the global batch either,
        and integer buffers (num_batches_tracked) have no mean."""
        if not self.buffers:
            return
        self._pack_buffers()
        rt.broadcast_(self._buf_pack, root=0, client=self.client)
        self._unpack_buffers()

    def skip_synchronize(self):
        """with opt.skip_synchronize(): opt.step() - the wrapped step on
        gradients synchronize() already reduced (Horovod's pattern)."""
        import contextlib

        @contextlib.contextmanager
        def cm():
            self._skip = True
            try:
                yield
            finally:
                self._skip = False
        return cm()

    def _reset(self):
        for b in self.buckets:
            b.reset()
        self._count = {}
        self._next = 0

    def step(self, closure=None):
        """After k backward passes: reduce, then the wrapped step. Inside
        skip_synchronize() (after synchronize()) it does not reduce."""
        if self._skip:
            if not self._synced:
                raise RuntimeError("DistributedOptimizer.step() inside "
                                   "skip_synchronize() without "
                                   "synchronize() first")
        else:
            self.synchronize()
        self._synced = False
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none=False):
        """Zero the buckets in place (.grad stays the bucket's view); a
        redone step starts here too, so the counts start over."""
        for b in self.buckets:
            b.zero()
        self._reset()
        self._broken = None

    def close(self):
        if self._pre is not None:
            self._pre.remove()
            self._pre = None
        for _, h in self._hooks:
            h.remove()
        self._hooks = []


def _tensors_of(params):
    if hasattr(params, "items"):
        items = list(params.items())
    else:
        items = list(params)
    return [(n, t) for n, t in items if torch.is_tensor(t)]


def _outside_step(fn):
    """Run fn inside a step; outside one (the daemon refuses a collective
    there, RINGD_ESTATE, before anything is sent) open one step for it:
    every trainer must then call it at the same point, and the job's step
    counter moves on by one."""
    import functools

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        c = rt._pick(kw.get("client"))
        try:
            return fn(*a, **kw)
        except ringd.Error as e:
            if e.code != ringd.ESTATE or "outside a step" not in str(e):
                raise
        c.step_begin()
        out = fn(*a, **kw)
        c.step_end()
        return out
    return wrapper


@_outside_step
def broadcast_parameters(params, root_rank=0, client=None):
    """Overwrite params (a state_dict, or (name, tensor) pairs) with the
    root trainer's: one broadcast of their bytes through a ringd buffer.
    Outside a step it opens one (see _outside_step)."""
    c = rt._pick(client)
    tensors = _tensors_of(params)
    total = sum(t.numel() * t.element_size() for _, t in tensors)
    if total == 0:
        return
    buf = rt.zeros(total, dtype=torch.uint8, client=c)
    off = 0
    views = []
    for _, t in tensors:
        n = t.numel() * t.element_size()
        v = buf[off:off + n]
        v.copy_(t.detach().contiguous().view(-1).view(torch.uint8))
        views.append(v)
        off += n
    rt.broadcast_(buf, root=root_rank, client=c)
    with torch.no_grad():
        for (_, t), v in zip(tensors, views):
            t.copy_(v.view(t.dtype).view_as(t))


@_outside_step
def broadcast_optimizer_state(optimizer, root_rank=0, client=None):
    """Give every trainer the root's optimizer state (moments, step
    counters) and hyperparameters. The state is created first where it
    does not exist yet, as a fresh optimizer would. Outside a step it
    opens one (see _outside_step)."""
    from ringd.torch import elastic
    import json
    c = rt._pick(client)
    opt = getattr(optimizer, "optimizer", optimizer)
    elastic._materialize_optimizer(opt)
    params = [p for g in opt.param_groups for p in g["params"]]
    tensors = [("%d/%s" % (i, k), v) for i, p in enumerate(params)
               for k, v in sorted(opt.state[p].items()) if torch.is_tensor(v)]
    # Within this call's step (the wrapper's retry opens one for all).
    broadcast_parameters.__wrapped__(tensors, root_rank, c)
    groups = json.dumps([{k: v for k, v in g.items() if k != "params"}
                         for g in opt.param_groups]).encode()
    n = rt.zeros(1, dtype=torch.int64, client=c)
    n[0] = len(groups)
    rt.broadcast_(n, root=root_rank, client=c)
    b = rt.zeros(int(n[0]), dtype=torch.uint8, client=c)
    if len(groups) == int(n[0]):    # the root's (others are overwritten)
        b.copy_(torch.frombuffer(bytearray(groups), dtype=torch.uint8))
    rt.broadcast_(b, root=root_rank, client=c)
    for g, saved in zip(opt.param_groups,
                        json.loads(bytes(b.numpy().tobytes()))):
        g.update(saved)
