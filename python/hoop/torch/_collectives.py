"""hoop.torch: the collectives on tensors (allreduce, grouped_allreduce, broadcast, allgather,
grouped_allgather, alltoall, reducescatter, grouped_reducescatter, barrier), blocking and
asynchronous, in place or into a new tensor."""

import math

import torch

from .. import Mismatch, Unsupported
from . import _autograd, _cycle
from ._compression import Compression
from ._handles import _post, synchronize
from ._plain import gather_shapes
from ._ops import _op, global_process_set
from ._sets import _process_set, _set_root


def _checked(tensor, call):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor, got %s" % (call, type(tensor).__name__))
    if tensor.device.type not in ("cpu", "cuda"):
        raise Unsupported("%s: tensors on %s are not supported (CPU and CUDA tensors are)"
                          % (call, tensor.device), Unsupported.code)
    if tensor.is_sparse:
        raise Unsupported("%s: sparse tensors are not supported (use .to_dense(), or "
                          "sparse_as_dense=True in DistributedOptimizer)" % call, Unsupported.code)
    return tensor


def _record(process_set, call, kind, *args):
    """A posted call, for join() (_cycle.py): on a process set, only that it was made."""
    if process_set is global_process_set:
        _cycle.record(kind, *args)
    else:
        _cycle.record("elsewhere", call)


def _scaled(tensor, factor):
    if factor == 1.0:
        return tensor
    if tensor.dtype.is_floating_point:
        return tensor.mul_(factor)
    return tensor.copy_((tensor.double() * factor).to(tensor.dtype))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set, _wire=None):
    """Start an in-place allreduce of tensor; returns a handle for synchronize() or poll()."""
    call = "hvd.allreduce_async_"
    op = _op(average, op, call)
    comm = _process_set(process_set, call)
    _checked(tensor, call)
    buf = tensor if tensor.is_contiguous() else tensor.contiguous()
    _scaled(buf, prescale_factor)
    request = comm.iallreduce(buf, op=op, name=name, compress=_wire)
    _record(process_set, call, "allreduce", [_cycle.spec(buf)], op, name, _wire)

    def finish():
        _scaled(buf, postscale_factor)
        if buf is not tensor:
            tensor.copy_(buf)
        return tensor

    return _post([request], tensor, finish)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set, _wire=None):
    """Start an allreduce into a new tensor; synchronize(handle) returns it."""
    _checked(tensor, "hvd.allreduce_async")
    return allreduce_async_(tensor.detach().clone(memory_format=torch.contiguous_format),
                            average, name, op, prescale_factor, postscale_factor, process_set,
                            _wire)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """A new tensor: op (default Average) over the ranks of tensor, sent compressed."""
    compressed, ctx = compression.compress(tensor)
    if _autograd.wants_grad(compressed):
        out = _autograd.allreduce(compressed, average, name, op, prescale_factor,
                                  postscale_factor, process_set)
    else:
        out = synchronize(allreduce_async(compressed, average, name, op, prescale_factor,
                                          postscale_factor, process_set,
                                          getattr(compression, "wire_format", None)))
    return compression.decompress(out, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Allreduce tensor in place; returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """Start one fused allreduce of a list of tensors (in place, one dtype)."""
    call = "hvd.grouped_allreduce_async_"
    op = _op(average, op, call)
    comm = _process_set(process_set, call)
    bufs = [_checked(t, call) if t.is_contiguous() else t.contiguous() for t in tensors]
    for b in bufs:
        _scaled(b, prescale_factor)
    request = comm.iallreduce_many(bufs, op=op, name=name)
    _record(process_set, call, "grouped_allreduce", [_cycle.spec(b) for b in bufs], op, name)

    def finish():
        for t, b in zip(tensors, bufs):
            _scaled(b, postscale_factor)
            if b is not t:
                t.copy_(b)
        return list(tensors)

    return _post([request], list(tensors), finish)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    copies = [_checked(t, "hvd.grouped_allreduce_async").detach().clone(
        memory_format=torch.contiguous_format) for t in tensors]
    return grouped_allreduce_async_(copies, average, name, op, prescale_factor, postscale_factor,
                                    process_set)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    pairs = [compression.compress(t) for t in tensors]
    outs = synchronize(grouped_allreduce_async([c for c, _ in pairs], average, name, op,
                                               prescale_factor, postscale_factor, process_set))
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Start an in-place broadcast of root_rank's tensor; returns a handle."""
    call = "hvd.broadcast_async_"
    comm = _process_set(process_set, call)
    _checked(tensor, call)
    root = _set_root(root_rank, process_set, comm, call)
    buf = tensor if tensor.is_contiguous() else tensor.contiguous()
    request = comm.ibroadcast(buf, root=root, name=name)
    _record(process_set, call, "broadcast", _cycle.spec(buf), root_rank, name)

    def finish():
        if buf is not tensor:
            tensor.copy_(buf)
        return tensor

    return _post([request], tensor, finish)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    _checked(tensor, "hvd.broadcast_async")
    return broadcast_async_(tensor.detach().clone(memory_format=torch.contiguous_format),
                            root_rank, name, process_set)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """A new tensor holding root_rank's tensor."""
    if _autograd.wants_grad(tensor):
        return _autograd.broadcast(tensor, root_rank, name, process_set)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrite tensor with root_rank's; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def _gather_shapes(tensor, comm, call, name):
    """Every rank's first dimension of tensor, after checking that the ranks' tensors agree in
    dtype and every other dimension (else Mismatch on every rank, naming them). The shapes travel
    as integers (_plain.gather_shapes)."""
    every = gather_shapes(tensor, comm, call, name)
    dtype0, shape0 = every[0]
    for r, (dtype, shape) in enumerate(every):
        if dtype != dtype0 or shape[1:] != shape0[1:]:
            raise Mismatch("%s: the ranks' tensors differ beyond their first dimension: rank 0 "
                           "has %s%s, rank %d has %s%s" % (call, dtype0, list(shape0), r, dtype,
                                                          list(shape)), Mismatch.code)
    return [shape[0] for _, shape in every]


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Start gathering every rank's tensor, concatenated along the first dimension (which may
    differ between ranks); synchronize(handle) returns the result."""
    call = "hvd.allgather_async"
    comm = _process_set(process_set, call)
    _checked(tensor, call)
    src = tensor.detach().contiguous()
    if src.dim() == 0:
        src = src.reshape(1)
    firsts = _gather_shapes(src, comm, call, name)
    rest = tuple(src.shape[1:])
    widest = max(firsts)
    if widest != src.shape[0]:
        padded = src.new_zeros((widest,) + rest)
        padded[:src.shape[0]] = src
        src = padded
    gathered = src.new_empty((widest * comm.size,) + rest)
    request = comm.iallgather(src, gathered, name=name)
    _record(process_set, call, "allgather", rest, src.dtype, src.device, name)
    if all(f == widest for f in firsts):
        return _post([request], gathered)

    def finish():
        return torch.cat([gathered[r * widest:r * widest + f] for r, f in enumerate(firsts)])

    return _post([request], None, finish)


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's tensor concatenated along the first dimension, in rank order."""
    if _autograd.wants_grad(tensor):
        return _autograd.allgather(tensor, name, process_set)
    return synchronize(allgather_async(tensor, name, process_set))


def barrier(process_set=global_process_set):
    _process_set(process_set, "hvd.barrier").barrier()
    _record(process_set, "hvd.barrier", "barrier")


def _nth(name, i):
    """The name of a group's i-th call: "name.i" (each is a call of its own)."""
    return None if name is None else "%s.%d" % (name, i)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Start an allgather of each tensor; synchronize(handle) returns the list of results."""
    handles = [allgather_async(t, _nth(name, i), process_set) for i, t in enumerate(tensors)]
    return _post([], None, lambda: [synchronize(h) for h in handles])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Start sending rows of tensor to every rank: splits[r] rows (first dimension) to rank r,
    equal shares without splits. synchronize(handle) returns the rows received, concatenated in
    rank order, and (with splits) how many came from each rank."""
    call = "hvd.alltoall_async"
    comm = _process_set(process_set, call)
    _checked(tensor, call)
    src = tensor.detach().contiguous()
    if src.dim() == 0:
        raise ValueError("%s: a tensor of at least one dimension is needed" % call)
    n = comm.size
    if splits is None:
        if src.shape[0] % n:
            raise ValueError("%s: %d rows do not divide among %d ranks; give splits"
                             % (call, src.shape[0], n))
        send_rows = [src.shape[0] // n] * n
    else:
        send_rows = [int(x) for x in (splits.tolist() if isinstance(splits, torch.Tensor)
                                      else splits)]
        if len(send_rows) != n or min(send_rows) < 0 or sum(send_rows) != src.shape[0]:
            raise ValueError("%s: splits %s must give each of the %d ranks a count of rows, "
                             "%d in all" % (call, send_rows, n, src.shape[0]))
    # How many rows come from each rank: a small all-to-all first.
    theirs = torch.empty(n, dtype=torch.int64)
    comm.alltoall(torch.tensor(send_rows, dtype=torch.int64), theirs, name=name)
    recv_rows = theirs.tolist()
    row = math.prod(src.shape[1:])  # elements per row (1 for one dimension)
    out = src.new_empty((sum(recv_rows),) + tuple(src.shape[1:]))
    request = comm.ialltoallv(src, [r * row for r in send_rows], out, [r * row for r in recv_rows],
                              name=name)
    _record(process_set, call, "alltoall", tuple(src.shape[1:]), src.dtype, src.device, name)
    received = torch.tensor(recv_rows, dtype=torch.int32)
    return _post([request], None, lambda: (out, received))


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Rows of tensor to every rank (see alltoall_async): the rows received, and with splits the
    count from each rank, as Horovod returns them."""
    if _autograd.wants_grad(tensor):
        out, received = _autograd.alltoall(tensor, splits, name, process_set)
    else:
        out, received = synchronize(alltoall_async(tensor, splits, name, process_set))
    return out if splits is None else (out, received)


def reducescatter_async(tensor, name=None, op=None, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Start reducing tensor over the ranks (default Average) and scattering the result along
    the first dimension: rank r gets its share of the rows, the first (rows % size) ranks one
    more. synchronize(handle) returns this rank's rows."""
    call = "hvd.reducescatter_async"
    op = _op(None, op, call)
    comm = _process_set(process_set, call)
    _checked(tensor, call)
    src = tensor.detach().clone(memory_format=torch.contiguous_format)
    if src.dim() == 0:
        raise ValueError("%s: a tensor of at least one dimension is needed" % call)
    n, rows = comm.size, src.shape[0]
    counts = [rows // n + (1 if r < rows % n else 0) for r in range(n)]
    widest = max(counts)
    rest = tuple(src.shape[1:])
    _scaled(src, prescale_factor)
    if widest * n != rows:  # equal blocks for hoop: each rank's rows padded to the widest
        padded = src.new_zeros((widest * n,) + rest)
        at = 0
        for r, c in enumerate(counts):
            padded[r * widest:r * widest + c] = src[at:at + c]
            at += c
        src = padded
    out = src.new_empty((widest,) + rest)
    request = comm.ireduce_scatter(src, out, op=op, name=name)
    _record(process_set, call, "reducescatter", _cycle.spec(tensor), op, name)
    mine = counts[comm.rank]

    def finish():
        return _scaled(out[:mine].clone() if mine != widest else out, postscale_factor)

    return _post([request], None, finish)


def reducescatter(tensor, name=None, compression=Compression.none, op=None,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """This rank's rows of tensor reduced over the ranks (default Average)."""
    compressed, ctx = compression.compress(tensor)
    if _autograd.wants_grad(compressed):
        out = _autograd.reducescatter(compressed, name, op, process_set, prescale_factor,
                                      postscale_factor)
    else:
        out = synchronize(reducescatter_async(compressed, name, op, process_set, prescale_factor,
                                              postscale_factor))
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(tensors, name=None, op=None, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    handles = [reducescatter_async(t, _nth(name, i), op, process_set, prescale_factor,
                                   postscale_factor) for i, t in enumerate(tensors)]
    return _post([], None, lambda: [synchronize(h) for h in handles])


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=None,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    pairs = [compression.compress(t) for t in tensors]
    outs = synchronize(grouped_reducescatter_async([c for c, _ in pairs], name, op, process_set,
                                                   prescale_factor, postscale_factor))
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]

