"""The checks after the run: the newest (and every older complete)
checkpoint restores, the exit status of every process started, the hash
logs (lost, duplicated and stale steps), the steps a restarted job
replayed, the final accuracy. Violations go to run.fail."""

import glob
import os
import re
import shutil
import signal
import subprocess
import time

from chaoslib.cluster import read_text

TOL = 0.02   # final accuracy vs the reference run


def hashes_of_step(cl, s):
    """The hashes logged for step s, sorted, each followed by a space."""
    hs = set()
    for p in sorted(glob.glob(cl.path("hash-*.log"))):
        for line in read_text(p).splitlines():
            x = line.split()
            if len(x) >= 10 and x[0] == "step" and x[1] == str(s):
                hs.add(x[9])
    return "".join(h + " " for h in sorted(hs))


def verify_ckpt(run, step, root=None):
    """Restore a checkpoint the way a restarted job does, on a standalone
    ringd whose checkpoint directory points at root (default the job's),
    with a trainer that stops right at the restored step: (the step
    restored, the restored parameters' hash), '' where none."""
    cl, procs, B = run.cl, run.cl.procs, run.cfg.build
    vd, sock = cl.path("verify"), cl.path("verify.sock")
    shutil.rmtree(vd, ignore_errors=True)
    if os.path.exists(sock):
        os.unlink(sock)
    os.makedirs(vd)
    os.symlink(root or cl.ckjob, os.path.join(vd, "standalone"))
    env = dict(os.environ, UCX_NET_DEVICES="lo", UCX_WARN_UNUSED_ENV_VARS="n")
    dp = procs.start([os.path.join(B, "ringd"), "--standalone", "--socket",
                      sock, "--trainers", "1", "--metrics", "off",
                      "--ckpt-interval", "100000000", "--ckpt-dir", vd],
                     cl.path("verify-ringd.log"), "daemon verify", env=env,
                     append=False)
    for _ in range(250):
        if os.path.exists(sock):
            break
        time.sleep(0.02)
    if os.path.exists(sock):
        tp = procs.start([os.path.join(B, "examples/trainer"), "--socket",
                          sock, "--cpu", "--steps", str(step)],
                         cl.path("verify-trainer.log"), "trainer verify",
                         append=False)
        if not procs.wait_exit(tp, 600, 0.05):
            procs.kill_reap(tp)
    procs.signal(dp, signal.SIGTERM)
    if not procs.wait_exit(dp, 200, 0.05):
        procs.kill_reap(dp)
    out = read_text(cl.path("verify-trainer.log"))
    vs = re.search(r"^joined at step ([0-9]*): parameters restored$", out,
                   re.M)
    vh = re.search(r"^final: test_accuracy [0-9.]* hash ([0-9a-f]*)$", out,
                   re.M)
    return (vs.group(1) if vs else ""), (vh.group(1) if vh else "")


def check_newest(run, cstep):
    cl = run.cl
    vstep, vhash = verify_ckpt(run, cstep)
    want = hashes_of_step(cl, cstep - 1)
    line = "newest step %d" % cstep
    if vstep != str(cstep):
        last = [x for x in read_text(cl.path("verify-ringd.log")
                                     ).splitlines()
                if re.search("checkpoint|error", x, re.I)]
        run.ckpt_bad.append(
            "the newest checkpoint (step %d) did not restore on a standalone"
            " ringd (restored: %s; see verify-*.log): %s"
            % (cstep, vstep or "nothing", last[-1] if last else ""))
    elif not vhash or (" %s " % vhash) not in (" %s " % want):
        run.ckpt_bad.append(
            "the checkpoint of step %d restored parameters with hash %s, "
            "not the job's after step %d (%s)"
            % (cstep, vhash or "?", cstep - 1, want or "not logged"))
    else:
        line += (" restored on a standalone ringd, parameters hash %s = the"
                 " job's after step %d" % (vhash, cstep - 1))
    if run.df_freed is not None and cstep <= run.df_freed:
        run.ckpt_bad.append("no checkpoint completed after the disk was "
                            "freed at step %d (newest: %d)"
                            % (run.df_freed, cstep))
    return line


def check_older(run, cstep):
    """Every older complete checkpoint (the 8 newest) restores too, each
    with only the steps up to it in view (a delta needs its bases)."""
    cl = run.cl
    older = [s for s in cl.ckpt_steps() if s != cstep][-8:]
    bad = []
    for st in older:
        vr = cl.path("vroot-%d" % st)
        os.makedirs(vr, exist_ok=True)
        for d in sorted(glob.glob(os.path.join(cl.ckjob, "step-*"))):
            ds = os.path.basename(d)[len("step-"):]
            if ds.isdigit() and int(ds) <= st:
                os.symlink(d, os.path.join(vr, os.path.basename(d)))
        vstep, vhash = verify_ckpt(run, st, vr)
        want = hashes_of_step(cl, st - 1)
        if vstep != str(st) or (" %s " % (vhash or "x")) not in \
                (" %s " % want):
            m = re.search(r"step [0-9]* is not restorable",
                          read_text(cl.path("verify-ringd.log")))
            bad.append("step %d (restored: %s%s)" % (
                st, vstep or "nothing", "; " + m.group(0) if m else ""))
        shutil.rmtree(vr, ignore_errors=True)
    if not older:
        return "; no older complete one to check"
    if not bad:
        return "; the %d older complete ones restore too" % len(older)
    strict = run.cfg.strict
    if strict:
        run.ckpt_bad.append("%d complete checkpoints do not restore: %s"
                            % (len(bad), " ".join(bad)))
    return "; %s: %d of the %d older complete ones do not restore: %s" % (
        "FAILED" if strict else "WARNING (CHAOS_STRICT=0)", len(bad),
        len(older), " ".join(bad))


def check_ckpts(run):
    """The checkpoints: line of the report ('' with checkpoints off)."""
    cl = run.cl
    if run.cfg.ckpt_every == 0:
        return ""
    cstep = cl.newest_ckpt()
    fails = cl.ckpt_failures()
    if cstep < 0:
        run.ckpt_bad.append("no complete checkpoint at the end of the job")
        line = "none complete"
    else:
        line = check_newest(run, cstep)
    line += check_older(run, cstep)
    return line + "; %d checkpoint write failures logged" % fails


def check_statuses(run):
    """Every process started, etcd aside, must have ended as expected."""
    procs, fail = run.cl.procs, run.fail
    for p in procs.pids:
        role = procs.role[p]
        if role == "etcd":
            continue
        if procs.alive(p):
            fail.append("%s (pid %d) still running at the end" % (role, p))
            run.crashes += 1
            procs.signal(p, signal.SIGKILL)
        rc, want = procs.wait(p), procs.expect[p]
        if (want, rc) in (("killed", 137), ("ok", 0), ("drained", 0),
                          ("restarted", 75)) or want == "crashed":
            continue
        if want == "killed":
            if role.split()[0] == "trainer" and rc < 128:
                continue
            fail.append("%s (pid %d): status %d, expected SIGKILL"
                        % (role, p, rc))
        else:
            fail.append("%s (pid %d): exit status %d (%s expected)"
                        % (role, p, rc, want))
        run.crashes += 1


def stop_etcd(run):
    cl = run.cl
    pids = cl.etcd_pids() if run.cfg.etcd3 else cl.single_etcd
    for p in pids:
        cl.procs.signal(p, signal.SIGTERM)
    for p in pids:
        cl.procs.wait(p)


def check_namespaces(run):
    cl = run.cl
    if not cl.netns:
        return
    for k in range(1, cl.maxslot + 1):
        r = subprocess.run(["ip", "netns", "pids", cl.ns(k)], text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        left = "".join(x + " " for x in r.stdout.split())
        if left:
            run.fail.append("processes left in %s: %s" % (cl.ns(k), left))


def _parse(path):
    """The `step` lines of a hash log, split."""
    return [x for x in (line.split() for line in
                        read_text(path).splitlines())
            if len(x) >= 12 and x[0] == "step"]


def _int(s, default=0):
    try:
        return int(s)
    except ValueError:
        return default


def check_hashes(run):
    """Per file the last line per step wins; per step every replica of
    the newest generation must have the same hash (else duplicated), an
    older generation's line with another hash is an evicted replica that
    completed a step the job redid without it (stale, listed in
    T/stale.txt), and every step 0..STEPS-1 must be there (else lost). A
    job_restart's killed incarnation is cut at the resume step. Sets
    run.lost, dup, stale, maxs."""
    cl = run.cl
    cut = {}
    for _, c, _, old, _ in run.restarts:
        for k in old:
            cut[str(k)] = max(c, 0)
    rows = []
    for path in sorted(glob.glob(cl.path("hash-*.log"))):
        name = os.path.basename(path)
        k = name[len("hash-"):-len(".log")]
        last = {}
        for x in _parse(path):
            s = _int(x[1])
            if k not in cut or s < cut[k]:
                last[s] = (x[9], _int(x[3]))
        rows += [(s, h, g, name) for s, (h, g) in last.items()]
    rows.sort(key=lambda r: (r[0], r[2], "%d %s %d %s" % r))
    top, th, dup, m = {}, {}, set(), None
    for s, h, g, _ in rows:
        if s not in top or g > top[s]:
            top[s], th[s] = g, ""
        if g == top[s]:
            if th[s] == "":
                th[s] = h
            elif th[s] != h:
                dup.add(s)
        if s > (m if m is not None else 0):
            m = s
    stale = ["step %d: %s (gen %d) hash %s, gen %d hash %s"
             % (s, f, g, h, top[s], th[s])
             for s, h, g, f in rows if g < top[s] and h != th[s]]
    with open(cl.path("stale.txt"), "w") as f:
        f.writelines(x + "\n" for x in stale)
    run.stale_lines = stale
    run.lost = sum(1 for s in range(run.cfg.steps) if s not in th)
    run.dup, run.stale = len(dup), len(stale)
    run.maxs = -1 if m is None else m


def _newest_lines(paths, lo, hi):
    """step -> (gen, hash, world) of the newest generation's last line,
    over the `step` lines of paths with lo <= step <= hi."""
    out = {}
    for p in paths:
        for x in _parse(p):
            s = _int(x[1])
            if lo <= s <= hi:
                g = _int(x[3])
                if s not in out or g >= out[s][0]:
                    out[s] = (g, x[9], x[7])
    return out


def check_replay(run, restart, replay):
    """A job restart resumed at the newest checkpoint's step (0 without
    one), and the steps it redid have the hashes they had before where
    the world size is the same (up to the first step done at another)."""
    cl = run.cl
    _, c, rpre, old, new = restart
    want = max(c, 0)
    of = [p for p in (cl.path("hash-%s.log" % k) for k in old)
          if os.path.isfile(p)]
    nf = [p for p in (cl.path("hash-%s.log" % k) for k in new)
          if os.path.isfile(p)]
    steps = [_int(x[1]) for p in nf for x in _parse(p)]
    first = str(min(steps)) if steps else ""
    if first != str(want):
        run.fail.append("job_restart: the job resumed at step %s, the newest"
                        " complete checkpoint at the kill was step %d"
                        % (first or "never", c))
    rx = re.compile("^joined at step %d: parameters restored" % want)
    rst = sum(1 for p in sorted(glob.glob(cl.path("trainer-*.log")))
              for x in read_text(p).splitlines() if rx.match(x))
    o, n = _newest_lines(of, want, rpre), _newest_lines(nf, want, rpre)
    cmp = bad = otherw = 0
    switched = False
    for s in range(want, rpre + 1):
        if s not in o or s not in n:
            continue
        if o[s][2] != n[s][2] or switched:
            otherw += 1
            switched = True
            continue
        cmp += 1
        if o[s][1] != n[s][1]:
            bad += 1
            if bad <= 3:
                replay.append("step %d: %s before, %s after"
                              % (s, o[s][1], n[s][1]))
    run.replayed += cmp
    run.replay_bad += bad
    run.restart_lines.append(
        "job_restart: checkpoint step %d, last step before the kill %d; "
        "resumed at step %s (%d trainers restored); %d steps replayed with "
        "the same world size, %d with another hash%s"
        % (c, rpre, first or "never", rst, cmp, bad,
           ", %d not compared (other world size)" % otherw if otherw
           else ""))


def check_accuracy(run):
    cl, accs = run.cl, set()
    for k in run.nodes.live:
        for m in re.finditer(r"^final: test_accuracy ([0-9.]*)",
                             read_text(cl.path("trainer-%s.log" % k)),
                             re.M):
            accs.add(m.group(1))
    run.accs = "".join(a + " " for a in sorted(accs))
    if not accs:
        run.fail.append("no trainer printed a final accuracy")
    ref = run.ref_acc
    for a in sorted(accs):
        if not abs(float(a or 0) - float(ref or 0)) <= TOL:
            run.fail.append("final accuracy %s is not within %s of the "
                            "reference %s" % (a, TOL, ref))


def check_all(run):
    """Everything after the job, in the order chaos.sh checked it."""
    run.ckpt_line = check_ckpts(run)
    run.fail = (run.ckpt_bad + run.evicted + run.other_bad +
                run.nodes.crash_notes + run.nodes.restart_bad)
    run.crashes = len(run.nodes.crash_notes)
    if run.fail_early:
        run.fail.append("faults skipped because the job neared its end")
    check_statuses(run)
    stop_etcd(run)
    check_namespaces(run)
    check_hashes(run)
    run.replayed = run.replay_bad = 0
    run.restart_lines, replay = [], []
    for r in run.restarts:
        check_replay(run, r, replay)
    steps, f = run.cfg.steps, run.fail
    if run.replay_bad:
        f.append("%d steps replayed after a job restart with another hash "
                 "than before the kill (same world size): %s"
                 % (run.replay_bad, "".join(x + ";" for x in replay[:3])))
    if run.maxs < steps - 1:
        f.append("the job reached step %d, not %d" % (run.maxs + 1, steps))
    if run.lost:
        f.append("%d steps logged by no trainer" % run.lost)
    if run.etcd_fenced and not run.cfg.etcd3:
        f.append("daemons fenced themselves through an etcd outage with "
                 "every member healthy (per kill:%s)"
                 % "".join(" %d" % n for n in run.etcd_fenced))
    if run.stale and run.cfg.strict:
        f.append("%d steps completed by an evicted replica with another hash"
                 % run.stale)
    if run.dup:
        f.append("%d steps whose hash differs between replicas" % run.dup)
    if run.hangs:
        f.append("%d hangs" % run.hangs)
    if run.nrec != run.nfaults:
        f.append("%d faults not recovered" % (run.nfaults - run.nrec))
    check_accuracy(run)
