"""hostile_worker.py GO - one rank of tests/test_hostile.sh's job: it forms the job (hoop.init
opens no data connection; a barrier of 6 ranks connects ranks 0-2 to 3-5 only by way of others),
prints its pid and open descriptors, waits for the file GO (meanwhile the attacker's connections
queue on the listeners), then exchanges a message with the rank half the job away (ranks 3-5 accept 0-2 behind the
strangers), runs an all-to-all and allreduces, checks them, and prints how long that took
and its descriptors before hoop.init and after finalize."""
import array
import os
import sys
import time

import hoop

fds_before = set(os.listdir("/proc/self/fd"))
comm = hoop.init()
r, n = comm.rank, comm.size
comm.barrier()
print("PID", r, os.getpid(), len(os.listdir("/proc/self/fd")), flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
start = time.time()
# Ranks half the job apart exchange first: the pairs the barrier never joined connect now, each
# lower rank to its higher one, so that ranks 3-5 accept behind whatever waits at their listeners.
if n % 2 == 0:
    other = (r + n // 2) % n
    mine, theirs = array.array("i", [r]), array.array("i", [-1])
    if r < other:
        comm.send(mine, other)
        comm.recv(theirs, other)
    else:
        comm.recv(theirs, other)
        comm.send(mine, other)
    ok_pair = theirs[0] == other
else:
    ok_pair = True
send = array.array("i", [r * 100 + d for d in range(n)])
recv = array.array("i", [0] * n)
comm.alltoall(send, recv)
ok = ok_pair and list(recv) == [s * 100 + r for s in range(n)]
for _ in range(20):
    a = array.array("d", [float(r + 1)] * 1001)
    comm.allreduce(a)
    ok = ok and all(x == n * (n + 1) / 2 for x in a)
took = time.time() - start
comm.finalize()
# Descriptors: before hoop.init and after finalize (a stranger's connections still waiting for a
# handshake are held, 64 at most, until the rank's next accept or its finalize), and how many of
# those left are pipes: a rank that hosted the rendezvous keeps libuv's process-wide signal pipe (2
# descriptors, made once per process whatever the number of jobs).
fds_after = set(os.listdir("/proc/self/fd"))
pipes = 0
for fd in fds_after - fds_before:
    try:
        pipes += os.readlink("/proc/self/fd/" + fd).startswith("pipe:")
    except OSError:
        pass
# Peak resident memory (kB): a stranger's connections must cost a rank nothing it keeps.
peak = [l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print("MEM", r, peak, flush=True)
print("DONE", r, "ok" if ok else "WRONG", "%.3f" % took, len(fds_before), len(fds_after), pipes,
      flush=True)
