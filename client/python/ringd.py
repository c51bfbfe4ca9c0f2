"""ringd.py - Python binding of libringd (ctypes), numpy arrays over the
shared buffers.

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
Client.buffer() (no copy ever goes through the socket). allreduce_torch()
does the same for a torch tensor through a staging buffer (one copy in,
one copy out) when torch is installed.

libringd.so is found through $RINGD_LIB, then ../../build/libringd.so from
this file (a source checkout), then the dynamic linker's path.
"""
import ctypes
import os
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

_DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1,
           np.dtype(np.float16): 2, np.dtype(np.int32): 4,
           np.dtype(np.int64): 5, np.dtype(np.uint8): 6}
_OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}

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
    """The daemon went away; step_begin() reconnects."""


class Shutdown(Error):
    """The daemon drains: stop training."""


class Fenced(Error):
    """The node lost its etcd lease: redo the step; step_begin() raises
    it again until the node is back in the job."""


class _Opts(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32),
                ("timeout_ms", ctypes.c_uint32),
                ("auto_reconnect", ctypes.c_int),
                ("name", ctypes.c_char_p)]


class _View(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_uint32), ("world", ctypes.c_uint32),
                ("local_rank", ctypes.c_uint32),
                ("local_world", ctypes.c_uint32),
                ("step", ctypes.c_uint64), ("generation", ctypes.c_uint64),
                ("restored", ctypes.c_int)]


def _load():
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.environ.get("RINGD_LIB"),
                 os.path.join(here, "..", "..", "build", "libringd.so"),
                 "libringd.so"):
        if path and (path == "libringd.so" or os.path.exists(path)):
            try:
                lib = ctypes.CDLL(path)
                break
            except OSError:
                continue
    else:
        raise OSError("libringd.so not found: set RINGD_LIB")
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
    return lib


_lib = _load()


def strerror(code):
    return _lib.ringd_strerror(code).decode()


class Client:
    """One connection to the local ringd. Not thread-safe."""

    def __init__(self, socket=None, name=None, timeout_ms=0,
                 auto_reconnect=True):
        opts = _Opts()
        _lib.ringd_opts_init(ctypes.byref(opts))
        opts.timeout_ms = timeout_ms
        opts.auto_reconnect = 1 if auto_reconnect else 0
        self._name = (name or "python").encode()
        opts.name = self._name
        self._c = ctypes.c_void_p()
        path = socket.encode() if socket else None
        rc = _lib.ringd_connect(ctypes.byref(self._c), path,
                                ctypes.byref(opts))
        if rc != 0:
            raise Error(rc, "ringd_connect: " + strerror(rc))
        self._staging = {}

    def _check(self, rc, what):
        if rc == 0:
            return
        msg = "%s: %s" % (what, _lib.ringd_last_error(self._c).decode())
        cls = {ERESHAPE: Reshape, EDISCONNECTED: Disconnected,
               ESHUTDOWN: Shutdown, EFENCED: Fenced}.get(rc, Error)
        raise cls(rc, msg)

    def buffer(self, shape, dtype=np.float32):
        """A zeroed numpy array in memory shared with the daemon; valid
        until close()."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        nbytes = max(count * dtype.itemsize, 1)
        addr = _lib.ringd_buffer(self._c, nbytes)
        if not addr:
            raise Error(ENOMEM, "ringd_buffer: " +
                        _lib.ringd_last_error(self._c).decode())
        raw = (ctypes.c_char * nbytes).from_address(addr)
        return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)

    def state(self, array):
        self._check(_lib.ringd_state(self._c, array.ctypes.data,
                                     array.nbytes), "ringd_state")

    def step_begin(self):
        v = _View()
        self._check(_lib.ringd_step_begin(self._c, ctypes.byref(v)),
                    "ringd_step_begin")
        return View(v.rank, v.world, v.local_rank, v.local_world, v.step,
                    v.generation, bool(v.restored))

    def allreduce(self, array, op="avg"):
        """In place; raises Reshape when the step must be redone."""
        if not array.flags.c_contiguous or array.dtype not in _DTYPES:
            raise Error(EINVAL, "allreduce: contiguous array of a "
                                "supported dtype required")
        self._check(_lib.ringd_allreduce(self._c, array.ctypes.data,
                                         array.size, _DTYPES[array.dtype],
                                         _OPS[op]), "ringd_allreduce")

    def broadcast(self, array, root=0):
        self._check(_lib.ringd_broadcast(self._c, array.ctypes.data,
                                         array.nbytes, root),
                    "ringd_broadcast")

    def allreduce_torch(self, tensor, op="avg"):
        """allreduce for a torch tensor (any device): copied through a
        staging ringd buffer kept per (numel, dtype)."""
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
        self._check(_lib.ringd_step_end(self._c), "ringd_step_end")

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
            _lib.ringd_close(self._c)
            self._c = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
