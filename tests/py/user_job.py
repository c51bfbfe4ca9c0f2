"""What the user-style scripts (user_cnn.py, user_lm.py) share: their
command line, their step log, the stop file and the checks the tests run
on the logs afterwards. Not part of what a user writes: a user's script
has its own logging; this is the tests' instrument.

Each trainer logs one line per step it completed:

    step S gen G rank R world W epoch E lr LR idx I,I,...

(idx: the whole global batch of the step, every rank's share), then at
the end "final digest D lr LR loss L step S". Under ringrun
(--log-dir DIR) the log is DIR/tLOCAL_RANK.log, appended to by a
replacement, and each process first logs "start pid=P".
"""
import argparse
import os


def parser(doc):
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--mode", default="ringd")
    ap.add_argument("--socket", help="default: $RINGD_SOCKET")
    ap.add_argument("--log", help="this trainer's log")
    ap.add_argument("--log-dir", help="log to DIR/t$LOCAL_RANK.log")
    ap.add_argument("--stop-file", help="holds the step to stop before")
    ap.add_argument("--pace-ms", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--check", nargs="+", metavar="LOG")
    ap.add_argument("--loss", nargs=3, metavar=("A", "B", "TOL"))
    return ap


def open_log(o):
    """The step log, opened for appending, with this process's pid."""
    path = o.log
    if path is None:
        path = os.path.join(o.log_dir,
                            "t%s.log" % os.environ.get("LOCAL_RANK", "0"))
    log = open(path, "a", buffering=1)   # whole lines, even at a crash
    log.write("start pid=%d\n" % os.getpid())
    log.flush()
    return log


def stop_limit(o):
    """elastic.run's steps=: the step in the stop file, else None."""
    def limit():
        try:
            with open(o.stop_file) as f:
                return int(f.read())
        except (OSError, ValueError, TypeError):
            return None
    return limit


def log_step(log, v, sampler, lr, pace_ms):
    glob = [i for sh in sampler.global_batch() for i in sh]
    log.write("step %d gen %d rank %d world %d epoch %d lr %r idx %s\n"
              % (v.step, v.generation, v.rank, v.world, sampler.epoch, lr,
                 ",".join(map(str, glob))))
    log.flush()
    if pace_ms:
        import time
        time.sleep(pace_ms / 1000.0)  # lets the test act mid-run


def check(logs, n):
    """Every completed epoch saw each of the n samples exactly once, and
    every trainer that logged a step logged the same samples and learning
    rate for it (a step redone on another view keeps both)."""
    steps, lrs = {}, {}
    for path in logs:
        for line in open(path):
            w = line.split()
            if not w or w[0] != "step":
                continue
            s, epoch, lr = int(w[1]), int(w[9]), w[11]
            idx = [int(i) for i in w[13].split(",")]
            assert steps.setdefault(s, (epoch, idx)) == (epoch, idx), \
                "step %d: another global batch in %s" % (s, path)
            assert lrs.setdefault(s, lr) == lr, "lr differs at step %d" % s
    missing = [s for s in range(max(steps) + 1) if s not in steps]
    assert not missing, "steps never logged: %s" % missing[:10]
    per = {}
    for s in sorted(steps):
        per.setdefault(steps[s][0], []).extend(steps[s][1])
    done = [e for e in per if e + 1 in per]
    for e in done:
        assert sorted(per[e]) == list(range(n)), "epoch %d" % e
    assert done, "no epoch completed"
    print("check: %d steps, epochs %s each sample exactly once, one lr per "
          "step" % (len(steps), done))


def loss_close(a, b, tol):
    """0 when the final losses logged in a and b are within tol."""
    la, lb = (float(open(p).read().split(" loss ")[-1].split()[0])
              for p in (a, b))
    print("final loss %.4f vs %.4f (tolerance %s)" % (la, lb, tol))
    return 0 if abs(la - lb) <= float(tol) else 1


def run_ref(o, data, model, opt, sched, loss_of, eval_loss, clip, seed):
    """--mode ref: one process on the same global batches as the job (the
    sampler's order for seed at --global), clipping at clip, no ringd;
    writes "final loss L lr LR" to --log."""
    import torch
    from ringd.torch.elastic import ElasticSampler
    s = ElasticSampler(data, batch_size=o.global_batch, seed=seed)
    for _ in range(o.steps):
        if s.done():
            s.set_epoch(s.epoch + 1)
        x, y = data[s.batch()]
        opt.zero_grad()
        loss_of(model, x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        s.commit()
    with open(o.log, "w") as f:
        f.write("final loss %.6f lr %r\n" % (eval_loss(model, data),
                                             opt.param_groups[0]["lr"]))


def main(doc, n, default_global, run_ringd, run_ref):
    """A script's command line: --check, --loss, --mode ref or ringd."""
    ap = parser(doc.split("\n")[0])
    ap.add_argument("--global", dest="global_batch", type=int,
                    default=default_global)
    o = ap.parse_args()
    if o.check:
        check(o.check, n)
    elif o.loss:
        return loss_close(*o.loss)
    elif o.mode == "ref":
        run_ref(o)
    else:
        run_ringd(o)
    return 0
