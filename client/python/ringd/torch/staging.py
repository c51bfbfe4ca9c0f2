"""Copies between tensors that cannot live in ringd memory and the ringd
buffers that stand in for them (DistributedOptimizer's staged buckets,
elastic.State's staged tensors).

A CUDA tensor cannot be a view of a ringd buffer, and a CPU tensor that
the caller allocated is not one either. Such a tensor gets a place in a
ringd buffer; a Stager moves bytes between the two:

    st = stager_for(tensor, name)   # raises UnsupportedDevice
    st.register(host)               # the ringd buffer, once
    st.to_host(host_view, tensor)   # cast to host_view's dtype first
    mark = st.mark()                # after the copies issued so far
    st.done(mark) / st.wait(mark)   # whether / until they are done
    st.to_device(tensor, host_view, scale)
    st.device_ready()               # the caller's stream waits for them

On CPU each copy is a plain synchronous copy_ (mark() is None and always
done). On CUDA the ringd buffer is page-locked in place with
cudaHostRegister, so that copies to and from it are DMA and asynchronous;
they run on one side stream per device, ordered after the work already
queued on the caller's stream by an event, so they overlap whatever the
caller queues next. A cast to a narrower wire dtype is done on the device
before the copy (half the bytes cross the bus) and the widening cast after
it, never on the CPU: torch's own copy_ between devices casts on the CPU
for a blocking copy. Everything CUDA is reached only for a tensor whose
device type is "cuda" and only when torch.cuda.is_available().
"""
import mmap
import weakref

import torch


class UnsupportedDevice(ValueError):
    """ringd cannot stage a tensor of this device type."""


_CUDA = {}          # torch.device -> Device
_HOST = None


def stager_for(tensor, name):
    """The Stager for tensor's device; UnsupportedDevice naming the tensor
    (name) and its device otherwise."""
    global _HOST
    kind = tensor.device.type
    if kind == "cpu":
        if _HOST is None:
            _HOST = Host()
        return _HOST
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise UnsupportedDevice(
                "%s is on %s but torch.cuda.is_available() is False" %
                (name, tensor.device))
        dev = tensor.device
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        st = _CUDA.get(dev)
        if st is None:
            st = _CUDA[dev] = Device(dev)
        return st
    raise UnsupportedDevice(
        "%s is on %s: ringd stages tensors on cpu and cuda only" %
        (name, tensor.device))


class Host:
    """CPU tensors outside ringd memory: synchronous copies (copy_ casts
    to the destination's dtype)."""

    device = torch.device("cpu")

    def register(self, host):
        pass

    def to_host(self, dst, src):
        dst.copy_(src)

    def mark(self):
        return None

    def done(self, mark):
        return True

    def wait(self, mark):
        pass

    def to_device(self, dst, src, scale=1.0):
        dst.copy_(src)
        if scale != 1.0:
            dst.mul_(scale)

    def device_ready(self):
        pass


def _cuda_check(rc, what):
    code = int(getattr(rc, "value", rc))
    if code != 0:
        raise RuntimeError("%s failed: cudaError %d (%s)" %
                           (what, code, rc))


def _unregister(ptr):
    try:
        torch.cuda.cudart().cudaHostUnregister(ptr)
    except Exception:   # interpreter shutdown: the process unmaps it all
        pass


class Device:
    """One device: a side stream for the copies and the ringd buffers it
    has page-locked."""

    def __init__(self, device):
        self.device = device
        self.stream = torch.cuda.Stream(device=device)

    def register(self, host):
        """Page-lock host (a tensor over a whole ringd buffer, which is
        page-aligned) until host is collected: copies from and to it are
        then DMA, and asynchronous."""
        nbytes = host.numel() * host.element_size()
        if nbytes == 0:
            return
        ptr = host.data_ptr()
        if ptr % mmap.PAGESIZE == 0:
            # Whole pages: the ringd buffer is mapped in whole pages.
            nbytes = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        _cuda_check(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0),
                    "cudaHostRegister(%#x, %d)" % (ptr, nbytes))
        # The ptr only, not host: the finalizer must not keep the buffer
        # alive. It runs before the ringd buffer is unmapped, which the
        # client does at its next call after host is gone.
        weakref.finalize(host, _unregister, ptr)

    def _current(self):
        return torch.cuda.current_stream(self.device)

    def to_host(self, dst, src):
        """Queue src -> dst (pinned) on the side stream, after what the
        caller's stream has queued so far (src's producer)."""
        ready = torch.cuda.Event()
        ready.record(self._current())
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(ready)
            # src was made on the caller's stream: the allocator must not
            # hand its memory out again before the side stream is done.
            src.record_stream(self.stream)
            if src.dtype != dst.dtype:
                src = src.to(dst.dtype)     # the wire cast, on the device
            dst.copy_(src, non_blocking=True)

    def mark(self):
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return ev

    def done(self, mark):
        return mark is None or mark.query()

    def wait(self, mark):
        if mark is not None:
            mark.synchronize()

    def to_device(self, dst, src, scale=1.0):
        """Queue src (pinned) -> dst on the side stream, widened and
        scaled on the device; device_ready() makes the caller's stream
        wait for it."""
        self.stream.wait_stream(self._current())
        with torch.cuda.stream(self.stream):
            dst.record_stream(self.stream)
            if src.dtype == dst.dtype:
                dst.copy_(src, non_blocking=True)
            else:
                tmp = torch.empty(src.shape, dtype=src.dtype,
                                  device=self.device)
                tmp.copy_(src, non_blocking=True)
                dst.copy_(tmp)
            if scale != 1.0:
                dst.mul_(scale)

    def device_ready(self):
        ev = torch.cuda.Event()
        ev.record(self.stream)
        self._current().wait_event(ev)
