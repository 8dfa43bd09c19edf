"""shm_backlog_worker.py READY - a 4-rank job for tests/test_shm.sh (HOOP_SHM_BOARD=0, a short
timeout): rank 2 prints its pid and sleeps 15 s, away from its listener; rank 0 waits for the file
READY (shm_backlog.py made rank 2's listener queue full), then sends to rank 2, a pair the ring of
hoop_init did not connect, and prints how the send ended and after how long."""
import os
import sys
import time

import hoop

ready = sys.argv[1]
comm = hoop.Communicator()
r = comm.rank
if r == 2:
    print("RANK2PID", os.getpid(), flush=True)
    time.sleep(15)
elif r == 0:
    for _ in range(300):
        if os.path.exists(ready):
            break
        time.sleep(0.05)
    start = time.monotonic()
    try:
        comm.send(bytearray(64), 2)
        print("SEND-DONE after %.1f s" % (time.monotonic() - start), flush=True)
    except hoop.HoopError as err:
        print("SEND-FAILED after %.1f s: %s" % (time.monotonic() - start, err), flush=True)
