#!/usr/bin/python3
"""A trainer for the ringrun tests (tests/test-ringrun.c), on the plain
ringd binding (numpy). It appends to DIR/tLOCAL_RANK.log:

  start restart=R pid=P NAME=VALUE...   the launcher's environment
  rR step S gen G world W hash H        each completed step
  final step S hash H                   the job's end (the stop file)
  stopped: MESSAGE                      ringd.Stopped / Shutdown
  closed                                the client closed (BYE sent)

and writes "hello from LOCAL_RANK n" to stdout and "err from LOCAL_RANK n"
to stderr. Every step allreduces (max) whether DIR/stop exists, so every
trainer ends at the same step. --fail-rank R: that trainer exits 3 after
its first step. --step-ms: time one step's work takes. --no-close:
leave the client open at exit (ringd closes it, under ringrun).
"""
import argparse
import hashlib
import os
import sys
import time

import numpy as np

import ringd

ENV = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "RINGD_SOCKET", "RINGD_JOB",
       "CUDA_VISIBLE_DEVICES", "RINGD_LAUNCHER", "RINGRUN_RESTART_COUNT")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--step-ms", type=float, default=20)
    ap.add_argument("--fail-rank", type=int)
    ap.add_argument("--no-close", action="store_true")
    o = ap.parse_args()
    me = int(os.environ.get("LOCAL_RANK", "-1"))
    restart = os.environ.get("RINGRUN_RESTART_COUNT", "?")
    log = open(os.path.join(o.dir, "t%d.log" % me), "a", buffering=1)
    log.write("start restart=%s pid=%d %s\n" % (restart, os.getpid(), " ".join(
        "%s=%s" % (k, os.environ.get(k, "-")) for k in ENV)))
    print("hello from LOCAL_RANK %d" % me)
    print("err from LOCAL_RANK %d" % me, file=sys.stderr)
    c = ringd.Client(name="ringrun_trainer")
    params = c.buffer(256, np.float32)
    grads = c.buffer(256, np.float32)
    flag = c.buffer(1, np.float32)
    params[:] = np.linspace(-1, 1, 256, dtype=np.float32)
    c.state(params)
    while True:
        try:
            v = c.step_begin()
        except ringd.Shutdown as e:
            log.write("stopped: %s\n" % e)
            break
        time.sleep(o.step_ms / 1000.0)      # the step's work
        grads[:] = np.sin(params * (v.rank + 1) + v.step)
        flag[0] = 1.0 if os.path.exists(os.path.join(o.dir, "stop")) else 0
        try:
            c.allreduce(grads, "avg")
            c.allreduce(flag, "max")
        except (ringd.Reshape, ringd.Disconnected, ringd.Fenced):
            continue
        params -= np.float32(0.01) * grads
        try:
            c.step_end()
        except ringd.Error:
            continue
        h = hashlib.blake2b(params.tobytes(), digest_size=8).hexdigest()
        log.write("r%s step %d gen %d world %d hash %s\n" %
                  (restart, v.step, v.generation, v.world, h))
        if flag[0] > 0:
            log.write("final step %d hash %s\n" % (v.step, h))
            break
        if me == o.fail_rank:
            log.write("failing with status 3\n")
            if not o.no_close:
                c.close()
            sys.exit(3)
    del params, grads, flag
    c.close()
    log.write("closed\n")


if __name__ == "__main__":
    main()
