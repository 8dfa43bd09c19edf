"""A stranger on this host, at the data listeners of a job's ranks (tests/test_hostile.sh).

    hostile.py list KIND PID...        the listeners of the ranks with these pids, one a line
                                       (KIND tcp: listening TCP sockets, found through /proc;
                                       shm: abstract shared-memory sockets); run as their user
    hostile.py attack COUNT TARGET...  COUNT connections in all, spread over the targets (as
                                       list prints them), non-blocking: one in ten sends 64
                                       random bytes, the others say nothing. They stay open
                                       until a line comes on stdin (or it closes). Prints how
                                       many connected; any user may run it.
    hostile.py rdzv HOST:PORT JOB SIZE RANK TOKEN-KNOWN [HEX...]
                                       forged requests at a rendezvous server (a hoopd or a
                                       rank 0 hosting it) while job JOB of SIZE ranks waits for
                                       rank RANK: HELLOs without the token's proof, with a made-up
                                       one, for another job, another size, with a 1 ms timeout,
                                       as a newcomer, bytes that are no message, a header that
                                       claims 4 GiB, an old version, a STATUS_REQ with a made-up
                                       proof, and each HEX (a real rank's HELLO, seen on the
                                       wire) replayed on a new connection. TOKEN-KNOWN 0 (the
                                       server has no token) leaves out the HELLOs that only a
                                       token can refuse (for JOB's missing rank). One line per
                                       attempt: "hostile-rdzv: NAME: refused (...)", or
                                       "ADMITTED" when a TABLE came back.
    hostile.py seen KIND FILE...       the messages of KIND (hello: the rendezvous HELLOs; tcp:
                                       data handshakes; shm: shared-memory hellos) that strace
                                       -xx saw a rank send, in hex, one a line: what someone on
                                       the wire would have seen
    hostile.py replay KIND HEX,HEX... TARGET...
                                       real ranks' data handshakes (KIND tcp: their bytes; shm:
                                       the bytes of a hello, sent again with a fresh sealed
                                       memfd), seen on the wire, each replayed to every target
                                       (as list prints them) and held open until a line comes
                                       on stdin; prints how many connections it made.
"""
import fcntl
import os
import re
import socket
import struct
import sys
import time

# The protocol's version as lib/proto/wire.h says (a stranger that speaks the current one gets
# past the header check, which is the point).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib", "proto",
                       "wire.h")) as header:
    VERSION = int(re.search(r"#define HOOP__WIRE_VERSION (\d+)", header.read()).group(1))
MAGIC = 0x484F4F50
HELLO, TABLE, ERROR, STATUS_REQ, STATUS, CHALLENGE = 1, 2, 3, 4, 5, 6


def message(kind, payload, version=VERSION, length=None):
    return struct.pack(">IHHI", MAGIC, version, kind,
                       len(payload) if length is None else length) + payload


def text(value):
    raw = value.encode()
    return struct.pack(">H", len(raw)) + raw


def hello(job, size, rank, timeout_ms=60000, proof=b"", addr="127.0.0.1:9"):
    return message(HELLO, text(job) + struct.pack(">IiI", size, rank, timeout_ms) +
                   text("stranger") + text(addr) + struct.pack(">H", len(proof)) + proof +
                   os.urandom(32) + os.urandom(32) +  # its challenge, its public key
                   struct.pack(">I", 0))  # flags


def answer(s, limit=3.0):
    """What the server said to a request: the first message after its CHALLENGE."""
    s.settimeout(limit)
    got = b""
    try:
        while True:
            while len(got) >= 12:
                _, _, kind, length = struct.unpack(">IHHI", got[:12])
                if len(got) < 12 + length:
                    break
                payload, got = got[12:12 + length], got[12 + length:]
                if kind == CHALLENGE:
                    continue
                if kind == ERROR:
                    code, n = struct.unpack(">IH", payload[:6])
                    return "refused (ERROR %d: %s)" % (code, payload[6:6 + n].decode(errors="replace"))
                return "ADMITTED (message type %d)" % kind if kind in (TABLE, STATUS) \
                    else "refused (message type %d)" % kind
            more = s.recv(65536)
            if not more:
                return "refused (closed)"
            got += more
    except socket.timeout:
        return "refused (no answer in %.0f s)" % limit
    except OSError as e:
        return "refused (%s)" % e.strerror


def rdzv(where, job, size, rank, token_known, replays):
    host, _, port = where.rpartition(":")
    size, rank = int(size), int(rank)
    bogus = os.urandom(32)
    attempts = [
        ("another job of 1 rank, 1 ms timeout", hello("stranger-%d" % os.getpid(), 1, 0, 1, bogus)),
        ("another size, 1 ms timeout", hello(job, size + 5, 0, 1, bogus)),
        ("a newcomer with a made-up proof", hello(job, 1, -2, 60000, bogus)),
        ("random bytes", os.urandom(64)),
        ("a header claiming 4 GiB", message(HELLO, b"", length=0xFFFFFFF0)),
        ("an old wire version", message(HELLO, b"\0" * 40, version=2)),
    ]
    if token_known == "1":  # without a token, the rank may join, and anyone may ask the status
        attempts += [
            ("a status request with a made-up proof",
             message(STATUS_REQ, struct.pack(">H", 32) + bogus)),
            ("rank %d without a proof" % rank, hello(job, size, rank)),
            ("rank %d with a made-up proof" % rank, hello(job, size, rank, 60000, bogus)),
            ("rank %d, 1 ms timeout" % rank, hello(job, size, rank, 1, bogus)),
            ("any rank with a made-up proof", hello(job, size, -1, 60000, bogus)),
        ]
    attempts += [("a real rank's HELLO, replayed", bytes.fromhex(h)) for h in replays]
    for name, data in attempts:
        s = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
        try:
            s.sendall(data)
        except OSError:
            pass
        print("hostile-rdzv: %s: %s" % (name, answer(s)), flush=True)
        s.close()


# How each kind begins on the wire: the rendezvous header of a HELLO (magic, this version, kind),
# the data handshakes' magics.
SEEN = {"hello": "%08x%04x%04x" % (MAGIC, VERSION, HELLO), "tcp": "54504f48", "shm": "53504f48"}


def seen(kind, files):
    want, found = SEEN[kind], []
    for name in files:
        for line in open(name, errors="replace"):
            for raw in re.findall(r'"((?:\\x[0-9a-f]{2})+)"', line):
                data = raw.replace("\\x", "")
                if data.startswith(want) and data not in found:
                    found.append(data)
    for data in found:
        print(data)


def replay(kind, hexes, targets):
    held = []
    for data in (bytes.fromhex(h) for h in hexes.split(",")):
        for target in targets:
            tkind, _, where = target.partition(":")
            if tkind != kind:
                continue
            if kind == "tcp":
                ip, _, port = where.rpartition(":")
                s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET,
                                  socket.SOCK_STREAM)
                s.settimeout(5)
                s.connect((ip.strip("[]"), int(port)))
                s.sendall(data)
            else:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(5)
                s.connect("\0" + where)
                memfd = os.memfd_create("hostile", os.MFD_ALLOW_SEALING)
                os.ftruncate(memfd, 1 << 16)
                fcntl.fcntl(memfd, fcntl.F_ADD_SEALS,
                            fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
                try:
                    socket.send_fds(s, [data], [memfd])
                except OSError:
                    pass
                os.close(memfd)
            held.append(s)
    print("hostile-replay: %d %s handshakes seen on the wire, sent again: %d connections, as uid %d"
          % (len(hexes.split(",")), kind, len(held), os.getuid()), flush=True)
    sys.stdin.readline()  # held until the job is over: the ranks read them when they next accept
    for s in held:
        s.close()


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
elif sys.argv[1] == "rdzv":
    rdzv(*sys.argv[2:7], sys.argv[7:])
elif sys.argv[1] == "seen":
    seen(sys.argv[2], sys.argv[3:])
elif sys.argv[1] == "replay":
    replay(sys.argv[2], sys.argv[3], sys.argv[4:])
else:
    attack(int(sys.argv[2]), sys.argv[3:])
