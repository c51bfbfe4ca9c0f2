"""ringd.torch.distributed - a `torch.distributed` backend named "ringd".

    import torch.distributed as dist
    import ringd.torch.distributed as rdist

    rdist.init_process_group()          # connects, begins the first step
    model = DDP(net)                    # its broadcast/allgather: in that step
    ...
    rdist.run(train_step, state, setup=lambda v: DDP(net), steps=1000)

Why a Python subclass of torch.distributed.ProcessGroup and not a C++
extension: Debian's torch 1.13 constructs one and runs DDP over it when
each collective returns torch._C._distributed_c10d._create_work_from_future
(fut) (a Python Work subclass hangs DDP's construction), and it needs no
libtorch-dev nor a compiler at the user's site.

Rank and world size come from the daemon's view (step_begin), never from
the arguments: init_process_group() here begins a step and calls
dist.init_process_group("ringd", store=HashStore(), rank=view.rank,
world_size=view.world), so torch's env:// rendezvous (MASTER_ADDR...) is
not needed. dist.init_process_group("ringd", store=..., rank=r,
world_size=n) straight works too, when the caller already began a step
with that view (a rank or size that is not the daemon's is refused).

Every collective runs inside a ringd step (step_begin .. step_end), as
all ringd collectives do; DDP's construction broadcasts and allgathers, so
it must happen inside one too: run() does it for you. Collectives return
at once; a completion thread tests the ringd handles (under one lock: a
ringd.Client is not thread-safe) and completes the futures in order, so
DDP's bucket allreduces overlap its backward. Tensors outside ringd memory
are copied into ringd buffers kept in a pool by (bytes); results are
copied back before the future completes.

A view change surfaces as ViewChanged (a ringd.Reshape), raised by the
next collective issued, by flush() and, under run(), by the optimizer's
step. The futures of collectives in flight complete with this rank's own
values instead (see _poison: torch 1.13's DDP dies on a future holding
an exception, and its Work.wait() ignores one). Through DDP's C++ reducer
it reaches Python as a RuntimeError; run() tells it apart by the process
group's `failed`. run() then re-creates the process group with the new
rank and world size and calls setup() again (a fresh DDP: the reducer of
an aborted backward is freed, not reused), and redoes the step, as
TorchFT's managed process group does.
"""
import collections
import functools
import gc
import logging
import threading
import time
import weakref

import torch
import torch.distributed as dist

import ringd
import ringd.torch as rt
from ringd.torch import elastic
from ringd.torch.syncbn import SyncBatchNorm  # noqa: F401 (exported)

BACKEND = "ringd"
_log = logging.getLogger("ringd.torch.distributed")
_make_work = torch._C._distributed_c10d._create_work_from_future
_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg",
        dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max",
        dist.ReduceOp.PRODUCT: "prod"}


class ViewChanged(ringd.Reshape):
    """The job's view changed under a collective: redo the step on the
    new view (run() does)."""


def _poison_tensor(t):
    """NaN, or -1 (all bits set), where a failed collective's output is."""
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    elif t.dtype == torch.uint8:
        t.fill_(255)
    else:
        t.fill_(-1)


def _op_name(op):
    for k, v in _OPS.items():
        if op == k:
            return v
    raise ValueError("ringd backend: reduce op %s is not one of sum, avg, "
                     "min, max, product" % op)


class _Pending:
    __slots__ = ("handle", "fut", "post", "bufs", "poison")

    def __init__(self, handle, fut, post, bufs, poison):
        self.handle, self.fut, self.post, self.bufs = handle, fut, post, bufs
        self.poison = poison


class ProcessGroupRingd(dist.ProcessGroup):
    """All trainers of the ringd job, with the rank and size of one view."""

    def __init__(self, rank, size, client=None):
        super().__init__(rank, size)
        self._r, self._n = rank, size
        self.client = rt._pick(client)
        self._failure = None        # (class, code, message) that ended it
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._queue = collections.deque()
        self._pool = collections.defaultdict(list)  # nbytes -> [uint8 t]
        self._closed = False
        self._thread = threading.Thread(target=self._complete, daemon=True,
                                        name="ringd-pg")
        self._thread.start()

    def getBackendName(self):
        return BACKEND

    # -- buffers -----------------------------------------------------------
    def _take(self, nbytes):
        # Under the lock: a new buffer is a request to the daemon on the
        # client's socket, which the completion thread uses meanwhile to
        # test handles (a ringd.Client is not thread-safe: two requests
        # interleaved there broke the connection, "reply out of
        # sequence", as soon as DDP's second bucket was made while the
        # first one's allreduce was tested), and the pool is shared too.
        with self._lock:
            free = self._pool[nbytes]
            return free.pop() if free else rt.empty(max(nbytes, 1),
                                                     torch.uint8, self.client)

    def _give(self, bufs):
        for b in bufs:
            self._pool[b.numel()].append(b)

    def _staged(self, tensors):
        """One ringd buffer holding the tensors' bytes end to end."""
        total = sum(t.numel() * t.element_size() for t in tensors)
        buf = self._take(total)
        off = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            if n:
                buf[off:off + n].copy_(t.detach().contiguous().reshape(-1)
                                       .view(torch.uint8))
            off += n
        return buf

    @staticmethod
    def _unstage(buf, tensors):
        off = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            if n:
                src = buf[off:off + n].view(t.dtype).view(t.shape)
                t.copy_(src)
            off += n

    # -- issue and completion ---------------------------------------------
    # A failure is kept as (class, code, message) and each raise or future
    # gets a fresh exception: one raised keeps its traceback, whose frames
    # hold the step's DDP, and a future that held it (the reducer holds
    # the futures, in C++) would keep that DDP and its autograd hooks on
    # the parameters alive past the view change, in a cycle no collector
    # sees. Its hooks then fire in the next DDP's backward ("Expected to
    # mark a variable ready only once") until a collection frees the old
    # reducer in the middle of one (SIGSEGV, seen here).
    @property
    def failed(self):
        """The ringd error that ended this group (a fresh exception),
        or None."""
        if self._failure is None:
            return None
        cls, code, msg = self._failure
        return cls(code, msg)

    def _issue(self, issue, post, bufs, result, poison=None):
        """issue() -> ringd.Handle (None: nothing to wait for), under the
        lock; the Work completes once the handle is done and post() ran.
        poison() runs instead of post() when the collective fails."""
        fut = torch.futures.Future()
        with self._cv:
            if self._failure is not None:
                self._give(bufs)
                raise self.failed
            try:
                h = issue()
            except ringd.Error as e:
                self._give(bufs)
                self._fail(e)
                raise self.failed from None
            if h is None:
                post()
                self._give(bufs)
                fut.set_result(result)
            else:
                self._queue.append(_Pending(h, fut, (post, result), bufs,
                                            poison))
                self._cv.notify()
        return _make_work(fut)

    def _fail(self, e):
        """Remember the first failure as the group's; a Reshape becomes
        ViewChanged. Called with the lock held."""
        if self._failure is None:
            cls = ViewChanged if isinstance(e, (ringd.Reshape, ringd.Fenced,
                                                ringd.Disconnected)) \
                else ringd.Error
            self._failure = (cls, e.code, str(e))

    def _complete(self):
        pause = 0.0
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                    pause = 0.0
                if self._closed and not self._queue:
                    return
                p = self._queue[0]
                done, err = False, None
                try:
                    done = self.client.test(p.handle)
                except ringd.Error as e:
                    self._fail(e)
                    done, err = True, self.failed
                if done:
                    self._queue.popleft()
                    self._finish(p, err)
                    self._cv.notify_all()
                    pause = 0.0
                    continue
            # Not done yet: the daemon has no fd to poll, so back off a
            # little (50 us up to 1 ms) without holding the lock.
            pause = min(max(pause * 2, 5e-5), 1e-3)
            time.sleep(pause)

    def _finish(self, p, err):
        post, result = p.post
        if err is None:
            try:
                post()
            except Exception as e:   # noqa: BLE001 (the group's failure)
                self._fail(ringd.Error(ringd.EINVAL, "ringd backend: "
                                       "copying a result out failed: %s" % e))
                err = self.failed
        self._give(p.bufs)
        if err is not None:
            self._poison(p)
        p.fut.set_result(result)

    @staticmethod
    def _poison(p):
        # A failed collective's future completes with its result, not an
        # exception: torch 1.13's DDP dies (SIGSEGV in
        # Reducer::finalize_backward) on a bucket future that holds one,
        # and its Work made from a future returns from wait() on an error
        # anyway, from C++ and from Python. The failure is raised by the
        # group's next collective, by flush() and, under run(), by the
        # optimizer's step. Outputs that are fresh (allgather's) read as
        # visibly wrong (NaN, -1), so that what waits and reads them (DDP's
        # check of the parameter counts) fails rather than trusting stale
        # memory; in-place ones (allreduce, broadcast: a module's buffers
        # and parameters) keep this rank's values.
        if p.poison is not None:
            p.poison()

    def flush(self, timeout_s=600.0):
        """Wait until every collective issued is complete; raises the
        group's failure (ViewChanged) if there was one."""
        end = time.monotonic() + timeout_s
        with self._cv:
            while self._queue and self._failure is None:
                left = end - time.monotonic()
                if left <= 0:
                    raise ringd.Error(ringd.ETIMEDOUT, "ringd backend: "
                                      "collectives still in flight")
                self._cv.wait(left)
            if self._failure is not None:
                raise self.failed

    def check(self):
        """Raise the group's failure (ViewChanged) if it has one."""
        with self._cv:
            if self._failure is not None:
                raise self.failed

    def abort(self):
        """Fail every collective in flight (before a new step_begin voids
        their handles) and stop the completion thread."""
        with self._cv:
            if self._failure is None:
                self._failure = (ViewChanged, ringd.ERESHAPE, "ringd backend:"
                                 " the process group was aborted")
            while self._queue:
                p = self._queue.popleft()
                self._give(p.bufs)
                self._poison(p)
                p.fut.set_result(p.post[1])
            self._closed = True
            self._cv.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    # -- collectives ---------------------------------------------------------
    def _allreduce_flat(self, tensors, op):
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1:
            raise TypeError("ringd backend: allreduce_coalesced of several "
                            "dtypes (%s)" % sorted(map(str, dtypes)))
        dtype = dtypes.pop()
        code = rt.wire_dtype(dtype)
        buf = self._staged(tensors)
        count = buf.numel() // torch.empty((), dtype=dtype).element_size()
        c, name = self.client, _op_name(op)

        def issue():
            if count == 0:
                return None
            return c.allreduce_async_raw(buf.data_ptr(), count, code, name,
                                         keep=buf)
        return self._issue(issue, lambda: self._unstage(buf, tensors),
                           [buf], tensors)

    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        if len(tensors) != 1:
            raise ValueError("ringd backend: one tensor per allreduce")
        return self._allreduce_flat(tensors, op)

    def allreduce_coalesced(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return self._allreduce_flat(list(tensors), op)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        if not 0 <= root < self._n:
            raise ValueError("ringd backend: broadcast root %d outside the "
                             "world of %d" % (root, self._n))
        buf = self._staged(tensors)
        c = self.client

        def issue():
            if buf.numel() == 0:
                return None
            return c.broadcast_async(buf, root)
        return self._issue(issue, lambda: self._unstage(buf, tensors),
                           [buf], tensors)

    def _gather(self, outs, inp):
        """outs: world tensors shaped like inp, each rank's input."""
        if len(outs) != self._n:
            raise ValueError("ringd backend: allgather into %d tensors in a "
                             "world of %d" % (len(outs), self._n))
        nb = inp.numel() * inp.element_size()
        buf = self._take(nb * self._n)
        if nb:
            buf[self._r * nb:(self._r + 1) * nb].copy_(
                inp.detach().contiguous().reshape(-1).view(torch.uint8))
        c = self.client

        def issue():
            return c.allgather_async(buf) if nb else None

        def poison():
            for o in outs:
                _poison_tensor(o)
        return self._issue(issue, lambda: self._unstage(buf, outs), [buf],
                           outs, poison)

    def allgather(self, output_tensors, input_tensors, opts=None):
        if len(input_tensors) != 1 or len(output_tensors) != 1:
            raise ValueError("ringd backend: one tensor per allgather")
        w = self._gather(output_tensors[0], input_tensors[0])
        return w

    def _allgather_base(self, output, input, opts=None):
        return self._gather(list(output.view(self._n, *input.shape)
                                 .unbind(0)), input)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        """An allreduce of every rank's list, then this rank's part: what
        the ring moves is world times reduce_scatter's, simple and right."""
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        if len(output_tensors) != 1 or len(input_tensors[0]) != self._n:
            raise ValueError("ringd backend: reduce_scatter takes one output "
                             "and world (%d) inputs" % self._n)
        parts = [t.detach().clone() for t in input_tensors[0]]
        out = output_tensors[0]
        inner = self._allreduce_flat(parts, op)
        fut = inner.get_future().then(
            lambda f: [out.copy_(f.value()[self._r])])
        return _make_work(fut)

    def _reduce_scatter_base(self, output, input, opts=None):
        return self.reduce_scatter([output], [list(input.chunk(self._n))],
                                   opts)

    def barrier(self, opts=None):
        c = self.client
        return self._issue(lambda: c.barrier_async(), lambda: None, [], [])

    def rank(self):
        return self._r

    def size(self):
        return self._n


def _create(store, rank, size, timeout):
    c = rt.client()
    v = c.view
    if v is None:
        raise RuntimeError("ringd backend: begin a step first (use "
                           "ringd.torch.distributed.init_process_group())")
    if (rank, size) != (v.rank, v.world):
        raise ValueError("ringd backend: rank %d of %d is not the daemon's "
                         "view (rank %d of %d)" % (rank, size, v.rank,
                                                   v.world))
    return ProcessGroupRingd(v.rank, v.world, c)


def register():
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create)


register()


def _store(world):
    """A process-local store: the ringd backend needs no rendezvous (the
    daemon has one), but init_process_group() ends with a barrier over
    its store that counts world arrivals; this one holds the other
    world - 1 already."""
    store = dist.HashStore()
    c10d = dist.distributed_c10d
    for k in (c10d._group_count, c10d._group_count + 1):
        store.add("%s:%d" % (c10d.STORE_BASED_BARRIER_PREFIX, k), world - 1)
    return store


def init_process_group(view=None, **kw):
    """Begin a step (unless `view`, the step's view, is given) and make
    the default process group of the ringd backend with its rank and
    world size. Returns the view."""
    if rt._client is None:
        rt.init(**kw)
    v = view if view is not None else rt.client().step_begin()
    dist.init_process_group(BACKEND, store=_store(v.world), rank=v.rank,
                            world_size=v.world)
    return v


def group():
    return dist.distributed_c10d._get_default_group()


def destroy():
    """Abort the default group's collectives in flight and destroy it."""
    if dist.is_initialized():
        pg = group()
        if isinstance(pg, ProcessGroupRingd):
            pg.abort()
        dist.destroy_process_group()


def _retire(cur):
    """Drop what setup() made for the last view (cur["made"], the only
    reference run() holds), for good: a DDP whose reducer outlives the
    view keeps its hooks on the parameters, and they fire in the next
    DDP's backward. Collected here, at a step boundary, not in the
    middle of the next backward."""
    ref = None
    try:
        ref = weakref.ref(cur["made"]) if cur["made"] is not None else None
    except TypeError:
        pass                    # not weakly referable: nothing to check
    cur["made"] = None
    if ref is not None and ref() is not None:
        gc.collect()
        if ref() is not None:
            _log.warning("what setup() made for the last view is still "
                         "referenced after the view change (kept in a "
                         "global or a closure?): a DDP's hooks stay on the "
                         "parameters and break the next one's backward")


def _guard_step(opt):
    """opt.step() raises the group's failure first: a collective that
    failed mid-backward completes DDP's future with this rank's own
    gradients (see _poison), and they must not be applied."""
    if opt is None or getattr(opt.step, "_ringd_guard", False):
        return
    inner = opt.step

    @functools.wraps(inner)
    def step(*args, **kwargs):
        if dist.is_initialized():
            pg = group()
            if isinstance(pg, ProcessGroupRingd):
                pg.check()
        return inner(*args, **kwargs)
    step._ringd_guard = True
    opt.step = step


def run(step_fn, state, setup, steps=None, **kw):
    """elastic.run for DDP loops: in the first step and after every view
    change, (re)make the default ringd process group with the view's rank
    and world size and call setup(view) (build DDP there); then
    step_fn(state, view, made) with what setup returned. A view change
    inside the step or setup() (ViewChanged, or DDP's RuntimeError over
    it) redoes the step with a fresh group and setup(). Keep no other
    reference to what setup() returns (run() checks it died). Returns the
    last view."""
    cur = {"view": None, "made": None}
    _guard_step(getattr(state, "optimizer", None))

    def fresh(v):
        _log.info("process group for step %d: generation %d, rank %d of %d",
                  v.step, v.generation, v.rank, v.world)
        destroy()
        _retire(cur)
        init_process_group(view=v)
        cur["made"] = setup(v)

    def step(state, v):
        try:
            if cur["view"] is None or \
                    (cur["view"].generation, cur["view"].rank,
                     cur["view"].world) != (v.generation, v.rank, v.world):
                cur["view"] = None
                fresh(v)
            cur["view"] = v
            more = step_fn(state, v, cur["made"])
            group().flush()     # every collective of the step done
            return more
        except Exception as e:  # noqa: BLE001 (re-raised below)
            pg = group() if dist.is_initialized() else None
            failed = getattr(pg, "failed", None)
            _log.info("step %d failed on generation %d: %s", v.step,
                      v.generation, failed or e)
            cur["view"] = None
            destroy()
            if isinstance(e, ringd.Reshape) or isinstance(failed,
                                                          ringd.Reshape):
                # A fresh exception, no traceback chained: the frames of
                # the failed attempt hold its DDP.
                err = failed or type(e)(e.code, str(e))
                del e
                raise err from None
            raise
    try:
        return elastic.run(step, state, steps=steps, **kw)
    finally:
        cur["made"] = None
        destroy()
