"""A stranger on this host, at the data listeners of a job's ranks (tests/test_hostile.sh).

    hostile.py list KIND PID...        the listeners of the ranks with these pids, one a line
                                       (KIND tcp: listening TCP sockets, found through /proc;
                                       shm: abstract shared-memory sockets); run as their user
    hostile.py attack COUNT TARGET...  COUNT connections in all, spread over the targets (as
                                       list prints them), non-blocking: one in ten sends 64
                                       random bytes, the others say nothing. They stay open
                                       until a line comes on stdin (or it closes). Prints how
                                       many connected; any user may run it.
"""
import os
import socket
import sys



def tcp_targets(pid):
    inodes = set()
    for fd in os.listdir("/proc/%s/fd" % pid):
        try:
            link = os.readlink("/proc/%s/fd/%s" % (pid, fd))
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # LISTEN
                continue
            addr, port = f[1].split(":")
            if family == socket.AF_INET:
                ip = socket.inet_ntop(family, bytes.fromhex(addr)[::-1])
            else:
                raw = bytes.fromhex(addr)
                ip = socket.inet_ntop(family, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
            found.append((family, (ip, int(port, 16))))
    return found


def shm_targets(pid):
    found = []
    for line in open("/proc/net/unix").read().splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 8 and parts[-1].startswith("@hoop-shm-%s-" % pid):
            found.append((socket.AF_UNIX, "\0" + parts[-1][1:]))
    return found


def attack(count, targets):
    held, connected = [], 0
    for i in range(count):
        kind, _, where = targets[i % len(targets)].partition(":")
        if kind == "tcp":
            ip, _, port = where.rpartition(":")
            family, addr = (socket.AF_INET6 if ":" in ip else socket.AF_INET), (ip.strip("[]"), int(port))
        else:
            family, addr = socket.AF_UNIX, "\0" + where
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(addr)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            s.close()
            continue
        if i % 10 == 0:
            try:
                s.send(os.urandom(64))
            except OSError:
                pass
        held.append(s)
        connected += 1
    print("hostile: %d of %d connections to %d listeners, as uid %d"
          % (connected, count, len(targets), os.getuid()), flush=True)
    sys.stdin.readline()
    for s in held:
        s.close()


if sys.argv[1] == "list":
    for pid in sys.argv[3:]:
        if sys.argv[2] == "tcp":
            for family, (ip, port) in tcp_targets(pid):
                print("tcp:%s:%d" % ("[%s]" % ip if family == socket.AF_INET6 else ip, port))
        else:
            for _, name in shm_targets(pid):
                print("shm:%s" % name[1:])
else:
    attack(int(sys.argv[2]), sys.argv[3:])
