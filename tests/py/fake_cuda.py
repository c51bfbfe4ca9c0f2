"""A stand-in for the parts of torch.cuda that ringd/torch/staging.py's
Device uses, recording what it is asked to do, so that the CUDA staging
logic (streams, events, page-locking, where the casts happen) runs and is
checked on a machine without a GPU, on CPU tensors. Used by
tests/py/binding.py --part fakecuda.

    install()
    fake = FakeCuda()
    with fake:                      # this thread's torch.cuda
        st = fake.device()          # a staging.Device on "cpu"
        ...                         # every call lands in fake.log

One FakeCuda per trainer thread: each has its own streams and log, and
the patched Tensor.copy_ logs only in a thread inside `with fake`.
"""
import contextlib
import threading

import torch

from ringd.torch import staging

_local = threading.local()
_orig_copy = torch.Tensor.copy_
_orig_record_stream = torch.Tensor.record_stream


def _copy(self, src, non_blocking=False):
    fake = getattr(_local, "fake", None)
    if fake is not None and non_blocking:
        fake.log.append(("copy", fake.current.name, src.dtype, self.dtype,
                         self.data_ptr(), self.numel() * self.element_size()))
    return _orig_copy(self, src, non_blocking)


def _record_stream(self, stream):
    fake = getattr(_local, "fake", None)
    if fake is None:
        return _orig_record_stream(self, stream)
    fake.log.append(("record_stream", stream.name))


class FakeCuda:
    def __init__(self):
        self.log = []
        fake = self

        class Stream:
            count = 0

            def __init__(self, device=None, priority=0, name=None):
                Stream.count += 1
                self.name = name or "side%d" % Stream.count

            def wait_event(self, ev):
                fake.log.append(("wait_event", self.name, ev.id))

            def wait_stream(self, other):
                fake.log.append(("wait_stream", self.name, other.name))

        class Event:
            count = 0

            def __init__(self):
                Event.count += 1
                self.id = Event.count
                self.stream = None

            def record(self, stream):
                self.stream = stream.name
                fake.log.append(("record", stream.name, self.id))

            def query(self):
                fake.log.append(("query", self.id))
                return True

            def synchronize(self):
                fake.log.append(("synchronize", self.id))

        self.Stream, self.Event = Stream, Event
        self.registered = {}
        self._dev = None
        self.default = Stream(name="default")
        self.current = self.default

    @contextlib.contextmanager
    def stream(self, s):
        prev, self.current = self.current, s
        try:
            yield
        finally:
            self.current = prev

    def __enter__(self):
        """This thread's torch.cuda is this fake (install() first)."""
        _local.fake = self
        return self

    def __exit__(self, *exc):
        _local.fake = None

    def device(self):
        """This fake's staging.Device, whose device is the CPU."""
        if self._dev is None:
            self._dev = staging.Device(torch.device("cpu"))
        return self._dev


class _Cudart:
    """Shared by all threads: a finalizer may unregister from any."""

    def __init__(self):
        self.owner = {}         # ptr -> the fake that registered it
        self.lock = threading.Lock()

    def cudaHostRegister(self, ptr, size, flags):
        fake = _local.fake
        with self.lock:
            fake.log.append(("register", ptr, size, flags))
            fake.registered[ptr] = size
            self.owner[ptr] = fake
        return 0

    def cudaHostUnregister(self, ptr):
        with self.lock:
            fake = self.owner.pop(ptr)
            fake.log.append(("unregister", ptr))
            fake.registered.pop(ptr)
        return 0


_cudart = _Cudart()
_installed = []


def install():
    """torch.cuda's Stream, Event, stream, current_stream and cudart,
    Tensor.copy_ and record_stream, staging.stager_for (a CPU tensor
    gets the fake's Device) and ringd.torch.allreduce_async_ (logged)
    become shims over the calling thread's FakeCuda (used with `with
    fake:`). Never undone: the process runs only fake-CUDA phases."""
    with _cudart.lock:
        if _installed:
            return
        _installed.append(True)
        torch.cuda.Stream = lambda *a, **k: _local.fake.Stream(*a, **k)
        torch.cuda.Event = lambda *a, **k: _local.fake.Event(*a, **k)
        torch.cuda.stream = lambda s: _local.fake.stream(s)
        torch.cuda.current_stream = lambda device=None: _local.fake.current
        torch.cuda.cudart = lambda: _cudart
        torch.Tensor.copy_ = _copy
        torch.Tensor.record_stream = _record_stream
        orig = staging.stager_for

        def stager_for(tensor, name):
            # CPU tensors staged (staging=True) get the fake's Device.
            fake = getattr(_local, "fake", None)
            if fake is not None and tensor.device.type == "cpu":
                return fake.device()
            return orig(tensor, name)
        staging.stager_for = stager_for
        import ringd.torch as rt
        orig_ar = rt.allreduce_async_

        def allreduce_async_(tensor, *a, **k):
            fake = getattr(_local, "fake", None)
            if fake is not None:
                fake.log.append(("allreduce", tensor.data_ptr()))
            return orig_ar(tensor, *a, **k)
        rt.allreduce_async_ = allreduce_async_
