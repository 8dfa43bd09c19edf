"""What torch 2.x asks of a hoop group by device (python/hoop/torch/_devices.py), called here as
torch 2.x calls it, on Debian's torch 1.13 (which has none of those paths itself): _get_backend's
answers, split_group (torch >= 2.9's ProcessGroup.split_group: a group of the listed ranks, None
elsewhere, its collectives right), coalescing around sends and receives (torch 2.0-2.6's
batch_isend_irecv on CUDA tensors: only _end_coalescing's Work is waited for), and dist.split_group
refused by name where torch is older than 2.9. bench/torch2-devices.py runs the real torch 2.x
paths on a GPU machine. Prints "devices worker: N cases, F failed"."""

import copy
import datetime
import sys

import torch
import torch.distributed as dist

import hoop.torch  # noqa: F401  (registers the backend)
from hoop.torch import _devices
from tally import Tally

tally = Tally("devices worker")
check = tally.check



dist.init_process_group("hoop", pg_options=hoop.torch.ProcessGroupHoop.Options(compress=None))
rank, size = dist.get_rank(), dist.get_world_size()
pg = dist.distributed_c10d._get_default_group()

# _get_backend: the group serves every device itself.
for device in (torch.device("cpu"), torch.device("cuda", 0)):
    backend = pg._get_backend(device)
    check(backend.supports_splitting == _devices.SPLITS and backend.supports_coalescing,
          "_get_backend(%s) says splitting %r, coalescing %r" % (device, backend.supports_splitting,
                                                                backend.supports_coalescing))
    options = copy.deepcopy(backend.options)  # as torch 2.10's split_group copies them
    check(backend.name() == "hoop" and isinstance(options._timeout, datetime.timedelta) and
          options._timeout.total_seconds() == pg._comm.timeout, "_get_backend's name, options")
    check(not backend.supports_tensor_alloc(device) and not backend.supports_time_estimate and
          not backend.supports_shrinking, "what the group says it cannot do")
    backend.eager_connect_single_device(device)
    backend.perform_nocolor_split(device)
    backend._set_sequence_number_for_group()
check(pg.get_group_store() is not None, "the group's store")

# split_group as torch >= 2.9 calls it: on every rank of the parent.
members = list(range(1, size))
child = pg.split_group(members, timeout=None, opts=None, group_name="hoop-split-1",
                       group_desc="all but rank 0")
if rank in members:
    check(child is not None and child.size() == len(members) and child.rank() == rank - 1,
          "split_group's group: %r" % (child,))
    t = torch.full((3,), float(rank) + 0.25)
    child.allreduce([t]).wait()
    check(t.tolist() == [sum(r + 0.25 for r in members)] * 3, "the split group's allreduce: %s"
          % t.tolist())
    check(child.group_name == "hoop-split-1" and child.get_group_store() is not None,
          "the split group's name and store")
    inner = child.split_group([0], group_name="hoop-split-2")  # a split of a split
    check((inner is not None) == (child.rank() == 0), "a split of a split")
else:
    check(child is None, "split_group gave rank %d, outside it, %r" % (rank, child))
check(pg._get_backend(torch.device("cpu")).comm_split_count() == 1, "comm_split_count")

# Coalescing, as torch 2.0-2.6's batch_isend_irecv brackets its calls on CUDA tensors: the Works of
# the calls between are dropped, and _end_coalescing's completes them all.
for round_ in range(2):
    send = torch.arange(5.0) + 10 * rank + round_
    got = [torch.empty(5), torch.empty(5)]
    pg._start_coalescing(torch.device("cpu"))
    pg.send([send], (rank + 1) % size, 0)
    pg.recv([got[0]], (rank - 1) % size, 0)
    pg.send([send * 2], (rank - 1) % size, 1)
    pg.recv([got[1]], (rank + 1) % size, 1)
    work = pg._end_coalescing(torch.device("cpu"))
    work.wait()
    left, right = (rank - 1) % size, (rank + 1) % size
    check(torch.equal(got[0], torch.arange(5.0) + 10 * left + round_) and
          torch.equal(got[1], (torch.arange(5.0) + 10 * right + round_) * 2),
          "coalesced sends and receives gave %s" % got)
try:
    pg._start_coalescing(None)
    pg._start_coalescing(None)
    check(False, "coalescing started twice without an error")
except hoop.torch.Unsupported as err:
    check("coalescing already started" in str(err), "twice: %s" % err)
pg._end_coalescing(None).wait()

# dist.split_group where torch has one but asks NCCL's path of it (2.5-2.8): refused by name.
if hasattr(dist, "split_group") and not _devices.SPLITS:
    try:
        dist.split_group(split_ranks=[members])
        check(False, "split_group on torch %s was not refused" % torch.__version__)
    except NotImplementedError as err:
        check("torch 2.9" in str(err) and "new_group" in str(err), "the refusal: %s" % err)
dist.destroy_process_group()
sys.exit(tally.finish())
