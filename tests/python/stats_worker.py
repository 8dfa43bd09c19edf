"""Finding the slow rank from Python (tests/test_python.sh, 3 ranks, HOOP_STATS_PERIOD=0.3):
rank 1 sleeps 20 ms before each allreduce for 3 s; every rank's Communicator.stats() must then
name rank 1 as the latest, late by 20 ms within 20%, and give the allreduces' calls and bytes,
the peers' entries and a share of time waiting (most of it on ranks 0 and 2, little on rank 1).
With torch (argument "torch"), the same through hoop.torch.stats() and the torch.distributed
backend's group. Each rank prints "stats: rank R: ok ..." or raises."""
import array
import sys
import time

import hoop

use_torch = len(sys.argv) > 1 and sys.argv[1] == "torch"
if use_torch:
    import torch
    import torch.distributed as dist
    import hoop.torch as hvd
    hvd.init()
    comm = hvd._job._live("stats_worker")
    dist.init_process_group("hoop")
else:
    comm = hoop.Communicator()
rank, size = comm.rank, comm.size
slow, delay = 1, 0.020
count = 257
steps = 0
began = time.monotonic()
while True:
    if rank == slow:
        time.sleep(delay)
    stop = 1.0 if rank == 0 and time.monotonic() - began > 3.0 else 0.0
    if use_torch:
        t = torch.full((count,), float(rank) + 0.25)
        t[-1] = stop
        hvd.allreduce_(t, op=hvd.Sum)
        done = t[-1].item() > 0
        assert abs(t[0].item() - (sum(range(size)) + 0.25 * size)) < 1e-5
    else:
        buf = array.array("f", [float(rank) + 0.25] * count)
        buf[-1] = stop
        comm.allreduce(buf)
        done = buf[-1] > 0
        assert abs(buf[0] - (sum(range(size)) + 0.25 * size)) < 1e-5
    steps += 1
    if done:
        break

stats = hvd.stats() if use_torch else comm.stats()
late = stats["slowest_late_s"]
assert stats["slowest_rank"] == slow, stats
assert abs(late - delay) <= 0.2 * delay, "rank %d: slow rank late %.4f s, not %.3f" % (
    rank, late, delay)
ar = stats["colls"]["allreduce"]
assert ar["calls"] == steps and ar["bytes"] == steps * count * 4, (ar, steps)
assert 0 <= stats["waited_s"] <= stats["in_calls_s"] <= stats["since_s"], stats
assert (stats["wait_share"] > 0.3) == (rank != slow), stats["wait_share"]
peers = stats["peers"]
assert [p["rank"] for p in peers] == list(range(size))
assert peers[rank]["bytes_sent"] == 0 and peers[rank]["waited_s"] == 0
assert peers[slow]["late_median_s"] is not None
# Messages of 1 KiB time no link: no goodput, no slowest link.
assert stats["slowest_link"] is None and all(p["goodput"] is None for p in peers), stats
assert peers[slow]["late_median_s"] <= peers[slow]["late_p99_s"] <= peers[slow]["late_max_s"]
if use_torch:
    group = dist.distributed_c10d._get_default_group()
    backend = group._get_backend(torch.device("cpu")) if hasattr(group, "_get_backend") else group
    group_stats = backend.stats()
    assert group_stats["slowest_rank"] == slow, group_stats
    dist.destroy_process_group()
    hvd.shutdown()
else:
    try:
        comm.stats()["peers"][size]
        raise AssertionError("a peer past the size")
    except IndexError:
        pass
    comm.finalize()
print("stats: rank %d: ok, %d steps, rank %d late %.1f ms, waiting %.0f%% of the time" % (
    rank, steps, stats["slowest_rank"], late * 1000, stats["wait_share"] * 100), flush=True)
