"""Queries on the trainers' hash logs, T/hash-K.log, whose lines are
`step S gen G rank R world W hash H t_ms T loss L`.

The logs grow by some hundred lines a second and the recovery waits ask
every 50 ms, so each file is read incrementally (complete lines only) and
indexed: per line step, gen and t_ms, with the running maximum of the
generation. t_ms only grows within a file (one trainer at a time appends
to it); a file where it does not is searched line by line instead.
"""

import bisect
import glob
import os


class _File:
    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.step = []
        self.gen = []
        self.tms = []
        self.gmax = []       # running maximum of gen
        self.smax = -1
        self.sorted = True   # t_ms nondecreasing

    def update(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        self.offset += end + 1
        for line in data[:end].split(b"\n"):
            x = line.split()
            if len(x) < 12 or x[0] != b"step":
                continue
            try:
                s, g, t = int(x[1]), int(x[3]), int(x[11])
            except ValueError:
                continue
            if self.tms and t < self.tms[-1]:
                self.sorted = False
            self.step.append(s)
            self.gen.append(g)
            self.tms.append(t)
            self.gmax.append(max(g, self.gmax[-1]) if self.gmax else g)
            if s > self.smax:
                self.smax = s

    def since(self, t):
        """Indices of the lines with t_ms >= t."""
        if self.sorted:
            return range(bisect.bisect_left(self.tms, t), len(self.tms))
        return [i for i in range(len(self.tms)) if self.tms[i] >= t]


class HashLogs:
    def __init__(self, tdir):
        self.tdir = tdir
        self.files = {}

    def _path(self, slot):
        return os.path.join(self.tdir, "hash-%s.log" % slot)

    def _get(self, path):
        f = self.files.get(path)
        if f is None:
            f = self.files[path] = _File(path)
        f.update()
        return f

    def _all(self):
        return [self._get(p) for p in
                sorted(glob.glob(os.path.join(self.tdir, "hash-*.log")))]

    def _of(self, slots):
        return [self._get(self._path(k)) for k in slots
                if os.path.isfile(self._path(k))]

    def max_step(self):
        """The highest step any trainer logged so far (-1 when none)."""
        return max([f.smax for f in self._all()] + [-1])

    def first_after(self, s, slots, t):
        """First completed step >= s by a node in slots with t_ms >= t:
        (step, t_ms) or None."""
        best = None
        for f in self._of(slots):
            for i in f.since(t):
                if f.step[i] >= s and (best is None or f.tms[i] < best[1]):
                    best = (f.step[i], f.tms[i])
        return best

    def first_newgen(self, g, slots, t):
        """First step of a generation above g by a node in slots with
        t_ms >= t: (step, t_ms, gen) or None."""
        best = None
        for f in self._of(slots):
            for i in f.since(t):
                if f.gen[i] > g and (best is None or f.tms[i] < best[1]):
                    best = (f.step[i], f.tms[i], f.gen[i])
        return best

    def gen_at(self, t):
        """The newest view generation of any line stamped at or before t:
        the generation the job was in when a fault struck (0 if none)."""
        g = 0
        for f in self._all():
            if f.sorted:
                i = bisect.bisect_right(f.tms, t)
                if i:
                    g = max(g, f.gmax[i - 1])
            else:
                for j in range(len(f.tms)):
                    if f.tms[j] <= t:
                        g = max(g, f.gen[j])
        return g

    def stamps(self, slots, a, b):
        """The t_ms in [a, b] of the lines of slots (None: every log)."""
        fs = self._all() if slots is None else self._of(slots)
        out = []
        for f in fs:
            out.extend(f.tms[i] for i in f.since(a) if f.tms[i] <= b)
        return sorted(out), len(fs)

    def gap_in(self, slots, a, b):
        """The longest time in [a, b] without a step of a node in slots
        (the edges count)."""
        ts, nfiles = self.stamps(slots, a, b)
        if nfiles == 0:
            return b - a
        p, g = a, 0
        for x in ts:
            g = max(g, x - p)
            p = x
        return max(g, b - p)

    def count_in(self, slot, a, b):
        return len(self.stamps([slot], a, b)[0])
