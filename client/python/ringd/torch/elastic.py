"""ringd.torch.elastic - state that survives view changes, and the step loop.

    state = elastic.State(model=model, optimizer=opt, sampler=sampler,
                          epoch=0)
    state.register_reset_callbacks([lambda world: rescale_lr(world)])

    def train_step(state, view):
        xb, yb = batch(state.sampler.batch())      # this rank's share
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()                                 # a DistributedOptimizer

    elastic.run(train_step, state, steps=1000)

How the state reaches ringd's state region: it lives there. State() puts
the model's parameters and buffers and the optimizer's state tensors
(Adam's moments and step counters included) into one ringd buffer and
makes the live tensors views of it (tensor.data is rebound; the objects
the model and optimizer hold stay the same), so at every step end the
region already holds them and the daemon's checkpoints and joiners get
them without a copy. What is not a tensor (epoch, the sampler's
position, RNG states, the optimizer's hyperparameters, non-tensor extras)
is written as JSON into a fixed-size part of the region by commit(),
before each step end. The region starts with a header and the layout
(names, shapes, dtypes, offsets), so a checkpoint can be read without the
program that wrote it, and a restore checks that the layout is its own.

Tensors that cannot be views of the region (on a CUDA device, or CPU ones
when State(staging=True)) are staged instead (ringd/torch/staging.py):
each keeps its place in the layout, and commit() copies it there (on CUDA
from the device, through the region page-locked with cudaHostRegister, on
a side stream, waited for before commit() returns); restore() copies it
back. The daemon takes the region at a step's end (a checkpoint due, a
joiner, a trainer lost) without telling the trainer beforehand, so
commit() writes staged tensors at every step; digest() writes them first
too, so it hashes what commit() would leave.
"""
import array
import base64
import ctypes
import functools
import hashlib
import json
import os
import random
import signal
import struct
import time

import numpy as np
import torch

import ringd
import ringd.torch as rt
from ringd.torch import staging as staging_mod

MAGIC = b"RNGDSTAT"
VERSION = 1
# magic, version, layout bytes, meta capacity, meta bytes, data offset,
# total bytes, layout hash (16 bytes)
_HDR = struct.Struct("<8sIIIIQQ16s")
_ALIGN = 64
META_CAP = 256 << 10


def _align(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class ElasticSampler(torch.utils.data.Sampler):
    """Partitions what is left of the epoch over the current trainers.

    Each step takes the next world * batch_size samples of the epoch's
    order (a permutation seeded by (seed, epoch) when shuffling) and gives
    rank r its contiguous share; the last, short step splits what is left
    as evenly as it goes. Only commit() (after a step completed) moves the
    position on, so a step redone on a new view takes the same samples,
    repartitioned: after any number of view changes every sample of an
    epoch is seen exactly once.
    """

    def __init__(self, dataset, batch_size=1, shuffle=True, seed=0,
                 drop_last=False):
        self.n = len(dataset)
        # drop_last: a last step shorter than world * batch_size is not
        # taken (the epoch ends before it), as DataLoader's drop_last.
        self.drop_last = bool(drop_last)
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.epoch = 0
        self.processed = 0      # samples of this epoch already trained on
        self.rank, self.world = 0, 1
        self._order = None

    def set_world(self, rank, world):
        self.rank, self.world = int(rank), int(world)

    def set_epoch(self, epoch):
        self.epoch, self.processed, self._order = int(epoch), 0, None

    def order(self):
        if self._order is None:
            if self.shuffle:
                g = torch.Generator()
                g.manual_seed(self.seed * 1000003 + self.epoch)
                self._order = torch.randperm(self.n, generator=g).tolist()
            else:
                self._order = list(range(self.n))
        return self._order

    def _share(self, start, rank):
        left = self.n - start
        step = min(self.world * self.batch_size, left)
        q, extra = divmod(step, self.world)
        lo = start + rank * q + min(rank, extra)
        return lo, lo + q + (1 if rank < extra else 0), step

    def next_epoch_if_done(self):
        """A loop that only asks batch() goes on over epochs: once the
        epoch is done, asking for a batch starts the next one. A loop
        that checks done() itself first still sees it done (and may stop
        or call set_epoch), as before."""
        if self.done():
            self.set_epoch(self.epoch + 1)

    def batch(self, rank=None):
        """This rank's indices for the current step; once the epoch is
        done, of the next epoch's first step (next_epoch_if_done)."""
        self.next_epoch_if_done()
        lo, hi, _ = self._share(self.processed,
                                self.rank if rank is None else rank)
        return self.order()[lo:hi]

    def global_batch(self):
        """Every rank's indices of the current step, in rank order."""
        return [self.batch(r) for r in range(self.world)]

    def done(self):
        if self.drop_last:
            return self.n - self.processed < self.world * self.batch_size
        return self.processed >= self.n

    def commit(self):
        """The current step completed: move past its samples."""
        self.processed += self._share(self.processed, 0)[2]

    def __iter__(self):
        """This rank's samples of the rest of the epoch, step by step, as
        if the world stayed as it is."""
        pos = self.processed
        full = self.world * self.batch_size
        while pos < self.n and not (self.drop_last and self.n - pos < full):
            lo, hi, step = self._share(pos, self.rank)
            yield from self.order()[lo:hi]
            pos += step

    def __len__(self):
        return sum(1 for _ in self)

    def state_dict(self):
        return {"epoch": self.epoch, "processed": self.processed,
                "seed": self.seed, "n": self.n}

    def load_state_dict(self, d):
        if d["n"] != self.n or d["seed"] != self.seed:
            raise ValueError("ElasticSampler: saved for %d samples seed %d, "
                             "this one has %d seed %d" %
                             (d["n"], d["seed"], self.n, self.seed))
        self.epoch, self.processed = d["epoch"], d["processed"]
        self._order = None


class _StepBatches:
    """DataLoader batch sampler: the steps of the rest of the epoch as if
    the world stays as it is, each index tagged with its step's (epoch,
    position, rank, world); iterated in the main process when a
    DataLoader iterator starts, so workers prefetch these steps."""

    def __init__(self, sampler):
        self.s = sampler

    def __iter__(self):
        s = self.s
        pos, full = s.processed, s.world * s.batch_size
        while pos < s.n and not (s.drop_last and s.n - pos < full):
            lo, hi, step = s._share(pos, s.rank)
            tag = (s.epoch, pos, s.rank, s.world)
            yield [(tag, i) for i in s.order()[lo:hi]]
            pos += step

    def __len__(self):
        return sum(1 for _ in self)


class _Tagged(torch.utils.data.Dataset):
    def __init__(self, dataset):
        self.dataset = dataset

    def __getitem__(self, key):
        tag, i = key
        return tag, self.dataset[i]

    def __len__(self):
        return len(self.dataset)


def _worker_init(trainer_pid, user_fn, worker_id):
    """A loader worker dies with its trainer. torch's own watchdog
    compares the parent pid with the one it saw at the worker's start,
    so a worker forked just before its trainer was killed saw init's and
    lived on, holding the trainer's socket to the daemon and its memory
    (seen here: one left for minutes after a SIGKILL)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass                                      # not Linux: torch's watchdog
    if os.getppid() != trainer_pid:
        os._exit(0)                               # the trainer is gone
    if user_fn is not None:
        user_fn(worker_id)


class DataLoader:
    """A torch DataLoader (num_workers, pin_memory, ... as keywords) over
    an ElasticSampler's steps: batch() is this rank's collated batch of
    the current step. Workers prefetch the next steps as if the world
    stayed; a batch whose tag (epoch, position, rank, world) is not the
    current step's is dropped, and after a view change (or an epoch's
    end) the loader starts over from the sampler's position, so what
    training sees is always exactly sampler.batch(): every sample of an
    epoch once, across any number of view changes. A redone step gets
    the same batch again."""

    def __init__(self, dataset, sampler, collate_fn=None, **kw):
        self.sampler = sampler
        self._collate = collate_fn or torch.utils.data.default_collate
        if kw.get("num_workers", 0) > 0:
            kw["worker_init_fn"] = functools.partial(
                _worker_init, os.getpid(), kw.get("worker_init_fn"))
        self._loader = torch.utils.data.DataLoader(
            _Tagged(dataset), batch_sampler=_StepBatches(sampler),
            collate_fn=self._collate_tagged, **kw)
        self._it, self._last, self.dropped = None, None, 0

    def _collate_tagged(self, items):
        tags = {t for t, _ in items}
        return tags.pop(), self._collate([x for _, x in items])

    def batch(self):
        s = self.sampler
        s.next_epoch_if_done()
        want = (s.epoch, s.processed, s.rank, s.world)
        if self._last is not None and self._last[0] == want:
            return self._last[1]
        for fresh in (False, True):
            if fresh or self._it is None:
                self._it = iter(self._loader)
            for tag, b in self._it:
                if tag == want:
                    self._last = (tag, b)
                    return b
                self.dropped += 1
                if tag[0] != want[0] or tag[2:] != want[2:] or \
                        tag[1] > want[1]:
                    break           # another view's steps: start over
        raise RuntimeError("elastic.DataLoader: no batch for step %r "
                           "(the epoch is done?)" % (want,))


def _materialize_optimizer(opt):
    """Make the optimizer create its state now (Adam creates it lazily at
    the first step), as it would on a fresh start: one step on zero
    gradients, parameters put back, the new state zeroed. A zero moment
    and a zero step counter are what the first real step would have
    started from, so training is unchanged; but the layout is known from
    the start, the same on a joiner as on the job."""
    params = [p for g in opt.param_groups for p in g["params"]]
    if all(len(opt.state[p]) > 0 for p in params):
        return
    saved = [p.detach().clone() for p in params]
    grads = [p.grad for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
    for p, g in zip(params, grads):
        p.grad = g
    for p in params:
        for v in opt.state[p].values():
            if torch.is_tensor(v):
                v.zero_()


def _stateful(v):
    return (not torch.is_tensor(v) and callable(getattr(v, "state_dict",
                                                        None)) and
            callable(getattr(v, "load_state_dict", None)))


def _to_json(v):
    """A state dict as JSON: tensors (a GradScaler's scale on CUDA, say)
    tagged with their dtype; functions (LambdaLR's lambdas are None in
    its state dict) are not state."""
    if torch.is_tensor(v):
        return {"__tensor__": v.detach().cpu().tolist(),
                "dtype": str(v.dtype).replace("torch.", "")}
    if isinstance(v, dict):
        return {"__dict__": [[_to_json(k), _to_json(x)]
                             for k, x in v.items()]}
    if isinstance(v, (list, tuple)):
        return [_to_json(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError("elastic.State: %r in a state_dict is not JSON" %
                    type(v).__name__)


def _from_json(v):
    if isinstance(v, dict) and "__tensor__" in v:
        return torch.tensor(v["__tensor__"], dtype=getattr(torch,
                                                           v["dtype"]))
    if isinstance(v, dict) and "__dict__" in v:
        return {_hashable(_from_json(k)): _from_json(x)
                for k, x in v["__dict__"]}
    if isinstance(v, list):
        return [_from_json(x) for x in v]
    return v


def _hashable(k):
    return tuple(k) if isinstance(k, list) else k


def _b64(b):
    return base64.b64encode(b).decode()


def _rng_state():
    return {"torch": _b64(torch.get_rng_state().numpy().tobytes()),
            "numpy": _np_rng_to_json(np.random.get_state()),
            "python": _py_rng_to_json(random.getstate())}


def _np_rng_to_json(s):
    return [s[0], _b64(np.asarray(s[1], np.uint32).tobytes()), s[2], s[3],
            s[4]]


def _np_rng_from_json(s):
    return (s[0], np.frombuffer(base64.b64decode(s[1]), np.uint32), s[2],
            s[3], s[4])


def _py_rng_to_json(s):
    # Its 625 words as base64, not a JSON list of numbers: that list was
    # most of the text commit() encodes at every step.
    return [s[0], _b64(array.array("I", s[1]).tobytes()), s[2]]


def _py_rng_from_json(s):
    if isinstance(s[1], list):      # written before the words were base64
        return (s[0], tuple(s[1]), s[2])
    words = array.array("I")
    words.frombytes(base64.b64decode(s[1]))
    return (s[0], tuple(words), s[2])


def _set_rng(r):
    torch.set_rng_state(torch.frombuffer(
        bytearray(base64.b64decode(r["torch"])), dtype=torch.uint8))
    np.random.set_state(_np_rng_from_json(r["numpy"]))
    random.setstate(_py_rng_from_json(r["python"]))


class State:
    """Everything a replica needs, in ringd's state region (see the
    module's docstring). Tensor extras live in the region like parameters;
    other extras (ints, floats, strings, lists, dicts) go into the JSON
    part and come back as attributes: state.epoch, state.best, ..."""

    def __init__(self, model=None, optimizer=None, sampler=None, client=None,
                 meta_cap=META_CAP, staging=None, lr_scheduler=None,
                 scaler=None, **extras):
        self.client = rt._pick(client)
        # Objects with state_dict()/load_state_dict() (the scheduler, a
        # GradScaler, any extra that has them): their state dicts go into
        # the JSON part at every commit() and come back at restore().
        self._objects = {}
        if lr_scheduler is not None:
            self._objects["lr_scheduler"] = lr_scheduler
        if scaler is not None:
            self._objects["scaler"] = scaler
        self.lr_scheduler, self.scaler = lr_scheduler, scaler
        for k in [k for k, v in extras.items() if _stateful(v)]:
            self._objects["extra/" + k] = extras.pop(k)
            object.__setattr__(self, k, self._objects["extra/" + k])
        self._staging = staging
        self._staged = []           # (region view, tensor, stager)
        self.model, self.optimizer, self.sampler = model, optimizer, sampler
        self._reset_callbacks = []
        self._tensors = []          # (name, live tensor)
        self._plain = {}
        seen = set()

        def add(name, t):
            # A tensor held twice (tied weights) has one place.
            if id(t) not in seen:
                seen.add(id(t))
                self._tensors.append((name, t))
        if model is not None:
            for name, t in model.state_dict(keep_vars=True).items():
                add("model/" + name, t)
        if optimizer is not None:
            _materialize_optimizer(optimizer)
            params = [p for g in optimizer.param_groups for p in g["params"]]
            for i, p in enumerate(params):
                for k, v in sorted(optimizer.state[p].items()):
                    if torch.is_tensor(v):
                        add("optim/%d/%s" % (i, k), v)
        for k, v in sorted(extras.items()):
            if torch.is_tensor(v):
                add("extra/" + k, v)
            else:
                self._plain[k] = v
        self._build(meta_cap)
        self.commit()

    def __getattr__(self, name):
        plain = self.__dict__.get("_plain", {})
        if name in plain:
            return plain[name]
        raise AttributeError(name)

    def __setattr__(self, name, value):
        if "_plain" in self.__dict__ and name in self._plain:
            self._plain[name] = value
        else:
            object.__setattr__(self, name, value)

    def _build(self, meta_cap):
        layout, off, stagers = [], 0, []
        for name, t in self._tensors:
            st = staging_mod.stager_for(t, "elastic.State: " + name)
            stagers.append(st if self._staging or t.device.type != "cpu"
                           else None)
            nbytes = t.numel() * t.element_size()
            layout.append({"name": name, "shape": list(t.shape),
                           "dtype": str(t.dtype).replace("torch.", ""),
                           "offset": off, "nbytes": nbytes})
            off = _align(off + nbytes)
        self.layout = layout
        ljson = json.dumps(layout, separators=(",", ":")).encode()
        self._layout_hash = hashlib.blake2b(ljson, digest_size=16).digest()
        self._meta_off = _align(_HDR.size + len(ljson))
        self._data_off = _align(self._meta_off + meta_cap)
        self.nbytes = self._data_off + off
        self._meta_cap = meta_cap
        _, mv = self.client.raw_buffer(self.nbytes)
        self._mv = mv
        self.region = np.frombuffer(mv, np.uint8, count=self.nbytes)
        self.region[_HDR.size:_HDR.size + len(ljson)] = np.frombuffer(
            ljson, np.uint8)
        self._write_header(0, len(ljson))
        # Page-locked once, by the first device's stager (held here: it
        # is unlocked when collected).
        self._pinned = torch.frombuffer(mv, dtype=torch.uint8,
                                        count=self.nbytes)
        cuda = [st for st in stagers if isinstance(st, staging_mod.Device)]
        if cuda:
            cuda[0].register(self._pinned)
        for ent, (name, t), st in zip(layout, self._tensors, stagers):
            if ent["nbytes"] == 0:
                continue
            view = torch.frombuffer(mv, dtype=t.dtype,
                                    count=t.numel(),
                                    offset=self._data_off + ent["offset"])
            view = view.view(t.shape)
            if st is not None:
                self._staged.append((view, t, st))
            else:
                view.copy_(t.detach())
                t.data = view
        self._stage_out()
        self.client.state(self.region)

    def _stagers(self):
        return {id(st): st for _, _, st in self._staged}.values()

    def _stage_out(self):
        """Copy the staged tensors into their places in the region and
        wait until they are there."""
        for view, t, st in self._staged:
            st.to_host(view, t.detach())
        for st in self._stagers():
            st.wait(st.mark())

    def _stage_in(self):
        """Copy the region's bytes into the staged tensors, and wait: the
        region may be overwritten again at the next step_begin."""
        for view, t, st in self._staged:
            st.to_device(t.detach(), view)
        for st in self._stagers():
            st.device_ready()
            st.wait(st.mark())

    def _write_header(self, meta_len, layout_len=None):
        if layout_len is None:
            layout_len = _HDR.unpack_from(self._mv, 0)[2]
        _HDR.pack_into(self._mv, 0, MAGIC, VERSION, layout_len,
                       self._meta_cap, meta_len, self._data_off,
                       self.nbytes, self._layout_hash)

    def register_reset_callbacks(self, callbacks):
        """fn(world) for each, called when the view changes (not at the
        first step): rescale the learning rate, rebuild what depends on
        the world size."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self, world):
        if self.sampler is not None:
            self.sampler.set_world(self.sampler.rank, world)
        for fn in self._reset_callbacks:
            fn(world)

    def _meta(self):
        m = {"plain": self._plain, "rng": _rng_state(),
             "objects": {k: _to_json(o.state_dict())
                         for k, o in sorted(self._objects.items())}}
        if self.sampler is not None:
            m["sampler"] = self.sampler.state_dict()
        if self.optimizer is not None:
            m["param_groups"], first = [], 0
            for g in self.optimizer.param_groups:
                saved = {k: v for k, v in g.items() if k != "params"}
                # Indices, as optimizer.state_dict() numbers parameters.
                saved["params"] = list(range(first, first + len(g["params"])))
                first += len(g["params"])
                m["param_groups"].append(saved)
        return m

    def commit(self):
        """Write what is not a tensor into the region. elastic.run calls
        it after each step's update, before the step ends. Staged
        tensors are copied into the region first."""
        self._stage_out()
        meta = json.dumps(self._meta(), separators=(",", ":")).encode()
        if len(meta) > self._meta_cap:
            raise ValueError("elastic.State: %d bytes of non-tensor state "
                             "exceed meta_cap=%d" % (len(meta),
                                                     self._meta_cap))
        a = self._meta_off
        self.region[a:a + len(meta)] = np.frombuffer(meta, np.uint8)
        self._write_header(len(meta))

    def restore(self):
        """The region was just overwritten with the job's state (a joiner,
        view.restored): check it is laid out as ours, then load what is
        not a tensor (the tensors already are the region, but staged
        ones, which are copied out of it)."""
        magic, ver, llen, cap, mlen, doff, total, lhash = _HDR.unpack_from(
            self._mv, 0)
        if magic != MAGIC or ver != VERSION:
            raise ValueError("elastic.State: the restored region is not a "
                             "ringd.torch state (magic %r)" % magic)
        if lhash != self._layout_hash or total != self.nbytes:
            raise ValueError("elastic.State: the job's state has another "
                             "layout (a different model or optimizer)")
        self._stage_in()
        a = self._meta_off
        m = json.loads(bytes(self.region[a:a + mlen]))
        self._plain.update(m["plain"])
        _set_rng(m["rng"])
        if self.sampler is not None and "sampler" in m:
            self.sampler.load_state_dict(m["sampler"])
        for k, d in m.get("objects", {}).items():
            if k in self._objects:
                self._objects[k].load_state_dict(_from_json(d))
        if self.optimizer is not None and "param_groups" in m:
            for g, saved in zip(self.optimizer.param_groups,
                                m["param_groups"]):
                g.update({k: v for k, v in saved.items() if k != "params"})

    def digest(self):
        """blake2b-64 of the tensors' bytes in the region (replicas that
        are bitwise identical have the same), staged ones copied in
        first."""
        self._stage_out()
        return hashlib.blake2b(self.region[self._data_off:].tobytes(),
                               digest_size=8).hexdigest()


def run(step_fn, state, steps=None, fenced_wait_s=60.0):
    """The step loop: step_fn(state, view) computes and applies one step
    (its collectives raise ringd.Reshape when the view changes mid-step:
    the step is redone on the new view). A joiner's state is loaded before
    its first step (view.restored); on_reset callbacks run with the new
    world size whenever the generation changes. Stops when the job's step
    counter reaches `steps` (an int, or a function giving the limit or
    None, asked at every step), when step_fn returns False, or when the
    daemon drains (ringd.Shutdown). Returns the last view."""
    c = state.client
    gen, fenced_since, v = None, None, None
    while True:
        try:
            v = c.step_begin()
        except ringd.Shutdown:
            return v
        except ringd.Fenced:
            # The node lost its lease; step_begin raises until it is back.
            fenced_since = fenced_since or time.monotonic()
            if time.monotonic() - fenced_since > fenced_wait_s:
                raise
            time.sleep(0.1)
            continue
        fenced_since = None
        if v.restored:
            state.restore()
        if state.sampler is not None:
            state.sampler.set_world(v.rank, v.world)
        # Whenever the world size changes (with or without a new
        # generation), and on any new generation.
        if gen is not None and (v.generation, v.world) != gen:
            state.on_reset(v.world)
        gen = (v.generation, v.world)
        limit = steps() if callable(steps) else steps
        if limit is not None and v.step >= limit:
            return v
        try:
            more = step_fn(state, v)
        except (ringd.Reshape, ringd.Disconnected, ringd.Fenced):
            for hook in getattr(c, "abandon_hooks", ()):
                hook()                  # what the attempt moved goes back
            continue                    # redo the step on the new view
        if state.sampler is not None:
            state.sampler.commit()
        state.commit()
        try:
            c.step_end()
        except ringd.Error:
            continue                    # step_begin reconnects
        if more is False:
            return v
