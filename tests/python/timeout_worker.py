"""One rank of the torch.distributed timeout cases (tests/test_torch.sh, 3 ranks, HOOP_TIMEOUT=2 in
the environment): issue 59's barrier against a rank 0 that is late, with the times scaled down
(400 s of lateness and timeouts of 10 min and 60 s become 4 s and 8 s, and 8 s and 3 s).

    timeout_worker.py pass   init_process_group(timeout=8 s): rank 0 sleeps 4 s before the
                             barrier, longer than HOOP_TIMEOUT; every rank passes it. A new_group
                             of timeout 1 s has its own (the default group keeps 8 s).
    timeout_worker.py fail   init_process_group(timeout=3 s), rank 0 sleeps 8 s: ranks 1 and 2
                             raise within 3 to 6 s, naming rank 0 (or, in the same moment, the
                             other, which waits on rank 0 itself; at least one names rank 0).
                             torch's store takes the same timeout to connect, which 1 s would
                             make too short on a busy host.
    timeout_worker.py wait   rank 0 sleeps 3 s: on the others, Work.wait(timeout=1 s) of an async
                             barrier raises hoop.Timeout after about 1 s, and a plain wait then
                             completes once rank 0 comes.

Each rank prints "PASS <case>: ..." or "FAIL <case>: ...".
"""

import datetime
import signal
import sys
import time

import torch.distributed as dist

import hoop
import hoop.torch  # noqa: F401 - registers the backend

case = sys.argv[1]
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # report what was seen, as fail_worker.py does
seconds = {"pass": 8, "fail": 3, "wait": 30}[case]
dist.init_process_group("hoop", timeout=datetime.timedelta(seconds=seconds))
rank = dist.get_rank()


def verdict(ok, what):
    print("%s %s: rank %d: %s" % ("PASS" if ok else "FAIL", case, rank, what), flush=True)


if case == "pass":
    group = dist.new_group([0, 1, 2], timeout=datetime.timedelta(seconds=1))
    start = time.monotonic()
    if rank == 0:
        time.sleep(4)
    try:
        dist.barrier()
        took = time.monotonic() - start
        timeouts = (dist.group.WORLD._comm.timeout, group._comm.timeout)
        verdict((rank == 0 or took >= 3.5) and timeouts == (8.0, 1.0),
                "the barrier passed after %.1f s; timeouts %s" % (took, timeouts))
    except Exception as err:  # noqa: BLE001
        verdict(False, "%s: %s" % (type(err).__name__, err))
elif case == "fail":
    start = time.monotonic()
    if rank == 0:
        time.sleep(8)
    try:
        dist.barrier()
        verdict(rank == 0, "the barrier passed after %.1f s" % (time.monotonic() - start))
    except Exception as err:  # noqa: BLE001
        took = time.monotonic() - start
        if rank == 0:
            verdict(True, "failed too, after the others: %s" % err)
        else:
            # A rank that waits on one that itself waits on rank 0 may time out in the same
            # moment and blame it (nothing tells a silent peer from a stuck one): rank 0 or that
            # one; tests/test_torch.sh wants rank 0 named by at least one rank.
            named = "rank 0" in str(err) or "rank %d" % (3 - rank) in str(err)
            verdict(3.0 <= took <= 6.0 and named,
                    "failed after %.1f s%s: %s: %s" % (took, ", naming rank 0" if "rank 0" in
                                                       str(err) else "", type(err).__name__, err))
elif case == "wait":
    if rank == 0:
        time.sleep(3)
        dist.barrier()
        verdict(True, "came late")
    else:
        work = dist.barrier(async_op=True)
        start = time.monotonic()
        try:
            work.wait(timeout=datetime.timedelta(seconds=1))
            verdict(False, "Work.wait(1 s) returned though rank 0 sleeps 3 s")
        except hoop.Timeout as err:
            took = time.monotonic() - start
            work.wait()
            done = time.monotonic() - start
            verdict(0.9 <= took <= 2.5 and done >= 1.5,
                    "Work.wait(1 s) raised after %.1f s (%s), then the barrier completed at %.1f s"
                    % (took, err, done))
dist.destroy_process_group() if case != "fail" else None
