"""ringd - Python binding of libringd (ctypes), numpy arrays over the
shared buffers. `import ringd` needs numpy only; `import ringd.torch`
adds the PyTorch layer and needs torch.

    import numpy as np, ringd
    with ringd.Client() as c:
        params = c.buffer(n, np.float32)     # numpy view of shared memory
        grads = c.buffer(n, np.float32)
        c.state(params)
        while True:
            v = c.step_begin()
            if v.step >= steps:
                break
            grads[:] = compute(params, shard(v.rank, v.world))
            try:
                c.allreduce(grads, "avg")
            except ringd.Reshape:
                continue                    # redo the step on the new view
            params -= lr * grads
            c.step_end()

Arrays handed to allreduce/broadcast must be views into buffers from
Client.buffer() (no copy ever goes through the socket). numpy has no
bfloat16: Client.buffer(n, "bf16") gives a uint16 array of the raw bits,
and allreduce(a, dtype="bf16") reduces it as bfloat16. A buffer is freed
when no array over it is left (at the client's next call), or at once by
Client.free(array).

libringd.so is found through $RINGD_LIB (only there, when set), then
beside this file (a package that ships it), then the library directory
`make install` wrote into ringd/_config.py, then the dynamic linker's
path. The path loaded is ringd.lib_path.

Under the launcher (ringrun sets RINGD_LAUNCHER=1), importing ringd
installs a SIGTERM and SIGINT handler (where the program has none of its
own yet) that only asks the trainer to stop: stop_requested() is then
true, and the next step_begin() raises Stopped (a Shutdown), so a loop
that ends on Shutdown (elastic.run, examples/trainer.py) ends after the
step in progress; a client the program leaves open between two steps
is closed at exit, which sends BYE: the daemon logs "trainer N left",
not "lost". A second signal ends the process at once. The trainer also
gets SIGTERM if ringrun itself dies (prctl PR_SET_PDEATHSIG).
"""
import atexit
import bisect
import ctypes
import os
import signal
import weakref
from collections import namedtuple

import numpy as np

OK = 0
EINVAL = -1
ENODAEMON = -2
EDISCONNECTED = -3
EVERSION = -4
EPROTO = -5
ERESHAPE = -6
ENOMEM = -7
ENOTSUP = -8
ESYS = -9
ETIMEDOUT = -10
EMISMATCH = -11
ESHUTDOWN = -12
EFENCED = -13
ESTATE = -14
EABORTED = -15
ELIMIT = -16
MAX_OUTSTANDING = 128  # RINGD_MAX_OUTSTANDING

# ringd_dtype_t: wire dtypes and their element sizes.
F32, F64, F16, BF16, I32, I64, U8 = range(7)
DTYPE_NAMES = {"f32": F32, "f64": F64, "f16": F16, "bf16": BF16,
               "i32": I32, "i64": I64, "u8": U8}
DTYPE_SIZES = {F32: 4, F64: 8, F16: 2, BF16: 2, I32: 4, I64: 8, U8: 1}

# numpy dtypes that map to a ringd dtype by themselves; bf16 travels as
# uint16 bits and must be named.
_NP_DTYPES = {np.dtype(np.float32): F32, np.dtype(np.float64): F64,
              np.dtype(np.float16): F16, np.dtype(np.int32): I32,
              np.dtype(np.int64): I64, np.dtype(np.uint8): U8}
_OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}
# Wire compression of one f32 allreduce (ringd_wire_t): None is the
# job's default (ringd's ring-wire).
_WIRES = {None: 0, "none": 1, "bf16": 2, "f16": 3}

View = namedtuple("View", "rank world local_rank local_world step "
                          "generation restored")


class Error(Exception):
    """A libringd failure: .code is the RINGD_* code."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class Reshape(Error):
    """The view changed during a collective: redo the step."""


class Disconnected(Error):
    """The daemon went away and the client does not wait for it
    (reconnect_s=0, auto_reconnect=False); step_begin() reconnects. A
    client that waits raises Reshape instead once the daemon is back."""


class Shutdown(Error):
    """The daemon drains: stop training."""


class Stopped(Shutdown):
    """The launcher asked this trainer to stop (SIGTERM or SIGINT under
    ringrun): leave, closing the client."""


class Fenced(Error):
    """The node lost its etcd lease: redo the step; step_begin() raises
    it again until the node is back in the job."""


class _Opts(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32),
                ("timeout_ms", ctypes.c_uint32),
                ("auto_reconnect", ctypes.c_int),
                ("reconnect_s", ctypes.c_int32),
                ("name", ctypes.c_char_p),
                ("job", ctypes.c_char_p)]


class _View(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_uint32), ("world", ctypes.c_uint32),
                ("local_rank", ctypes.c_uint32),
                ("local_world", ctypes.c_uint32),
                ("step", ctypes.c_uint64), ("generation", ctypes.c_uint64),
                ("restored", ctypes.c_int)]


def _candidates():
    """Where libringd.so may be, in order. $RINGD_LIB, when set, is the
    only place: a user who names a library must get that one or an
    error, never another found elsewhere."""
    env = os.environ.get("RINGD_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.join(here, "libringd.so")]
    try:
        from ringd import _config
        paths.append(os.path.join(_config.LIBDIR, "libringd.so"))
    except ImportError:
        pass
    paths.append("libringd.so")
    return paths


def _load():
    tried = []
    lib = None
    for path in _candidates():
        bare = os.sep not in path
        if not bare and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    if lib is None:
        raise OSError("libringd.so not found: tried %s; set RINGD_LIB or "
                      "run make install" % ", ".join(tried))
    P, I, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    sig = {
        "ringd_opts_init": (None, [ctypes.POINTER(_Opts)]),
        "ringd_connect": (I, [ctypes.POINTER(P), ctypes.c_char_p,
                              ctypes.POINTER(_Opts)]),
        "ringd_buffer": (P, [P, S]),
        "ringd_state": (I, [P, P, S]),
        "ringd_step_begin": (I, [P, ctypes.POINTER(_View)]),
        "ringd_allreduce": (I, [P, P, S, I, I]),
        "ringd_broadcast": (I, [P, P, S, ctypes.c_uint32]),
        "ringd_step_end": (I, [P]),
        "ringd_checkpoint": (I, [P]),
        "ringd_reconnect": (I, [P]),
        "ringd_strerror": (ctypes.c_char_p, [I]),
        "ringd_last_error": (ctypes.c_char_p, [P]),
        "ringd_close": (None, [P]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    # Older libraries lack these; Client.free() and the asynchronous
    # calls then say so.
    U64 = ctypes.c_uint64
    late = {
        "ringd_buffer_free": (I, [P, P]),
        "ringd_allreduce_async": (I, [P, P, S, I, I, ctypes.POINTER(U64)]),
        "ringd_allreduce_wire_async": (I, [P, P, S, I, I, I,
                                           ctypes.POINTER(U64)]),
        "ringd_broadcast_async": (I, [P, P, S, ctypes.c_uint32,
                                      ctypes.POINTER(U64)]),
        "ringd_wait": (I, [P, U64]),
        "ringd_test": (I, [P, U64, ctypes.POINTER(I)]),
        "ringd_allgather_async": (I, [P, P, S, ctypes.POINTER(U64)]),
        "ringd_barrier_async": (I, [P, ctypes.POINTER(U64)]),
        "ringd_group_start": (I, [P]),
        "ringd_group_end": (I, [P]),
    }
    for name, (res, args) in late.items():
        if hasattr(lib, name):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
    return lib, path


_lib, lib_path = _load()


_stop = []              # the signal that asked us to stop, once one did
# Open clients under the launcher, closed at exit; held strongly, since
# an exiting program drops its last reference before atexit runs.
_clients = set()


def stop_requested():
    """True once the launcher (ringrun) asked this trainer to stop: finish
    the step in progress, then close the client. Client.step_begin()
    raises Stopped from then on."""
    return bool(_stop)


def _on_stop(signum, frame):
    if _stop:                   # a second signal: go now
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _stop.append(signum)


def _close_all():
    """At exit: BYE for each client left open between two steps (one in
    a step is left to end as a lost trainer: the step fails)."""
    for c in list(_clients):
        if c._between_steps:
            c.close()


def _launched():
    """Under ringrun: stop on SIGTERM/SIGINT at a step boundary, BYE at
    exit, SIGTERM when ringrun dies."""
    if not _launched_here:
        return
    atexit.register(_close_all)
    try:
        for s, dfl in ((signal.SIGTERM, signal.SIG_DFL),
                       (signal.SIGINT, signal.default_int_handler)):
            if signal.getsignal(s) is dfl:
                signal.signal(s, _on_stop)
    except ValueError:
        return                  # imported off the main thread
    # Only a direct child of ringrun (not one under a shell it started):
    # the signal comes when the parent dies.
    want = os.environ.get("RINGD_LAUNCHER_PID", "")
    if not want.isdigit() or os.getppid() != int(want):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)    # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(want):
        _stop.append(signal.SIGTERM)    # ringrun died before the prctl


_launched_here = os.environ.get("RINGD_LAUNCHER") == "1"
_launched()


def strerror(code):
    return _lib.ringd_strerror(code).decode()


def dtype_code(dtype):
    """The ringd dtype of a name ("bf16"), an enum value or a numpy
    dtype; raises Error (EINVAL) naming what ringd lacks."""
    if isinstance(dtype, str) and dtype in DTYPE_NAMES:
        return DTYPE_NAMES[dtype]
    if isinstance(dtype, int) and dtype in DTYPE_SIZES:
        return dtype
    try:
        nd = np.dtype(dtype)
    except TypeError:
        nd = None
    if nd in _NP_DTYPES:
        return _NP_DTYPES[nd]
    raise Error(EINVAL, "ringd has no dtype %s (it reduces %s)" %
                (nd if nd is not None else repr(dtype),
                 ", ".join(DTYPE_NAMES)))


class Handle:
    """An asynchronous collective issued by Client.allreduce_async() or
    Client.broadcast_async(): pass it to Client.wait() or Client.test().
    It keeps its array alive (the daemon writes the result into it) until
    then; do not touch the array before."""
    __slots__ = ("value", "array", "what")

    def __init__(self, value, array, what):
        self.value = value
        self.array = array
        self.what = what


class Client:
    """One connection to the local ringd. Not thread-safe."""

    def __init__(self, socket=None, name=None, timeout_ms=0,
                 auto_reconnect=True, reconnect_s=None, job=None):
        """reconnect_s: how long to wait for a daemon that went away
        (restarted) before giving up with ENODAEMON; None is
        $RINGD_RECONNECT_S, else 30; 0 does not wait (at most 3600).
        job: the job this trainer runs (None: $RINGD_JOB, else none); a
        ringd that pins no job serves the one its first trainer names, and
        one that runs a job refuses another: Error (ESTATE) naming both.
        At most 64 characters of [A-Za-z0-9_.-], not starting with '.'."""
        opts = _Opts()
        _lib.ringd_opts_init(ctypes.byref(opts))
        opts.timeout_ms = timeout_ms
        opts.auto_reconnect = 1 if auto_reconnect else 0
        if reconnect_s is not None:
            opts.reconnect_s = int(reconnect_s)
        self._name = (name or "python").encode()
        opts.name = self._name
        self._job = job.encode() if job else None
        opts.job = self._job
        self._c = ctypes.c_void_p()
        path = socket.encode() if socket else None
        rc = _lib.ringd_connect(ctypes.byref(self._c), path,
                                ctypes.byref(opts))
        if rc != 0:
            why = _lib.ringd_last_error(None).decode(errors="replace")
            raise Error(rc, "ringd_connect: " + (why or strerror(rc)))
        self._staging = {}
        self.view = None        # from the last step_begin()
        # Callables that ringd.torch.elastic.run calls when a step attempt
        # is abandoned (a view change inside step_fn), before the redo's
        # step_begin: a DistributedOptimizer puts back the buffers the
        # attempt's forward moved (ringd/torch/optimizer.py, abandon).
        self.abandon_hooks = []
        # Base addresses of buffers no array refers to any more; freed at
        # the next call, never from inside a garbage collection.
        self._dead = []
        self._live = {}         # base address -> its finalizer
        self._bases = []        # sorted base addresses of live buffers
        self._sizes = {}        # base address -> bytes
        self._between_steps = True     # no step begun and not ended
        if _launched_here:
            _clients.add(self)

    def _check(self, rc, what):
        if rc == 0:
            return
        msg = "%s: %s" % (what, _lib.ringd_last_error(self._c).decode())
        cls = {ERESHAPE: Reshape, EDISCONNECTED: Disconnected,
               ESHUTDOWN: Shutdown, EFENCED: Fenced}.get(rc, Error)
        raise cls(rc, msg)

    def raw_buffer(self, nbytes):
        """(address, writable memoryview of nbytes) over a new shared
        buffer. The buffer is freed once nothing refers to the memoryview
        (or its exporter) any more, at the client's next call."""
        self._reap()
        nbytes = max(int(nbytes), 1)
        addr = _lib.ringd_buffer(self._c, nbytes)
        if not addr:
            raise Error(ENOMEM, "ringd_buffer: " +
                        _lib.ringd_last_error(self._c).decode())
        raw = (ctypes.c_char * nbytes).from_address(addr)
        self._live[addr] = weakref.finalize(raw, self._dead.append, addr)
        bisect.insort(self._bases, addr)
        self._sizes[addr] = nbytes
        return addr, memoryview(raw).cast("B")

    def owns(self, addr, nbytes):
        """Whether [addr, addr+nbytes) lies inside one live buffer."""
        i = bisect.bisect_right(self._bases, addr) - 1
        if i < 0:
            return False
        base = self._bases[i]
        return addr + nbytes <= base + self._sizes[base]

    def buffers(self):
        """How many buffers this client has mapped."""
        return len(self._bases)

    def _forget(self, addr):
        self._live.pop(addr, None)
        if self._sizes.pop(addr, None) is not None:
            del self._bases[bisect.bisect_left(self._bases, addr)]

    def buffer(self, shape, dtype=np.float32):
        """A zeroed numpy array in memory shared with the daemon; "bf16"
        gives uint16 bits. Freed when no array over it is left, or by
        free()."""
        code = dtype_code(dtype)
        npd = np.dtype(np.uint16) if code == BF16 else np.dtype(
            {F32: np.float32, F64: np.float64, F16: np.float16,
             I32: np.int32, I64: np.int64, U8: np.uint8}[code])
        count = int(np.prod(shape))
        _, mv = self.raw_buffer(count * npd.itemsize)
        return np.frombuffer(mv, dtype=npd, count=count).reshape(shape)

    def _free_addr(self, addr):
        if not hasattr(_lib, "ringd_buffer_free"):
            raise Error(ENOTSUP, "ringd_buffer_free: not in " + lib_path)
        self._check(_lib.ringd_buffer_free(self._c, addr),
                    "ringd_buffer_free")
        fin = self._live.get(addr)
        if fin is not None:
            fin.detach()
        self._forget(addr)

    def collect(self):
        """Free now the buffers no array refers to any more (otherwise
        done at the next buffer() or step_begin())."""
        self._reap()

    def _reap(self):
        while self._dead and self._c:
            addr = self._dead.pop()
            try:
                self._free_addr(addr)
            except Error:
                # The state region's buffer: ringd_close frees it.
                self._forget(addr)

    def free(self, array):
        """Free the buffer that array (from buffer()) starts; the array
        and every view of it must not be used afterwards."""
        addr = _address(array)
        if addr not in self._live:
            raise Error(EINVAL, "free: %#x does not start a buffer of this "
                                "client" % addr)
        self._free_addr(addr)

    def state(self, array):
        self._check(_lib.ringd_state(self._c, _address(array),
                                     array.nbytes), "ringd_state")

    def step_begin(self):
        if _stop:
            raise Stopped(ESHUTDOWN, "step_begin: the launcher asked this "
                          "trainer to stop (%s)" %
                          signal.Signals(_stop[0]).name)
        self._reap()
        v = _View()
        self._check(_lib.ringd_step_begin(self._c, ctypes.byref(v)),
                    "ringd_step_begin")
        self._between_steps = False
        self.view = View(v.rank, v.world, v.local_rank, v.local_world,
                         v.step, v.generation, bool(v.restored))
        return self.view

    def allreduce_raw(self, addr, count, dtype, op="avg"):
        """In place over count elements of ringd dtype at addr."""
        self._check(_lib.ringd_allreduce(self._c, addr, count, dtype,
                                         _OPS[op]), "ringd_allreduce")

    def allreduce(self, array, op="avg", dtype=None):
        """In place; raises Reshape when the step must be redone. dtype
        names the wire type when the array's own is not it ("bf16" for
        uint16 bits)."""
        if not array.flags.c_contiguous:
            raise Error(EINVAL, "allreduce: the array is not contiguous")
        if dtype is None and array.dtype not in _NP_DTYPES:
            raise Error(EINVAL, "allreduce: ringd has no dtype %s (name "
                                "the wire dtype, e.g. dtype='bf16' for "
                                "uint16 bits)" % array.dtype)
        code = _NP_DTYPES[array.dtype] if dtype is None else dtype_code(dtype)
        if array.nbytes % DTYPE_SIZES[code]:
            raise Error(EINVAL, "allreduce: %d bytes is not a whole number "
                                "of %s" % (array.nbytes, dtype))
        self.allreduce_raw(_address(array), array.nbytes // DTYPE_SIZES[code],
                           code, op)

    def _need(self, name):
        if not hasattr(_lib, name) or getattr(_lib, name).argtypes is None:
            raise Error(ENOTSUP, "%s: %s predates asynchronous collectives"
                        % (name, lib_path))

    def allreduce_async_raw(self, addr, count, dtype, op="avg", keep=None,
                            wire=None):
        """Issue an allreduce of count elements of ringd dtype at addr
        without waiting; returns a Handle (keep: an object it holds).
        wire: "bf16" or "f16" on the wire for an f32 allreduce, "none",
        or None for the job's default (include/ringd.h, ringd_wire_t)."""
        if wire not in _WIRES:
            raise Error(EINVAL, "allreduce: wire %r is not one of none, "
                                "bf16, f16" % (wire,))
        h = ctypes.c_uint64()
        if wire is None:
            self._need("ringd_allreduce_async")
            rc = _lib.ringd_allreduce_async(self._c, addr, count, dtype,
                                            _OPS[op], ctypes.byref(h))
        else:
            self._need("ringd_allreduce_wire_async")
            rc = _lib.ringd_allreduce_wire_async(self._c, addr, count, dtype,
                                                 _OPS[op], _WIRES[wire],
                                                 ctypes.byref(h))
        self._check(rc, "ringd_allreduce_async")
        return Handle(h.value, keep, "ringd_allreduce_async")

    def allreduce_async(self, array, op="avg", dtype=None, wire=None):
        """Issue an in-place allreduce of array (numpy in ringd memory, or
        a torch tensor there) and return at once with a Handle; the
        result is in the array once wait() or test() says it is done.
        Collectives match across trainers by their order of issue, so
        every trainer must issue the same sequence; handles may be waited
        for in any order. Raises as allreduce() does, Error(ELIMIT) with
        MAX_OUTSTANDING handles not waited for. wire as for
        allreduce_async_raw()."""
        addr, count, code = self._coll_args(array, dtype, "allreduce_async")
        return self.allreduce_async_raw(addr, count, code, op, keep=array,
                                        wire=wire)

    def broadcast_async(self, array, root=0):
        """Issue a broadcast of array's bytes from global rank root;
        returns a Handle."""
        self._need("ringd_broadcast_async")
        h = ctypes.c_uint64()
        self._check(_lib.ringd_broadcast_async(
            self._c, _address(array), _nbytes(array), root, ctypes.byref(h)),
            "ringd_broadcast_async")
        return Handle(h.value, array, "ringd_broadcast_async")

    def allgather_async(self, array):
        """array (in ringd memory) holds world equal chunks, this
        trainer's at its rank; returns a Handle, after which every chunk
        holds its trainer's bytes (the library zeroes the others first)."""
        self._need("ringd_allgather_async")
        world = self.view.world if self.view else 0
        nbytes = _nbytes(array)
        if world == 0 or nbytes % world:
            raise Error(EINVAL, "allgather: %d bytes is not world (%d) "
                                "equal chunks" % (nbytes, world))
        h = ctypes.c_uint64()
        self._check(_lib.ringd_allgather_async(
            self._c, _address(array), nbytes // world, ctypes.byref(h)),
            "ringd_allgather_async")
        return Handle(h.value, array, "ringd_allgather_async")

    def allgather(self, array):
        self.wait(self.allgather_async(array))

    def barrier_async(self):
        """A barrier over every trainer of the job; returns a Handle."""
        self._need("ringd_barrier_async")
        h = ctypes.c_uint64()
        self._check(_lib.ringd_barrier_async(self._c, ctypes.byref(h)),
                    "ringd_barrier_async")
        return Handle(h.value, None, "ringd_barrier_async")

    def barrier(self):
        self.wait(self.barrier_async())

    def group(self):
        """A fusion group, as a context manager: the asynchronous calls
        inside it are sent together when it exits, and the daemon runs
        each run of allreduces of one dtype and op as one ring operation.
        Every trainer must group alike. Wait for the handles after it."""
        self._need("ringd_group_start")
        return _Group(self)

    def wait(self, handle):
        """Block until handle's collective is done; raises Reshape (redo
        the step), Disconnected, Error as the blocking calls do, and
        Error(EINVAL) for a handle already waited for or voided by a
        later step_begin()."""
        self._need("ringd_wait")
        rc = _lib.ringd_wait(self._c, handle.value)
        handle.array = None
        self._check(rc, handle.what)

    def test(self, handle):
        """True once handle's collective is done (the handle is then
        released, its failure raised as wait() would), False before."""
        self._need("ringd_test")
        done = ctypes.c_int()
        rc = _lib.ringd_test(self._c, handle.value, ctypes.byref(done))
        if not done.value:
            return False
        handle.array = None
        self._check(rc, handle.what)
        return True

    def _coll_args(self, array, dtype, what):
        """(address, element count, ringd dtype) of a numpy array or torch
        tensor; raises Error(EINVAL) for what ringd cannot reduce."""
        if hasattr(array, "data_ptr"):  # a torch tensor
            if not array.is_contiguous():
                raise Error(EINVAL, "%s: the tensor is not contiguous" % what)
            name = str(array.dtype).replace("torch.", "")
            names = {"float32": F32, "float64": F64, "float16": F16,
                     "bfloat16": BF16, "int32": I32, "int64": I64,
                     "uint8": U8}
            code = dtype_code(dtype) if dtype is not None else names.get(name)
            if code is None:
                raise Error(EINVAL, "%s: ringd has no dtype %s" % (what, name))
            return array.data_ptr(), _nbytes(array) // DTYPE_SIZES[code], code
        if not array.flags.c_contiguous:
            raise Error(EINVAL, "%s: the array is not contiguous" % what)
        if dtype is None and array.dtype not in _NP_DTYPES:
            raise Error(EINVAL, "%s: ringd has no dtype %s (name the wire "
                                "dtype, e.g. dtype='bf16' for uint16 bits)"
                        % (what, array.dtype))
        code = _NP_DTYPES[array.dtype] if dtype is None else dtype_code(dtype)
        if array.nbytes % DTYPE_SIZES[code]:
            raise Error(EINVAL, "%s: %d bytes is not a whole number of %s"
                        % (what, array.nbytes, dtype))
        return _address(array), array.nbytes // DTYPE_SIZES[code], code

    def broadcast_raw(self, addr, nbytes, root=0):
        self._check(_lib.ringd_broadcast(self._c, addr, nbytes, root),
                    "ringd_broadcast")

    def broadcast(self, array, root=0):
        self.broadcast_raw(_address(array), array.nbytes, root)

    def allreduce_torch(self, tensor, op="avg"):
        """allreduce for a torch tensor (any device): copied through a
        staging ringd buffer kept per (numel, dtype). ringd.torch reduces
        tensors in ringd memory without the copies."""
        import torch  # noqa: F401  (only where torch is installed)
        host = tensor.detach().cpu().contiguous().numpy()
        key = (host.size, host.dtype)
        if key not in self._staging:
            self._staging[key] = self.buffer(host.size, host.dtype)
        buf = self._staging[key]
        buf[:] = host.reshape(-1)
        self.allreduce(buf, op)
        tensor.copy_(torch.from_numpy(buf.reshape(host.shape)))

    def step_end(self):
        """End the step: the update has been applied. In a job of several
        nodes it returns once every node finished the step. Raises
        Reshape or Fenced when the step did not count (this node was
        dropped from the job first): call step_begin again, which
        restores the job's state."""
        self._check(_lib.ringd_step_end(self._c), "ringd_step_end")
        self._between_steps = True

    def checkpoint(self):
        """Ask for a checkpoint, taken on every node at the end of the next
        step that starts; raises (RINGD_ENOTSUP) if checkpoints are off."""
        self._check(_lib.ringd_checkpoint(self._c), "ringd_checkpoint")

    def reconnect(self):
        self._check(_lib.ringd_reconnect(self._c), "ringd_reconnect")

    def close(self):
        """Unmaps every buffer: arrays from buffer() must not be used
        afterwards."""
        if self._c:
            for fin in self._live.values():
                fin.detach()
            self._live.clear()
            self._dead.clear()
            self._bases.clear()
            self._sizes.clear()
            _lib.ringd_close(self._c)
            self._c = ctypes.c_void_p()
        _clients.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Group:
    def __init__(self, client):
        self._c = client

    def __enter__(self):
        c = self._c
        c._check(_lib.ringd_group_start(c._c), "ringd_group_start")
        return c

    def __exit__(self, *exc):
        c = self._c
        c._check(_lib.ringd_group_end(c._c), "ringd_group_end")


def _nbytes(array):
    if hasattr(array, "data_ptr"):      # a torch tensor
        return array.numel() * array.element_size()
    return array.nbytes


def _address(array):
    if hasattr(array, "data_ptr"):      # a torch tensor
        return array.data_ptr()
    return array.__array_interface__["data"][0]
