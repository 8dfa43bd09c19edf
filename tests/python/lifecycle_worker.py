"""One rank of the torch.distributed group life cycle (tests/test_torch.sh, 3 ranks): issue 59's
destroy_process_group, shutdown and abort on the hoop backend.

  - destroy_process_group(sub) frees the new_group's communicator (its calls then raise
    hoop.Failed saying the group was shut down) and leaves the default group working;
  - destroy_process_group() shuts the default group down, and init_process_group("hoop") again
    gives a working default group on the same job (as gloo lets a program do);
  - ProcessGroup.abort() on rank 0 of a new group makes the others' call on it raise, naming rank 0
    and the abort, within seconds; rank 0's next call on it raises hoop.Failed; and as hoop's
    groups share the job's connections, the default group's calls fail too, naming the abort.

First, issue 59's bool and int16 tensors and bitwise ops (BAND, BOR, BXOR) through all_reduce, and
float32 BAND refused naming both.

Prints "lifecycle worker: N cases, N failed" and the failures.
"""

import sys
import time

import torch
import torch.distributed as dist

import hoop
import hoop.torch  # noqa: F401 - registers the backend

cases = 0
failures = []


def check(ok, what):
    global cases
    cases += 1
    if not ok:
        failures.append(what)


def total(group=None):
    t = torch.full((5,), float(dist.get_rank() + 1))
    dist.all_reduce(t, group=group)
    return t[0].item()


def raises(call, kind, words):
    """The exception call raises, checked to be a kind naming every word; None where it returned."""
    try:
        call()
    except kind as err:
        missing = [w for w in words if w not in str(err)]
        return "names none of %s: %s" % (missing, err) if missing else ""
    except Exception as err:  # noqa: BLE001 - any other kind is the failure reported
        return "raised %s, not %s: %s" % (type(err).__name__, kind.__name__, err)
    return "did not raise"


dist.init_process_group("hoop")
rank, size = dist.get_rank(), dist.get_world_size()
want = size * (size + 1) / 2

# Issue 59's smaller items that come before the life cycle: bool and int16 tensors, and the
# bitwise reduce ops, as gloo serves them (bool's SUM is or, its PRODUCT and).
for dtype in (torch.int16, torch.int32, torch.uint8, torch.int64):
    for op, fold in ((dist.ReduceOp.BAND, lambda a, b: a & b), (dist.ReduceOp.BOR, lambda a, b: a | b),
                     (dist.ReduceOp.BXOR, lambda a, b: a ^ b)):
        bits = [(r * 37 + i * 11) % 251 - (0 if dtype == torch.uint8 else 125)
                for r in range(size) for i in range(9)]
        t = torch.tensor(bits[rank * 9:(rank + 1) * 9], dtype=dtype)
        dist.all_reduce(t, op=op)
        expect = []
        for i in range(9):
            acc = bits[i]
            for r in range(1, size):
                acc = fold(acc, bits[r * 9 + i])
            expect.append(acc)
        check(t.tolist() == torch.tensor(expect, dtype=dtype).tolist(),
              "all_reduce %s %s: %s, not %s" % (dtype, op, t.tolist(), expect))
flags = [[(r + i) % 3 == 0 for i in range(7)] for r in range(size)]
for op, fold in ((dist.ReduceOp.SUM, any), (dist.ReduceOp.MAX, any), (dist.ReduceOp.PRODUCT, all),
                 (dist.ReduceOp.MIN, all), (dist.ReduceOp.BOR, any), (dist.ReduceOp.BAND, all)):
    t = torch.tensor(flags[rank], dtype=torch.bool)
    dist.all_reduce(t, op=op)
    expect = [fold(flags[r][i] for r in range(size)) for i in range(7)]
    check(t.tolist() == expect, "all_reduce bool %s: %s, not %s" % (op, t.tolist(), expect))
t = torch.ones(4, dtype=torch.float32)
why = raises(lambda: dist.all_reduce(t, op=dist.ReduceOp.BAND), hoop.InvalidArgument,
             ["band", "float32"])
check(why == "", "all_reduce float32 BAND: %s" % why)

# A new group destroyed: its communicator finalized, the default group goes on.
sub = dist.new_group(list(range(size)))
check(total(sub) == want, "all_reduce on a new group before destroy")
comm = sub._comm
dist.destroy_process_group(sub)
check(comm._handle is None, "destroy_process_group(sub) left its communicator alive")
why = raises(lambda: total(sub), hoop.Failed, ["allreduce", "shut down"])
check(why == "", "all_reduce on a destroyed group: %s" % why)
check(total() == want, "all_reduce on the default group after destroying a new group")

# The default group destroyed, then made again on the same job.
world = dist.distributed_c10d._get_default_group()
dist.destroy_process_group()
why = raises(lambda: world.barrier(), hoop.Failed, ["barrier", "shut down"])
check(why == "", "barrier on the destroyed default group: %s" % why)
# Every rank's old store is gone before any connects anew (rank 0 serves both at one port: a
# rank that reached the old one would lose it), here through the job's communicator.
hoop._shared_comm().barrier()
dist.init_process_group("hoop")
check(total() == want, "all_reduce after init_process_group again")
check(hoop._shared_comm() is dist.distributed_c10d._get_default_group()._comm,
      "the default group made again is not the job's communicator")

# abort() on rank 0 of a new group: the others' all_reduce on it fails naming rank 0.
group = dist.new_group(list(range(size)))
check(total(group) == want, "all_reduce on the group before abort")
try:
    dist.barrier()
except RuntimeError as err:
    # Rank 0 may leave the barrier and abort while this rank still finishes it (waiting for a
    # peer's last word): then the barrier fails as the calls below must.
    check(rank != 0 and "ProcessGroup.abort" in str(err), "the barrier before the abort: %s" % err)
if rank == 0:
    group.abort()
    why = raises(lambda: total(group), hoop.Failed, ["allreduce", "aborted"])
    check(why == "", "rank 0's all_reduce after its abort: %s" % why)
else:
    started = time.monotonic()
    # (torch's Work.wait raises RuntimeError, which hoop's message rides in, as gloo's do)
    why = raises(lambda: total(group), RuntimeError, ["rank 0", "ProcessGroup.abort"])
    took = time.monotonic() - started
    check(why == "", "all_reduce on a group rank 0 aborted: %s" % why)
    check(took < 10, "the abort took %.1f s to reach rank %d" % (took, rank))

# Groups share the job's connections: an abort fails the job, the default group too.
why = raises(lambda: total(), RuntimeError, ["rank 0", "ProcessGroup.abort"])
check(why == "", "all_reduce on the default group after the abort: %s" % why)
print("lifecycle worker: %d cases, %d failed" % (cases, len(failures)), flush=True)
for failure in failures[:5]:
    print("FAIL rank %d: %s" % (rank, failure), flush=True)
sys.exit(1 if failures else 0)
