"""A chain of waits that times out (tests/test_python.sh, 3 ranks over shared memory): rank 0
comes 5 s late to a barrier; rank 2 (its communicator's timeout 2 s) gives up on rank 1, whose
dissemination step waits for rank 0; rank 1 (timeout 10 s) is alive and waiting, and its error
must name the rank it waits for, rank 0, not itself. Each rank prints "chain: rank R: ..."."""
import time

import hoop

comm = hoop.Communicator()
comm.timeout = {0: 30.0, 1: 10.0, 2: 2.0}[comm.rank]
if comm.rank == 0:
    time.sleep(5)
try:
    comm.barrier()
    print("chain: rank %d: passed" % comm.rank, flush=True)
except hoop.HoopError as err:
    print("chain: rank %d: %s" % (comm.rank, err), flush=True)
