"""What every fault kind has by default (see kinds.py)."""

import re
import signal

from chaoslib.cluster import read_text


class Kind:
    name = ""
    new_generation = False

    def steps_needed(self, run):
        return run.cfg.per

    def precondition(self, run):
        return None

    def inject(self, run, v, r, fms, pre):
        raise NotImplementedError

    def notes(self, run):
        return []


def count_lines(path, pattern):
    rx = re.compile(pattern)
    return sum(1 for x in read_text(path).splitlines() if rx.search(x))


def kill_now(run, *pids):
    """SIGKILL several at once (before reaping any)."""
    for p in pids:
        run.cl.procs.signal(p, signal.SIGKILL)


def node_list(slots):
    return ",".join("node%s" % k for k in slots)
