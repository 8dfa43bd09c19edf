"""hoop.torch: join(), for ranks with uneven inputs."""

import math

import torch

from .. import Unsupported
from . import _collectives, _cycle
from ._job import _live
from ._ops import Average, Min, Product, Sum


def join(device=-1):
    """Say this rank has no more data. Until every rank has joined, this rank repeats the calls of
    its training loop's last cycle (those between its two latest DistributedOptimizer steps, as
    the job's communicator saw them) with contributions that change nothing: zero gradients,
    allreduces of the op's identity (0 for Sum and Average, which still divides by every rank, as
    Horovod's does; 1 for Product; the largest value for Min, the smallest for Max), no rows to an
    allgather or an alltoall, zeros to a reducescatter, a broadcast received and dropped. Returns
    the rank that joined last (broadcast the model from it: a joined rank's parameters stop
    where its data ended).

    Horovod negotiates each allreduce with the joined ranks (and fails an allgather or a
    broadcast); hoop repeats the loop instead, so the ranks still training must make the same
    calls in each step as in the joined rank's last one: a call made every few steps only or a
    call on a process set fails (hoop.Mismatch naming both calls, or Unsupported), and so does a
    broadcast from a rank that joined while others still needed its data (after they received
    zeros). A rank that made no DistributedOptimizer step can only wait in join() for the others
    to join: the calls of those still training then fail."""
    call = "hvd.join"
    comm = _live(call)
    if comm.size == 1:
        return comm.rank
    cycle = _cycle.last_cycle(lambda ref: _step_of(ref, comm) is not None)
    rounds = 0
    while True:
        rounds += 1
        if cycle:
            joined = _replay(cycle, comm)
        else:
            flag = torch.ones(1, dtype=torch.int32)
            comm.allreduce(flag)
            joined = int(flag.item())
        if joined >= comm.size:
            break
    last = torch.tensor([comm.rank if rounds == 1 else -1], dtype=torch.int64)
    comm.allreduce(last, op="max")
    return int(last.item())


def _step_of(ref, comm):
    """The DistributedOptimizer behind a recorded step, if it lives and works on comm."""
    optimizer = ref()
    return optimizer if optimizer is not None and optimizer._comm is comm else None


def _neutral(spec, op):
    """A tensor of spec's shape holding op's identity."""
    shape, dtype, device = spec
    if op in (Sum, Average):
        return torch.zeros(shape, dtype=dtype, device=device)
    if op == Product:
        return torch.ones(shape, dtype=dtype, device=device)
    if dtype == torch.bool:
        fill = op == Min
    elif dtype.is_floating_point:
        fill = math.inf if op == Min else -math.inf
    else:
        info = torch.iinfo(dtype)
        fill = info.max if op == Min else info.min
    return torch.full(shape, fill, dtype=dtype, device=device)


def _replay(cycle, comm):
    """The cycle's calls once, as a joined rank makes them; how many ranks have joined, as the
    cycle's last optimizer step counted them."""
    c = _collectives
    joined = rooted = None
    _cycle._replaying[0] = True
    try:
        for kind, *args in cycle:
            if kind == "bucket":
                optimizer = _step_of(args[0], comm)
                if optimizer is None:
                    raise Unsupported("hvd.join: the loop's DistributedOptimizer is gone",
                                      Unsupported.code)
                counted = optimizer._join_bucket(args[1])
                joined = counted if counted is not None else joined
            elif kind == "allreduce":
                specs, op, name, wire = args
                c.synchronize(c.allreduce_async_(_neutral(specs[0], op), name=name, op=op,
                                                 _wire=wire))
            elif kind == "grouped_allreduce":
                specs, op, name = args
                c.synchronize(c.grouped_allreduce_async_([_neutral(s, op) for s in specs],
                                                         name=name, op=op))
            elif kind == "broadcast":
                spec, root, name = args
                if root == comm.rank:  # harmless only where every rank repeats (checked below)
                    rooted = rooted or name or "hvd.broadcast"
                c.synchronize(c.broadcast_async_(_neutral(spec, Sum), root, name=name))
            elif kind in ("allgather", "alltoall"):
                rest, dtype, device, name = args
                none = torch.empty((0,) + rest, dtype=dtype, device=device)
                if kind == "allgather":
                    c.synchronize(c.allgather_async(none, name=name))
                else:
                    c.synchronize(c.alltoall_async(none, [0] * comm.size, name=name))
            elif kind == "reducescatter":
                spec, op, name = args
                c.synchronize(c.reducescatter_async(_neutral(spec, op), name=name, op=op))
            elif kind == "barrier":
                c.barrier()
            else:  # "elsewhere": a call on a process set
                raise Unsupported("hvd.join: the loop makes %s on a process set, which a joined "
                                  "rank cannot repeat (join() repeats calls on every rank)"
                                  % args[0], Unsupported.code)
    finally:
        _cycle._replaying[0] = False
    if joined is None:
        raise Unsupported("hvd.join: the loop's cycle holds no DistributedOptimizer step",
                          Unsupported.code)
    if rooted and joined < comm.size:
        raise Unsupported("hvd.join: rank %d has joined, and the ranks still training broadcast "
                          "from it (%s): they received zeros; broadcast from a rank that trains "
                          "to the end, or make the loop's broadcasts after join()"
                          % (comm.rank, rooted), Unsupported.code)
    return joined
