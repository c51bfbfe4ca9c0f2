"""The processes the harness starts, and their exit statuses.

The harness is a child subreaper (prctl), so an etcd that cluster.sh
started in a bash that has exited is still our child. A process is reaped
only here, by its own pid (never waitpid(-1)), and signalled only while
unreaped, so its pid cannot have been reused by then. Statuses are the
shell's: the exit code, or 128 + the signal.
"""

import ctypes
import os
import signal
import subprocess
import time

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except OSError:
        pass


def _shell_status(st):
    if os.WIFSIGNALED(st):
        return 128 + os.WTERMSIG(st)
    return os.WEXITSTATUS(st)


class Procs:
    """pids in start order; role ("daemon node3"), expected end
    ("ok", "killed", "drained", "restarted", "crashed") and status per
    pid. `handled` holds the pids whose exit the driver has taken note of
    (killed by it, or seen by check_alive): an exit not yet handled of a
    live node's process is a crash."""

    def __init__(self):
        self.pids = []
        self.role = {}
        self.expect = {}
        self.status = {}
        self.handled = set()
        self.popen = []   # kept: a collected Popen would reap its pid

    def start(self, argv, log, role, expect="ok", env=None, append=True):
        with open(log, "ab" if append else "wb") as out:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, env=env)
        self.popen.append(p)
        self.adopt(p.pid, role, expect)
        return p.pid

    def adopt(self, pid, role, expect="ok"):
        self.pids.append(pid)
        self.role[pid] = role
        self.expect[pid] = expect

    def alive(self, pid):
        """False once the process has exited (its status recorded)."""
        if pid in self.status:
            return False
        try:
            got, st = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            self.status[pid] = 127
            return False
        if got == 0:
            return True
        self.status[pid] = _shell_status(st)
        return False

    def wait(self, pid):
        """Block until pid exits; its status."""
        if pid not in self.status:
            try:
                _, st = os.waitpid(pid, 0)
                self.status[pid] = _shell_status(st)
            except ChildProcessError:
                self.status[pid] = 127
        return self.status[pid]

    def signal(self, pid, sig):
        if self.alive(pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill_reap(self, pid):
        """SIGKILL and reap; the exit is expected and handled."""
        self.expect[pid] = "killed"
        self.signal(pid, signal.SIGKILL)
        self.wait(pid)
        self.handled.add(pid)

    def wait_exit(self, pid, tries, pause):
        """Poll up to tries * pause seconds for pid's exit; True if it
        exited."""
        for _ in range(tries):
            if not self.alive(pid):
                return True
            time.sleep(pause)
        return not self.alive(pid)

    def kill_all(self):
        """Cleanup: every process still running, continued and killed."""
        for pid in self.pids:
            if self.alive(pid):
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
                self.wait(pid)
