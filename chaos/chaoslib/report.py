"""The report (one row per fault kind, the notes, the checkpoint,
accuracy and step lines, every violation, the closing key=value lines)
and the loss plot."""

import glob
import os
import shutil
import subprocess

from chaoslib.cluster import read_text
from chaoslib.kinds import BY_NAME, TABLE


def stats(xs):
    """median, p95 and max as chaos.sh's awk took them; '-' for none."""
    v = sorted(xs)
    n = len(v)
    if n == 0:
        return "-", "-", "-"
    return (str(v[int((n + 1) / 2) - 1]), str(v[int(n * 0.95 + 0.999) - 1]),
            str(v[-1]))


def plot_loss(run, outdir):
    """Loss against step (the hash logs' loss field, averaged over bins
    of STEPS/500 steps), the faults marked where they were injected:
    (the PNG's path, a note); one of them empty."""
    cl, steps, seed = run.cl, run.cfg.steps, run.cfg.seed
    if shutil.which("gnuplot") is None:
        return "", ("no loss plot: gnuplot is not installed (make deps "
                    "installs gnuplot-nox)")
    b = max(steps // 500, 1)
    s, n = {}, {}
    for p in sorted(glob.glob(cl.path("hash-*.log"))):
        for line in read_text(p).splitlines():
            x = line.split()
            if len(x) >= 14 and x[0] == "step" and x[12] == "loss":
                try:
                    k, loss = int(x[1]) // b, float(x[13])
                except ValueError:
                    continue
                s[k] = s.get(k, 0.0) + loss
                n[k] = n.get(k, 0) + 1
    if not s:
        return "", "no loss plot: no loss in the hash logs"
    with open(cl.path("loss.dat"), "w") as f:
        for k in sorted(s):
            f.write("%g %g\n" % (k * b + b / 2, s[k] / n[k]))
    with open(cl.path("marks.dat"), "w") as f:
        for i, (step, kind) in enumerate(run.marks, 1):
            f.write("%d %s %d\n" % (step, kind, i))
    T = cl.T
    gp = f'''set terminal pngcairo size 1200,600 noenhanced font ",10"
set output "{T}/loss.png"
set title "chaos seed {seed}: loss against step ({run.cfg.nodes} nodes, {steps} steps; the faults where they were injected)"
set xlabel "step"
set ylabel "training loss (mean over {b}-step bins, all trainers)"
set logscale y
set xrange [0:{steps}]
set grid
set key top right
plot "{T}/loss.dat" using 1:2 with lines lw 2 lc rgb "#1f77b4" title "loss", \\
     "{T}/marks.dat" using 1:(0):(0):(1e9) with vectors nohead dt 2 lc rgb "#d62728" title "fault", \\
     "{T}/marks.dat" using 1:(1):2 with labels rotate by 90 left offset 0.6,0 tc rgb "#d62728" notitle
'''
    with open(cl.path("gnuplot.log"), "wb") as out:
        subprocess.run(["gnuplot"], input=gp.encode(), stdout=out,
                       stderr=subprocess.STDOUT)
    png = cl.path("loss.png")
    dst = os.path.join(outdir, "chaos-%s-loss.png" % seed)
    try:
        if os.path.getsize(png) > 0:
            os.makedirs(outdir, exist_ok=True)
            shutil.copyfile(png, dst)
            return dst, ""
    except OSError:
        pass
    tail = (read_text(cl.path("gnuplot.log")).splitlines() or [""])[-1]
    return "", "no loss plot: gnuplot failed (%s)" % tail


def table(run):
    out = ["  %-13s %8s %9s %10s %8s %8s  %s" % (
        "kind", "injected", "recovered", "median_ms", "p95_ms", "max_ms",
        "skipped")]
    for k in TABLE:
        name = k.name
        if name not in run.inj and name not in run.skip:
            continue
        med, p95, mx = stats(run.times.get(name, []))
        out.append("  %-13s %8s %9s %10s %8s %8s  %s" % (
            name, run.inj.get(name, 0), run.rec.get(name, 0), med, p95, mx,
            run.skip.get(name, "")))
    out.append(
        "  (time: from the fault to the first step completed on another "
        "node in a later view generation than any step logged before the "
        "fault (kill, hang, link_down, scale_down), or for the others the "
        "first one that was not in flight at the fault, from the hash logs'"
        " t_ms; daemon_restart, rolling_restart: until the restarted node's "
        "own trainer completes a step in a later generation; job_restart: "
        "to the restarted job's first step; etcd_kill: the longest time "
        "without a step until one after etcd's return)")
    return out


def notes(run):
    """The lines below the table, in chaos.sh's order."""
    out = []
    for name in ("kill_trainer", "job_restart", "daemon_restart",
                 "trainer_close"):
        out += BY_NAME[name].notes(run)
    conts = run.cl.stray_conts()
    if conts:
        out.append("  stops: %d SIGCONT(s) from elsewhere ended a fault's "
                   "SIGSTOP early (the kernel's, when the process group that"
                   " started the harness was orphaned, or anyone's): stopped"
                   " again" % conts)
    # bash listed its associative array in this order
    for name in sorted(run.grew, key=["kill_adjacent",
                                      "scale_down"].index):
        out.append("  %s: too few nodes for it: %d node(s) started first, "
                   "each awaited to its first step (not faults)"
                   % (name, run.grew[name]))
    for name in ("daemon_etcd", "fd_exhaust", "slow_disk"):
        out += BY_NAME[name].notes(run)
    if run.ckpt_line:
        out.append("  checkpoints: " + run.ckpt_line)
    out += BY_NAME["etcd_kill"].notes(run)
    return out


def report(run, outdir, plot, plot_note):
    cfg, cl = run.cfg, run.cl
    out = ["chaos report: seed %s, %d nodes, %d steps, %d s, %s" % (
        cfg.seed, cfg.nodes, cfg.steps, (run.end_ms - cl.t0) // 1000,
        "namespaces" if cl.netns else "loopback")]
    out += table(run) + notes(run)
    out.append("  final accuracy: %s(reference %s, tolerance %s)"
               % (run.accs or "none", run.ref_acc, 0.02))
    out.append("  steps: reached %d of %d; lost %d; hash mismatches %d; "
               "unexpected exits %d" % (run.maxs + 1, cfg.steps, run.lost,
                                        run.dup, run.crashes))
    if run.stale:
        out.append("  %s: %d step(s) completed by an evicted replica whose "
                   "hash differs from the job's (the replica was overwritten"
                   " when it rejoined; a daemon gap, see chaos/README.md):"
                   % ("FAILED" if cfg.strict else "WARNING (CHAOS_STRICT=0)",
                      run.stale))
        out += ["    " + x for x in run.stale_lines]
    if plot:
        out.append("  loss plot: %s (report: %s/chaos-%s.txt)"
                   % (plot, outdir, cfg.seed))
    if plot_note:
        out.append("  " + plot_note)
    out += ["  VIOLATION: " + m for m in run.fail]
    if not run.fail:
        out.append("  all checks passed")
    if cfg.keep:
        out.append("  logs: %s (kept)" % cl.T)
    elif run.fail:
        out.append("  logs removed; rerun with --keep to keep them")
    t = run.times
    kmed = stats(t.get("kill_daemon", []) + t.get("kill_trainer", []))[0]
    hmax = stats(t.get("hang_daemon", []) + t.get("link_down", []))[2]
    out.append("chaos: stale_steps=%d" % run.stale)
    out.append("chaos: faults=%d recovered=%d lost_steps=%d duplicated_steps"
               "=%d hangs=%d kill_recovery_median_ms=%s hang_recovery_max_ms"
               "=%s" % (run.nfaults, run.nrec, run.lost, run.dup, run.hangs,
                        kmed, hmax))
    return "".join(x + "\n" for x in out)
