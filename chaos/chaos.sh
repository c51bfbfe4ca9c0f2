#!/usr/bin/env bash
# chaos/chaos.sh - seeded fault injection through a real training job.
#
#   chaos/chaos.sh [-s SEED] [-f FAULTS] [-n NODES] [--quick] [--keep]
#                  [--kinds a,b,c] [--plan] [--etcd3]
#
# The harness is chaos/chaos.py (Python 3.11, standard library only; its
# modules in chaos/chaoslib/, the fault kinds a table in kinds.py), run
# by Debian's interpreter: /usr/bin/python3, whatever `python3` is on
# PATH. Options, environment and report: chaos/README.md.
CHAOS_ARGV0=$0 exec /usr/bin/python3 "$(dirname "$0")/chaos.py" "$@"
