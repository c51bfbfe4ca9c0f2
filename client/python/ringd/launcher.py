"""ringrun - start and supervise the local trainers of a ringd job, as
torchrun does for torch.distributed:

    ringrun --nproc 4 --max-restarts 3 -- python3 train.py --epochs 10

Each trainer gets RINGD_SOCKET, LOCAL_RANK (its slot here, 0..N-1),
LOCAL_WORLD_SIZE (N), RINGD_LAUNCHER=1 and RINGD_LAUNCHER_PID,
RINGRUN_RESTART_COUNT (how often its slot was restarted), RINGD_JOB with
--job, CUDA_VISIBLE_DEVICES with GPUs, and PYTHONUNBUFFERED=1 unless set.
Its stdout and stderr lines reach ours prefixed with "[LOCAL_RANK] ".
A trainer that dies (non-zero exit or a signal) is restarted after an
exponential backoff, at most --max-restarts times within
--restart-window seconds; one more death gives up: the others are
stopped and ringrun exits 1 naming the trainer, how it ended and the
count. SIGINT or SIGTERM stops the job: every trainer gets SIGTERM (the
ringd package then ends the step in progress and leaves with BYE, see
ringd.stop_requested()), what is left after --grace seconds is killed;
a second signal kills at once. Exit: 0 once every trainer exited 0, 1
when it gave up, 2 for a usage error, 128+signal when stopped.
"""
import argparse
import collections
import os
import re
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import time

NPROC_MAX = 1024
RESTARTS_MAX = 1000
WINDOW_MAX = 86400.0
GRACE_MAX = 3600.0
BACKOFF_MAX = 60.0          # the first delay, and the cap of its doubling
SOCKET_MAX = 107            # sun_path holds 108 bytes with the NUL
NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
GPU_RE = re.compile(r"([0-9]{1,4}|(GPU|MIG)-[A-Za-z0-9/-]{1,96})\Z")
LINE_MAX = 65536            # a longer line is passed on in pieces
DEFAULT_SOCKET = "/run/ringd/ringd.sock"   # RINGD_DEFAULT_SOCKET

EPILOG = """\
limits: --nproc 1..%d; --job a name of 1..64 characters of
[A-Za-z0-9_.-]; --gpus a comma list of at most %d GPU indexes (0..9999)
or GPU-/MIG- UUIDs (100 characters at most), no repeats, at least
--nproc of them; --max-restarts 0..%d; --restart-window 1..%g s;
--grace 0..%g s; --backoff 0..%g s (doubled at each restart within the
window, at most %g s); --socket (or $RINGD_SOCKET) 1..%d bytes, a Unix
socket that exists. A line a trainer writes is passed on in pieces of %d
bytes at most.

--job is passed to the trainers as RINGD_JOB: a ringd whose config pins
no job serves the job its first trainer names; one that pins a job
refuses another name.

exit status: 0 every trainer exited 0; 1 gave up (a trainer died more
than --max-restarts times within the window, or could not be started);
2 usage error; 128+N stopped by signal N.""" % (
    NPROC_MAX, NPROC_MAX, RESTARTS_MAX, WINDOW_MAX, GRACE_MAX, BACKOFF_MAX,
    BACKOFF_MAX, SOCKET_MAX, LINE_MAX)


class Usage(Exception):
    """A bad flag or environment value: ringrun exits 2."""


def _number(kind, lo, hi):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a number" % text)
        if not (lo <= v <= hi) or v != v:
            raise argparse.ArgumentTypeError("%s is not in %g..%g" %
                                             (text, lo, hi))
        return v
    return parse


def _name(text):
    if not NAME_RE.match(text):
        raise argparse.ArgumentTypeError(
            "%r is not 1..64 characters of [A-Za-z0-9_.-]" % text[:80])
    return text


def _gpus(text):
    if text in ("auto", "none"):
        return text
    return parse_gpu_list(text, "--gpus")


def parse_gpu_list(text, what):
    items = text.split(",")
    if len(items) > NPROC_MAX:
        raise argparse.ArgumentTypeError("%s: more than %d GPUs" %
                                         (what, NPROC_MAX))
    for g in items:
        if not GPU_RE.match(g):
            raise argparse.ArgumentTypeError(
                "%s: %r is not a GPU index (0..9999) or a GPU-/MIG- UUID"
                % (what, g[:100]))
    if len(set(items)) != len(items):
        raise argparse.ArgumentTypeError("%s: a GPU is named twice" % what)
    return items


def _parser():
    p = argparse.ArgumentParser(
        prog="ringrun", allow_abbrev=False, epilog=EPILOG,
        usage="ringrun --nproc N [options] -- COMMAND [ARGS...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Start N local trainers of a ringd job and supervise\n"
                    "them: restart the ones that die, stop them all\n"
                    "cleanly on SIGINT/SIGTERM.")
    p.add_argument("--nproc", required=True, metavar="N",
                   type=_number(int, 1, NPROC_MAX),
                   help="trainers to start on this node (1..%d)" % NPROC_MAX)
    p.add_argument("--job", type=_name, metavar="NAME",
                   help="job name, passed as RINGD_JOB (1..64 of "
                        "[A-Za-z0-9_.-])")
    p.add_argument("--gpus", type=_gpus, default="auto",
                   metavar="auto|none|LIST",
                   help="auto (default: $CUDA_VISIBLE_DEVICES when set, "
                        "else the GPUs nvidia-smi -L or "
                        "/proc/driver/nvidia/gpus lists; none found: no "
                        "CUDA_VISIBLE_DEVICES), none, or a comma list; "
                        "trainer i gets the i-th")
    p.add_argument("--max-restarts", type=_number(int, 0, RESTARTS_MAX),
                   metavar="K",
                   default=3, help="restarts of one trainer within "
                   "--restart-window before giving up (0..%d, default 3)"
                   % RESTARTS_MAX)
    p.add_argument("--restart-window", type=_number(float, 1, WINDOW_MAX),
                   default=300.0, metavar="S",
                   help="seconds over which restarts are counted "
                        "(1..%g, default 300)" % WINDOW_MAX)
    p.add_argument("--backoff", type=_number(float, 0, BACKOFF_MAX),
                   default=1.0, metavar="S",
                   help="delay before the first restart, doubled for each "
                        "further one within the window (0..%g, default 1)"
                        % BACKOFF_MAX)
    p.add_argument("--grace", type=_number(float, 0, GRACE_MAX),
                   default=30.0, metavar="S",
                   help="seconds a stopping trainer has to leave before it "
                        "is killed (0..%g, default 30)" % GRACE_MAX)
    p.add_argument("--socket", metavar="PATH",
                   help="ringd's socket (default $RINGD_SOCKET, else %s; "
                        "at most %d bytes)" % (DEFAULT_SOCKET, SOCKET_MAX))
    return p


def parse_args(argv):
    """(options, command) from argv (without the program name); argparse
    exits 2 on a bad flag, Usage for what it cannot check."""
    p = _parser()
    if "--" in argv:
        i = argv.index("--")
        flags, cmd = argv[:i], argv[i + 1:]
    else:
        flags, cmd = argv, []
    o = p.parse_args(flags)
    if not cmd:
        p.error("no trainer command: put it after --")
    o.socket = check_socket(o.socket)
    o.gpu_ids = resolve_gpus(o.gpus, o.nproc)
    o.exe = find_exe(cmd[0])
    check_fds(o.nproc)
    return o, cmd


def check_socket(path):
    what = "--socket"
    if path is None:
        path = os.environ.get("RINGD_SOCKET") or DEFAULT_SOCKET
        what = "RINGD_SOCKET" if os.environ.get("RINGD_SOCKET") else \
            "the default socket"
    if len(os.fsencode(path)) > SOCKET_MAX or "\0" in path:
        raise Usage("%s: %d bytes, a Unix socket path holds at most %d" %
                    (what, len(os.fsencode(path)), SOCKET_MAX))
    try:
        st = os.stat(path)
    except OSError as e:
        raise Usage("%s %s: %s (is ringd running?)" %
                    (what, path, e.strerror))
    if not stat.S_ISSOCK(st.st_mode):
        raise Usage("%s %s: not a socket" % (what, path))
    return path


def count_gpus():
    """GPUs on this node: nvidia-smi -L's "GPU n:" lines, else the entries
    of /proc/driver/nvidia/gpus, else 0."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True,
                                 timeout=20, check=True).stdout
            n = sum(1 for ln in out.splitlines() if ln.startswith(b"GPU "))
            if n:
                return min(n, NPROC_MAX)
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        return min(len(os.listdir("/proc/driver/nvidia/gpus")), NPROC_MAX)
    except OSError:
        return 0


def resolve_gpus(spec, nproc):
    """The CUDA_VISIBLE_DEVICES value of each trainer, or None."""
    if spec == "none":
        return None
    src = "--gpus"
    if spec == "auto":
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        if env is not None:
            src = "CUDA_VISIBLE_DEVICES"
            if env == "" or env.startswith("-"):
                return None     # the user hid every GPU
            try:
                ids = parse_gpu_list(env, src)
            except argparse.ArgumentTypeError as e:
                raise Usage(str(e))
        else:
            src = "--gpus auto"
            ids = [str(i) for i in range(count_gpus())]
        if not ids:
            return None
    else:
        ids = spec
    if nproc > len(ids):
        raise Usage("--nproc %d but %s gives %d GPU%s (%s); --gpus none "
                    "runs without CUDA_VISIBLE_DEVICES" %
                    (nproc, src, len(ids), "" if len(ids) == 1 else "s",
                     ",".join(ids)))
    return ids[:nproc]


def find_exe(name):
    path = name if os.sep in name else shutil.which(name)
    if path is None or not os.access(path, os.X_OK) or os.path.isdir(path):
        raise Usage("cannot run %r: not an executable file%s" %
                    (name[:200], "" if os.sep in name else " on PATH"))
    return path


def check_fds(nproc):
    """Two pipes a trainer, and a few for ourselves: raise the soft limit
    of descriptors to that where it is lower."""
    need = 2 * nproc + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise Usage("--nproc %d needs %d file descriptors, the hard "
                        "limit (ulimit -Hn) is %d" % (nproc, need, hard))
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def describe(rc):
    """How a trainer ended, from Popen.returncode."""
    if rc < 0:
        try:
            return "killed by %s" % signal.Signals(-rc).name
        except ValueError:
            return "killed by signal %d" % -rc
    return "exited with status %d" % rc


class Output:
    """One pipe of a trainer: its lines go to `out` prefixed."""

    def __init__(self, fd, prefix, out):
        self.fd, self.prefix, self.out = fd, prefix, out
        self.buf = b""

    def feed(self, data):
        """Pass on the complete lines of data (every line when data is
        empty: end of file)."""
        self.buf += data
        lines = self.buf.split(b"\n")
        self.buf = lines.pop()
        while len(self.buf) > LINE_MAX:
            lines.append(self.buf[:LINE_MAX])
            self.buf = self.buf[LINE_MAX:]
        if not data and self.buf:
            lines.append(self.buf)
            self.buf = b""
        if lines:
            _write(self.out, b"".join(self.prefix + ln + b"\n"
                                      for ln in lines))


def _write(out, data):
    try:
        out.write(data)
        out.flush()
    except (BrokenPipeError, ValueError):
        pass                    # nobody reads our output any more
    except OSError as e:
        if e.errno != 5:        # EIO: the terminal went away
            raise


def say(msg):
    _write(sys.stderr.buffer, ("ringrun: %s\n" % msg).encode(errors="replace"))


class Trainer:
    """One local slot: its process, its restarts."""

    def __init__(self, rank):
        self.rank = rank
        self.proc = None
        self.restarts = 0
        self.recent = collections.deque()   # times of restarts in window
        self.due = None         # when its restart is due
        self.rc = None          # its last exit status, once it ended
        self.killed = False     # killed after the grace


class Launcher:
    def __init__(self, o, cmd):
        self.o, self.cmd = o, cmd
        self.trainers = [Trainer(i) for i in range(o.nproc)]
        self.sel = selectors.DefaultSelector()
        self.signum = None      # the signal that stops the job
        self.stopping = False   # no more restarts: the job ends
        self.stop_at = None     # the grace's end, until it passed
        self.reason = None      # why it gave up
        self.pending = []       # signals received, for the loop
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self.wake_r, self.wake_w = r, w
        self.sel.register(r, selectors.EVENT_READ, None)

    def _env(self, t):
        o = self.o
        env = dict(os.environ)
        env.update(RINGD_SOCKET=o.socket, LOCAL_RANK=str(t.rank),
                   LOCAL_WORLD_SIZE=str(o.nproc), RINGD_LAUNCHER="1",
                   RINGD_LAUNCHER_PID=str(os.getpid()),
                   RINGRUN_RESTART_COUNT=str(t.restarts))
        env.setdefault("PYTHONUNBUFFERED", "1")
        if o.job is not None:
            env["RINGD_JOB"] = o.job
        if o.gpu_ids is not None:
            env["CUDA_VISIBLE_DEVICES"] = o.gpu_ids[t.rank]
        return env

    def spawn(self, t):
        """Start t's process; False (and the reason set) if it cannot."""
        try:
            t.proc = subprocess.Popen(self.cmd, executable=self.o.exe,
                                      env=self._env(t),
                                      stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE)
        except OSError as e:
            self.reason = "trainer %d: cannot run %s: %s" % (
                t.rank, self.cmd[0][:200], e.strerror)
            return False
        t.rc, t.due = None, None
        prefix = b"[%d] " % t.rank
        for pipe, out in ((t.proc.stdout, sys.stdout.buffer),
                          (t.proc.stderr, sys.stderr.buffer)):
            fd = pipe.fileno()
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ,
                              (pipe, Output(fd, prefix, out)))
        return True

    def _on_signal(self, signum, frame):
        self.pending.append(signum)

    def install_signals(self):
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(s, self._on_signal)

    def _read(self, key):
        pipe, out = key.data
        try:
            data = os.read(key.fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        out.feed(data)
        if not data:
            self.sel.unregister(key.fd)
            pipe.close()

    def _signals(self):
        while self.pending:
            s = self.pending.pop(0)
            if s == signal.SIGCHLD:
                continue
            if not self.stopping:
                self.signum = s
                say("%s: stopping the trainers (SIGTERM, %g s grace)" %
                    (signal.Signals(s).name, self.o.grace))
                self.stop()
            else:
                say("%s again: killing the trainers" %
                    signal.Signals(s).name)
                self.stop_at = time.monotonic()

    def stop(self):
        """SIGTERM to every running trainer; no more restarts."""
        self.stopping = True
        self.stop_at = time.monotonic() + self.o.grace
        for t in self.trainers:
            t.due = None
            if t.proc is not None and t.rc is None:
                _kill(t.proc, signal.SIGTERM)

    def _ended(self, t, rc):
        t.rc = rc
        if rc == 0 or self.stopping:
            return
        now = time.monotonic()
        while t.recent and t.recent[0] <= now - self.o.restart_window:
            t.recent.popleft()
        k = self.o.max_restarts
        if len(t.recent) >= k:
            self.reason = ("trainer %d %s; restarted %d time%s within "
                           "%g s (--max-restarts %d): giving up" %
                           (t.rank, describe(rc), len(t.recent),
                            "" if len(t.recent) == 1 else "s",
                            self.o.restart_window, k))
            say(self.reason)
            self.stop()
            return
        delay = min(self.o.backoff * 2 ** len(t.recent), BACKOFF_MAX)
        t.due = now + delay
        t.recent.append(now)
        say("trainer %d %s; restart %d of %d within %g s in %g s" %
            (t.rank, describe(rc), len(t.recent), k, self.o.restart_window,
             delay))

    def _reap(self):
        for t in self.trainers:
            if t.proc is not None and t.rc is None:
                rc = t.proc.poll()
                if rc is not None:
                    self._ended(t, rc)

    def _timers(self):
        now = time.monotonic()
        for t in self.trainers:
            if t.due is not None and t.due <= now:
                t.restarts += 1
                if not self.spawn(t):
                    say(self.reason)
                    t.due = None
                    self.stop()
        if self.stop_at is not None and now >= self.stop_at:
            self.stop_at = None     # the SIGKILLs' SIGCHLD wakes us
            for t in self.trainers:
                if t.proc is not None and t.rc is None and not t.killed:
                    t.killed = True
                    _kill(t.proc, signal.SIGKILL)

    def _timeout(self):
        times = [t.due for t in self.trainers if t.due is not None]
        if self.stop_at is not None:
            times.append(self.stop_at)
        if not times:
            return None
        return max(0.0, min(times) - time.monotonic())

    def _running(self):
        return any((t.proc is not None and t.rc is None) or
                   t.due is not None for t in self.trainers)

    def loop(self):
        while self._running():
            for key, _ in self.sel.select(self._timeout()):
                if key.data is None:
                    _drain(key.fd)
                else:
                    self._read(key)
            self._signals()
            self._reap()
            self._timers()
        self._flush()

    def _flush(self):
        """What the trainers left in their pipes, without waiting for
        processes of theirs that still hold them."""
        for key in list(self.sel.get_map().values()):
            if key.data is not None:
                for _ in range(64):
                    before = key.data[1].buf
                    self._read(key)
                    if key.fd not in self.sel.get_map() or \
                            key.data[1].buf == before:
                        break
                if key.fd in self.sel.get_map():
                    key.data[1].feed(b"")

    def outcome(self):
        """(exit status, the one-line reason)."""
        restarts = sum(t.restarts for t in self.trainers)
        bad = ["trainer %d %s" % (t.rank, "killed after the %g s grace" %
                                  self.o.grace if t.killed else
                                  describe(t.rc))
               for t in self.trainers if t.killed or t.rc != 0]
        if self.reason is not None:
            return 1, self.reason
        if self.signum is not None:
            name = signal.Signals(self.signum).name
            how = ", ".join(bad) if bad else \
                "every trainer left (exit 0)"
            return 128 + self.signum, "stopped by %s: %s" % (name, how)
        return 0, "%d trainer%s finished (exit 0), %d restart%s" % (
            self.o.nproc, "" if self.o.nproc == 1 else "s", restarts,
            "" if restarts == 1 else "s")


def _kill(proc, s):
    try:
        proc.send_signal(s)
    except OSError:
        pass


def _drain(fd):
    try:
        while os.read(fd, 4096):
            pass
    except OSError:
        pass


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        o, cmd = parse_args(argv)
    except Usage as e:
        say(str(e))
        return 2
    la = Launcher(o, cmd)
    la.install_signals()
    for t in la.trainers:
        if not la.spawn(t):
            say(la.reason)
            la.stop()
            break
    la.loop()
    rc, why = la.outcome()
    say(why)
    return rc


if __name__ == "__main__":
    sys.exit(main())
