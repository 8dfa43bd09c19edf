"""shm_fd_worker.py - a 6-rank job for tests/test_shm.sh's hostile hello: rank 3 prints its pid and
its open descriptors once the job has formed; rank 0 then waits 4 s before an all-to-all that
connects the pair 0-3 (the dissemination barrier of 6 ranks never joins them), so rank 3 sits in
its shared-memory listener meanwhile, where shm_hostile.py's connections queue ahead of rank 0's.
Rank 3 prints its descriptors again at the end."""
import os
import sys
import time

import hoop

comm = hoop.Communicator()
r = comm.rank
if r == 3:
    print("RANK3PID", os.getpid(), flush=True)
comm.barrier()
if r == 3:
    print("RANK3FDS before", len(os.listdir("/proc/self/fd")), flush=True)
if r == 0:
    time.sleep(4)
buf = bytearray(4 * comm.size)
comm.alltoall(buf, bytearray(len(buf)), dtype="int32")
comm.barrier()
if r == 3:
    print("RANK3FDS after", len(os.listdir("/proc/self/fd")), flush=True)
print("rank", r, "done", flush=True)
