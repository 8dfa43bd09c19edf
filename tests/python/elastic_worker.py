"""A job that loses a rank and goes on, from Python: 3 ranks under hooprun --min-np 2; rank 1
kills itself after a few allreduces; ranks 0 and 2 catch the failure, shrink, and check an
allreduce on the 2-rank Communicator against the sum they expect; prints "elastic ok"."""
import os
import signal
import sys

import hoop

comm = hoop.init()
old_rank = comm.rank
data = bytearray(4 * 1001)
failure = None
try:
    for step in range(1000):
        if step == 5 and old_rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        values = memoryview(data).cast("i")
        for i in range(len(values)):
            values[i] = old_rank + 1
        comm.allreduce(data, dtype="int32")
except hoop.HoopError as error:
    failure = error
if failure is None:
    print("rank %d: FAIL: nothing failed" % old_rank)
    sys.exit(1)
survivors = comm.shrink()
comm.finalize()  # failed, and finalized as usual
values = memoryview(data).cast("i")
for i in range(len(values)):
    values[i] = old_rank + 1
survivors.allreduce(data, dtype="int32")
expected = 1 + 3  # old ranks 0 and 2
bad = [v for v in values if v != expected]
ok = (survivors.size == 2 and survivors.rank == (0 if old_rank == 0 else 1)
      and survivors.generation == 1 and not bad)
print("rank %d -> %d of %d, generation %d: %s (%s)" % (
    old_rank, survivors.rank, survivors.size, survivors.generation,
    "elastic ok" if ok else "FAIL", type(failure).__name__))
survivors.finalize()
sys.exit(0 if ok else 1)
