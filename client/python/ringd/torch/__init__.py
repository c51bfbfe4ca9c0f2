"""ringd.torch - PyTorch tensors in ringd's shared memory.

    import torch, ringd.torch as rt
    rt.init()                                   # or rt.init(socket=PATH)
    g = rt.zeros(1024, dtype=torch.bfloat16)    # in memory ringd maps too
    v = rt.step_begin()
    g.copy_(compute())
    rt.allreduce_(g, op="avg")                  # in place, no copy
    rt.step_end()

Tensors from empty()/zeros() are torch.frombuffer views of a ringd buffer:
on CPU the daemon reads and writes them where they are. allreduce_ and
broadcast_ take only such tensors, contiguous, of a dtype ringd reduces;
anything else raises NotContiguous, NotRingdMemory or UnsupportedDtype
(ValueError, ValueError, TypeError) before the daemon sees it. A buffer is
freed when no tensor over it is left (at the client's next call).
DistributedOptimizer and elastic.State take tensors outside ringd memory
too, CUDA ones included, and stage them through copies
(ringd/torch/staging.py); a device they cannot stage raises
UnsupportedDevice (ValueError) naming the tensor and its device.

allreduce_async_() issues the reduction and returns at once with a
Handle; the daemon runs it while the caller goes on (computing the rest
of backward, say). The tensor must not be touched until handle.wait()
has returned it. Every trainer must issue the same collectives in the
same order: ringd matches them by order of issue within the step.
"""
import torch

import ringd

# torch dtype -> ringd wire dtype.
DTYPES = {torch.float32: ringd.F32, torch.float64: ringd.F64,
          torch.float16: ringd.F16, torch.bfloat16: ringd.BF16,
          torch.int32: ringd.I32, torch.int64: ringd.I64,
          torch.uint8: ringd.U8}

_client = None


class NotContiguous(ValueError):
    """The tensor is not one dense block of memory."""


class NotRingdMemory(ValueError):
    """The tensor's memory is not a ringd buffer of this client."""


class UnsupportedDtype(TypeError):
    """ringd has no wire type for the tensor's dtype."""


def init(socket=None, name=None, client=None, **kw):
    """Connect the module's default client (or adopt `client`)."""
    global _client
    _client = client if client is not None else ringd.Client(
        socket, name=name or "ringd.torch", **kw)
    return _client


def client():
    if _client is None:
        raise RuntimeError("ringd.torch: call ringd.torch.init() first")
    return _client


def _pick(c):
    return c if c is not None else client()


def wire_dtype(dtype):
    """The ringd dtype of a torch dtype, or UnsupportedDtype naming it."""
    code = DTYPES.get(dtype)
    if code is None:
        raise UnsupportedDtype(
            "ringd has no dtype %s (it reduces %s)" %
            (dtype, ", ".join(str(d) for d in DTYPES)))
    return code


def empty(shape, dtype=torch.float32, client=None):
    """An uninitialised-by-contract (in fact zeroed) tensor in ringd
    memory."""
    c = _pick(client)
    wire_dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    numel = 1
    for n in shape:
        numel *= int(n)
    esize = torch.empty((), dtype=dtype).element_size()
    _, mv = c.raw_buffer(numel * esize)
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(mv, dtype=dtype, count=numel).view(shape)


def zeros(shape, dtype=torch.float32, client=None):
    """A zero tensor in ringd memory (ringd buffers start zeroed)."""
    return empty(shape, dtype, client)


def like(tensor, client=None):
    """A copy of tensor in ringd memory (same shape and dtype)."""
    out = empty(tensor.shape, tensor.dtype, client)
    out.copy_(tensor.detach())
    return out


def check(tensor, client=None):
    """Raise the clear exception for a tensor ringd cannot take; returns
    the ringd dtype."""
    c = _pick(client)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("ringd.torch: expected a torch.Tensor, got %s" %
                        type(tensor).__name__)
    code = wire_dtype(tensor.dtype)
    if tensor.device.type != "cpu":
        raise NotRingdMemory(
            "tensor on %s: ringd.torch reduces CPU tensors in ringd memory "
            "(copy it into one from ringd.torch.empty(); "
            "DistributedOptimizer and elastic.State stage such tensors "
            "themselves)" % tensor.device)
    if not tensor.is_contiguous():
        raise NotContiguous(
            "tensor of shape %s and strides %s is not contiguous: pass "
            "tensor.contiguous() copied into ringd memory" %
            (tuple(tensor.shape), tensor.stride()))
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes and not c.owns(tensor.data_ptr(), nbytes):
        raise NotRingdMemory(
            "tensor at %#x (%d bytes) is not in ringd memory: allocate it "
            "with ringd.torch.empty()/zeros()/like()" %
            (tensor.data_ptr(), nbytes))
    return code


class Handle:
    """An allreduce in flight. wait() returns its tensor once the result
    is in it and raises what the reduction failed with (ringd.Reshape:
    redo the step); done() tells without blocking."""

    def __init__(self, tensor, client=None, handle=None):
        self.tensor = tensor
        self._client = client
        self._handle = handle       # None: nothing left to wait for
        self._error = None          # a failure done() saw, for wait()

    def done(self):
        """True once the result is in the tensor (wait() then returns at
        once, raising the failure if there was one)."""
        if self._handle is None:
            return True
        try:
            if not self._client.test(self._handle):
                return False
        except ringd.Error as e:
            self._error = e
        self._handle = None
        return True

    def wait(self):
        err, self._error = self._error, None
        if err is not None:
            raise err
        h, self._handle = self._handle, None
        if h is not None:
            self._client.wait(h)
        return self.tensor


def allreduce_async_(tensor, op="avg", client=None, wire=None):
    """Issue an in-place allreduce over every trainer of the job and
    return at once with a Handle. Raises ringd.Reshape (redo the step)
    here when an earlier collective of the step failed with it, or from
    wait(). wire: "bf16" or "f16" between nodes for a float32 tensor
    (accumulated in f32), "none", or None for the job's default."""
    c = _pick(client)
    code = check(tensor, c)
    if tensor.numel() == 0:
        return Handle(tensor)
    h = c.allreduce_async_raw(tensor.data_ptr(), tensor.numel(), code, op,
                              keep=tensor, wire=wire)
    return Handle(tensor, c, h)


def allreduce_(tensor, op="avg", client=None):
    """In-place allreduce of a tensor in ringd memory; returns it."""
    return allreduce_async_(tensor, op, client).wait()


def broadcast_(tensor, root=0, client=None):
    """In-place broadcast from global rank root; returns the tensor."""
    c = _pick(client)
    check(tensor, c)
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes > 0:
        c.broadcast_raw(tensor.data_ptr(), nbytes, root)
    return tensor


def step_begin(client=None):
    return _pick(client).step_begin()


def step_end(client=None):
    _pick(client).step_end()


from ringd.torch.staging import UnsupportedDevice  # noqa: E402,F401
from ringd.torch.optimizer import (  # noqa: E402  (they use the above)
    Average, Compression, DistributedOptimizer, GradChanged, Max, Min, Sum,
    broadcast_optimizer_state, broadcast_parameters)
# Registers the "ringd" torch.distributed backend (ringd/torch/distributed.py).
from ringd.torch import distributed as _distributed  # noqa: E402,F401
