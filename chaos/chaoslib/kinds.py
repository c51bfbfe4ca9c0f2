"""The table of fault kinds. Each kind is one class (kinds_proc.py: the
processes' faults; kinds_infra.py: network, etcd, disk and restarts) with

  precondition(run)  None: it can be drawn now; (table reason, log
                     reason): skipped; False: the run stops (a node added
                     for it made no step)
  inject(run, v, r, fms, pre)
                     the fault on victim slot v (r: the plan's draw,
                     0..999) at fms, step pre, and the wait for its
                     recovery (run.record, run.until_step, or its own);
                     False stops the run
  notes(run)         its lines in the report, below the table
  new_generation     its recovery is the first step of a later view
                     generation (it takes a member out of the job)

Adding a kind: write its class, add one entry to TABLE (its place there
is its row in the report and its index in the seeded draw, so append it:
an entry put before others changes what every seed draws).
"""

from chaoslib import kinds_infra as ki
from chaoslib import kinds_proc as kp

TABLE = [
    kp.KillDaemon(), kp.KillTrainer(), kp.HangDaemon(), ki.LinkDown(),
    ki.PacketLoss(), ki.SlowLink(), kp.ScaleUp(), kp.ScaleDown(),
    ki.EtcdKill(), ki.DiskFull(), ki.JobRestart(), kp.SlowTrainer(),
    kp.HungTrainer(), kp.KillAdjacent(), kp.TrainerClose(),
    ki.DaemonEtcd(), kp.FdExhaust(), ki.SlowDisk(), ki.DaemonRestart(),
    ki.RollingRestart(),
]
ALL_KINDS = [k.name for k in TABLE]
BY_NAME = {k.name: k for k in TABLE}
# --quick plays only these, which recover the same way every time.
QUICK_KINDS = ["kill_daemon", "hang_daemon", "scale_up"]
