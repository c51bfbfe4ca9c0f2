#!/usr/bin/python3
# chaos/fd-flood.py - the fd_exhaust fault of chaos.sh.
#
#   fd-flood.py SOCKET SECONDS
#
# Connects to a ringd daemon's local socket over and over for SECONDS and
# holds every connection it gets, so the daemon runs out of descriptors
# (the harness starts the daemons with a low `ulimit -n`). A connect that
# finds the listen backlog full (the daemon stopped accepting) is retried
# after 10 ms. Then it closes them all and prints
#   flood: connected N, backlog full M times
# Its own descriptor limit is raised first (to 65536 as root, else the
# hard limit), so that the daemon meets its limit first; should the
# flooder run out all the same, it holds what it has to the end.
import errno
import resource
import socket
import sys
import time


def main():
    path, seconds = sys.argv[1], float(sys.argv[2])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (65536, 65536))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    held, full = [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError as e:
            # Out of descriptors ourselves: hold what we have to the end.
            print("flood: socket: %s after %d connections" % (e, len(held)),
                  flush=True)
            time.sleep(max(0, end - time.monotonic()))
            break
        s.setblocking(False)
        try:
            s.connect(path)
            held.append(s)
            continue
        except OSError as e:
            s.close()
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                print("flood: connect: %s" % e, flush=True)
                break
        full += 1
        time.sleep(0.01)
    for s in held:
        s.close()
    print("flood: connected %d, backlog full %d times" % (len(held), full),
          flush=True)


if __name__ == "__main__":
    main()
