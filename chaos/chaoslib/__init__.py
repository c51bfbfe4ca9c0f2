"""The chaos harness in Python: chaos/chaos.py is the entry point.

Modules, by concern: draw (the seeded generator and the fault plan),
procs (the processes the harness starts and their exit statuses), hashlog
(queries on the trainers' hash logs), cluster (hosts, etcd through
cluster.sh, the checkpoint file system, cleanup), nodes (daemons and
trainers), run (the driver: the fault loop and the recovery waits),
kinds (the table of fault kinds, one class each, in kinds_proc and
kinds_infra), checks (the end-of-run checks) and report (the report).
"""
