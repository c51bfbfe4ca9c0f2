"""client-fenced.py - ringd.Fenced from the Python binding, for real.

    RINGD_LIB=build/libringd.so /usr/bin/python3 tests/client-fenced.py \
        SOCK ROLE

Two ring nodes run this, one trainer each, an allreduce per step, until
a step from 40 on that both nodes begin (world 2: the stopped node is
back). ROLE "stop" SIGSTOPs itself in step 5 before its allreduce (the
test then stops the other node's daemon and resumes this one) and redoes
the step alone after the other node's eviction. ROLE "fenced" is the
trainer of the stopped daemon: its step-5 allreduce must raise exactly
ringd.Fenced with code EFENCED once the daemon wakes past its lease; it
prints "ok fenced" and, as a trainer does, redoes the step once its node
is back in the job (step_begin waits for that).
"""
import os
import signal
import sys

import numpy as np

import ringd


def main():
    sock, role = sys.argv[1:3]
    c = ringd.Client(socket=sock)
    buf = c.buffer(16, np.float32)
    state = c.buffer(16, np.float32)
    c.state(state)
    stopped = fenced = False
    while True:
        v = c.step_begin()
        if v.step >= 40 and v.world == 2:
            break
        if role == "stop" and v.step == 5 and not stopped:
            stopped = True
            os.kill(os.getpid(), signal.SIGSTOP)
        buf[:] = 1.0
        try:
            c.allreduce(buf, "sum")
        except ringd.Reshape:
            if role == "fenced" and not fenced:
                sys.exit("step %d: Reshape, want Fenced" % v.step)
            continue
        except ringd.Error as e:
            if role == "fenced" and type(e) is ringd.Fenced and \
                    e.code == ringd.EFENCED and v.step == 5 and not fenced:
                print("ok fenced: %s" % e, flush=True)
                fenced = True
                continue
            sys.exit("step %d: %s code %d" % (v.step, type(e).__name__,
                                              e.code))
        state += buf
        c.step_end()
    c.close()
    if role == "fenced" and not fenced:
        sys.exit("no ringd.Fenced")


if __name__ == "__main__":
    main()
