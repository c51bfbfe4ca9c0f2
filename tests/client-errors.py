"""client-errors.py - provoke each documented exception class of the Python
binding against real daemons and check the class and its code.

    RINGD_LIB=build/libringd.so /usr/bin/python3 tests/client-errors.py \
        FAKE_SOCK FAKE_PID KILL_SOCK KILL_PID

FAKE_SOCK: a ringd with the fake backend whose first collective of step 2
is broken by a view change; it is SIGTERMed here (drain). KILL_SOCK: a
ringd SIGKILLed here in the middle of a step. Prints one "ok NAME" line
per check and exits 0 only when all passed.
"""
import os
import signal
import sys

import numpy as np

import ringd


def expect(name, cls, code, fn):
    """fn() must raise exactly cls (not a subclass, not a parent) with
    .code == code."""
    try:
        fn()
    except ringd.Error as e:
        if type(e) is not cls or e.code != code:
            sys.exit("%s: got %s code %d (%s), want %s code %d" %
                     (name, type(e).__name__, e.code, e, cls.__name__,
                      code))
        print("ok %s: %s" % (name, e))
        return
    sys.exit("%s: nothing raised, want %s" % (name, cls.__name__))


def main():
    fake_sock, fake_pid, kill_sock, kill_pid = sys.argv[1:5]
    fake_pid, kill_pid = int(fake_pid), int(kill_pid)

    expect("connect", ringd.Error, ringd.ENODAEMON,
           lambda: ringd.Client(socket=fake_sock + ".absent"))
    for cls in (ringd.Reshape, ringd.Disconnected, ringd.Shutdown,
                ringd.Fenced):
        if not issubclass(cls, ringd.Error):
            sys.exit("%s is no ringd.Error" % cls.__name__)

    c = ringd.Client(socket=fake_sock)
    params = c.buffer(16, np.float32)
    grads = c.buffer(16, np.float32)
    c.state(params)
    expect("allreduce before step_begin", ringd.Error, ringd.ESTATE,
           lambda: c.allreduce(grads))
    v = c.step_begin()
    expect("array outside the shared buffers", ringd.Error, ringd.EINVAL,
           lambda: c.allreduce(np.zeros(16, np.float32)))
    expect("non-contiguous array", ringd.Error, ringd.EINVAL,
           lambda: c.allreduce(grads[::2]))
    # Steps 0 and 1 complete; step 2's first collective meets the fake
    # view change.
    reshaped = None
    while reshaped is None and v.step < 10:
        grads[:] = 1.0
        try:
            c.allreduce(grads, "sum")
        except ringd.Reshape as e:
            reshaped = e
            break
        c.step_end()
        v = c.step_begin()
    if reshaped is None or reshaped.code != ringd.ERESHAPE or v.step != 2:
        sys.exit("reshape: want Reshape at step 2, got %r at step %d" %
                 (reshaped, v.step))
    print("ok reshape at step %d: %s" % (v.step, reshaped))

    # Drain: the step in progress may finish; the next step_begin raises.
    os.kill(fake_pid, signal.SIGTERM)
    shutdown = None
    for _ in range(1000):
        try:
            v = c.step_begin()
        except ringd.Shutdown as e:
            shutdown = e
            break
        c.allreduce(grads, "sum")
        c.step_end()
    if shutdown is None or shutdown.code != ringd.ESHUTDOWN:
        sys.exit("drain: no Shutdown from step_begin")
    print("ok shutdown: %s" % shutdown)
    c.close()

    k = ringd.Client(socket=kill_sock, auto_reconnect=False)
    kg = k.buffer(16, np.float32)
    k.step_begin()
    os.kill(kill_pid, signal.SIGKILL)
    expect("daemon killed mid-step", ringd.Disconnected,
           ringd.EDISCONNECTED, lambda: k.allreduce(kg, "sum"))
    k.close()
    print("all checks passed")


if __name__ == "__main__":
    main()
