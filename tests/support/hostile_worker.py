"""hostile_worker.py GO - one rank of tests/test_hostile.sh's job: it forms the job (hoop.init
opens no data connection; a barrier of 6 ranks connects ranks 0-2 to 3-5 only by way of others),
prints its pid and open descriptors, waits for the file GO (meanwhile the attacker's connections
queue on the listeners), then runs an all-to-all (every pair connects: ranks 3-5 accept 0-2 behind
the strangers) and allreduces, checks them, and prints how long that took
and its descriptors before hoop.init and after finalize."""
import array
import os
import sys
import time

import hoop

fds_before = len(os.listdir("/proc/self/fd"))
comm = hoop.init()
r, n = comm.rank, comm.size
comm.barrier()
print("PID", r, os.getpid(), len(os.listdir("/proc/self/fd")), flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
start = time.time()
send = array.array("i", [r * 100 + d for d in range(n)])
recv = array.array("i", [0] * n)
comm.alltoall(send, recv)
ok = list(recv) == [s * 100 + r for s in range(n)]
for _ in range(20):
    a = array.array("d", [float(r + 1)] * 1001)
    comm.allreduce(a)
    ok = ok and all(x == n * (n + 1) / 2 for x in a)
took = time.time() - start
comm.finalize()
# Descriptors: before hoop.init and after finalize (a stranger's connections still waiting for a
# handshake are held, 64 at most, until the rank's next accept or its finalize).
print("DONE", r, "ok" if ok else "WRONG", "%.3f" % took, fds_before, len(os.listdir("/proc/self/fd")),
      flush=True)
