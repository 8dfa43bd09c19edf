"""hoop.torch: PyTorch on hoop, with Horovod's API.

A program written for Horovod runs on hoop by changing its import::

    import hoop.torch as hvd          # was: import horovod.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.fp16)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

and is started with hooprun (``hooprun -np 4 /usr/bin/python3 main.py``). Importing this module
also registers the torch.distributed backend "hoop" (``dist.init_process_group("hoop")``).

Everything runs over hoop's non-blocking collectives: an ``*_async`` call returns a handle at once
and the collective runs on hoop's progress thread while Python computes. Tensors live on the CPU,
or on a GPU where libhoop takes CUDA buffers (hoop.cuda_supported(): ranks of one host read each
other's GPU memory by CUDA IPC, other ranks stage through host memory). What Horovod has and hoop does not (Adasum, process sets, elastic training, alltoall,
reducescatter) raises an error naming it.

Failing well: ``broadcast_parameters``, ``broadcast_optimizer_state`` and ``DistributedOptimizer``
check that every rank has the same tensor names, shapes and dtypes, and otherwise raise
``hoop.Mismatch`` on every rank naming the first difference and the ranks; an exception that ends
one rank makes every other rank's next hoop call raise ``hoop.Aborted`` ("aborted by rank R: ...");
a rank that dies becomes ``hoop.PeerLost`` naming it.
"""

import contextlib
import itertools
import os
import pickle
import warnings
import weakref

import torch

from .. import (Aborted, HoopError, InvalidArgument, Mismatch, PeerLost, Timeout, Unsupported,
                _shared_comm)
from ._backend import ProcessGroupHoop  # registers the torch.distributed backend "hoop"

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "allgather",
    "allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "synchronize", "poll", "barrier", "join", "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "allgather_object", "DistributedOptimizer", "Compression", "Average", "Sum",
    "Min", "Max", "Product", "Adasum", "HoopError", "Aborted", "PeerLost", "Mismatch", "Timeout",
    "ProcessGroupHoop", "global_process_set",
]

# ---- ops (Horovod's names) ------------------------------------------------------------------

Average = "avg"
Sum = "sum"
Min = "min"
Max = "max"
Product = "prod"
Adasum = "adasum"


class _GlobalProcessSet:
    """Horovod's process set of all ranks, the only one hoop has."""

    def __repr__(self):
        return "global_process_set"


global_process_set = _GlobalProcessSet()


def _op(average, op, call):
    if op is not None and average is not None:
        raise ValueError("%s: give op or average, not both" % call)
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise Unsupported("%s: Adasum is not supported by hoop (Average, Sum, Min, Max and "
                          "Product are)" % call, Unsupported.code)
    if op not in (Average, Sum, Min, Max, Product):
        raise InvalidArgument("%s: unknown op %r (hvd.Average, Sum, Min, Max or Product)"
                              % (call, op), InvalidArgument.code)
    return op


def _process_set(process_set, call):
    if process_set is not None and process_set is not global_process_set:
        raise Unsupported("%s: process sets are not supported by hoop (every call runs on all "
                          "ranks)" % call, Unsupported.code)


# ---- compression ----------------------------------------------------------------------------


class Compressor:
    """Turns a tensor into what travels, and back."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class NoneCompressor(Compressor):
    """Sends tensors as they are."""


class _CastCompressor(Compressor):
    wire = None

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire:
            return tensor.to(cls.wire), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as float16 (half the bytes)."""

    wire = torch.float16


class BF16Compressor(_CastCompressor):
    """Sends floating-point tensors as bfloat16 (float32's range, half the bytes)."""

    wire = torch.bfloat16


class Compression:
    """hvd.Compression.none, .fp16, .bf16."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


# ---- the job --------------------------------------------------------------------------------

_comm = None


def init(comm=None, process_sets=None):
    """Join the job hooprun started (a job of one rank when started alone)."""
    global _comm
    if comm is not None:
        raise Unsupported("hvd.init: an MPI communicator is not supported by hoop (start the "
                          "ranks with hooprun)", Unsupported.code)
    if process_sets:
        _process_set(process_sets, "hvd.init")
    if _comm is None or _comm._handle is None:
        _comm = _shared_comm()


def shutdown():
    """Leave the job (waits for outstanding calls first)."""
    global _comm
    if _comm is not None:
        _handles.clear()
        _comm.finalize()
        _comm = None


def is_initialized():
    return _comm is not None and _comm._handle is not None


def _live(call):
    if not is_initialized():
        raise ValueError("%s: hoop.torch has not been initialized; call hvd.init() first" % call)
    return _comm


def rank():
    return _live("hvd.rank").rank


def size():
    return _live("hvd.size").size


def local_rank():
    return _live("hvd.local_rank").local_rank


def local_size():
    return _live("hvd.local_size").local_size


def mpi_threads_supported():
    return False


def _built_false():
    return False


mpi_built = mpi_enabled = gloo_built = gloo_enabled = nccl_built = ddl_built = ccl_built = \
    cuda_built = rocm_built = _built_false


def _unsupported(name, why):
    def refuse(*args, **kwargs):
        raise Unsupported("hvd.%s is not supported by hoop: %s" % (name, why), Unsupported.code)
    refuse.__name__ = name
    return refuse


for _name, _why in (("alltoall", "hoop has allreduce, allgather, broadcast and barrier"),
                    ("alltoall_async", "hoop has allreduce, allgather, broadcast and barrier"),
                    ("reducescatter", "hoop has allreduce, allgather, broadcast and barrier"),
                    ("reducescatter_async", "hoop has allreduce, allgather, broadcast and barrier"),
                    ("add_process_set", "process sets are not supported"),
                    ("remove_process_set", "process sets are not supported"),
                    ("cross_rank", "hoop does not number hosts"),
                    ("cross_size", "hoop does not number hosts"),
                    ("start_timeline", "use HOOP_TRACE=FILE for a Chrome trace"),
                    ("stop_timeline", "use HOOP_TRACE=FILE for a Chrome trace")):
    globals()[_name] = _unsupported(_name, _why)


class _Elastic:
    def __getattr__(self, name):
        raise Unsupported("hvd.elastic.%s is not supported by hoop: elastic training is not "
                          "implemented" % name, Unsupported.code)


elastic = _Elastic()

# ---- handles --------------------------------------------------------------------------------

_handles = {}
_handle_numbers = itertools.count(1)


class _Pending:
    """The hoop requests of one asynchronous call, its result, and what finishes it."""

    __slots__ = ("requests", "result", "finish")

    def __init__(self, requests, result, finish):
        self.requests, self.result, self.finish = requests, result, finish


def _post(requests, result, finish=None):
    handle = next(_handle_numbers)
    _handles[handle] = _Pending(requests, result, finish)
    return handle


def _pending(handle, call):
    try:
        return _handles[handle]
    except KeyError:
        raise ValueError("%s: %r is not an outstanding handle (each is synchronized once)"
                         % (call, handle)) from None


def poll(handle):
    """True once the asynchronous call behind handle has completed (synchronize() then returns
    at once); raises its error if it failed."""
    return all(r.test() for r in _pending(handle, "hvd.poll").requests)


def synchronize(handle):
    """Wait for the asynchronous call behind handle; return its output tensor."""
    pending = _pending(handle, "hvd.synchronize")
    try:
        for request in pending.requests:
            request.wait()
    finally:
        del _handles[handle]
    if pending.finish is not None:
        return pending.finish()
    return pending.result


# ---- tensors --------------------------------------------------------------------------------


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


def _scaled(tensor, factor):
    if factor == 1.0:
        return tensor
    if tensor.dtype.is_floating_point:
        return tensor.mul_(factor)
    return tensor.copy_((tensor.double() * factor).to(tensor.dtype))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Start an in-place allreduce of tensor; returns a handle for synchronize() or poll()."""
    call = "hvd.allreduce_async_"
    op = _op(average, op, call)
    _process_set(process_set, call)
    comm = _live(call)
    _checked(tensor, call)
    buf = tensor if tensor.is_contiguous() else tensor.contiguous()
    _scaled(buf, prescale_factor)
    request = comm.iallreduce(buf, op=op)

    def finish():
        _scaled(buf, postscale_factor)
        if buf is not tensor:
            tensor.copy_(buf)
        return tensor

    return _post([request], tensor, finish)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Start an allreduce into a new tensor; synchronize(handle) returns it."""
    _checked(tensor, "hvd.allreduce_async")
    return allreduce_async_(tensor.detach().clone(memory_format=torch.contiguous_format),
                            average, name, op, prescale_factor, postscale_factor, process_set)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """A new tensor: op (default Average) over the ranks of tensor, sent compressed."""
    compressed, ctx = compression.compress(tensor)
    out = synchronize(allreduce_async(compressed, average, name, op, prescale_factor,
                                      postscale_factor, process_set))
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
    _process_set(process_set, call)
    comm = _live(call)
    bufs = [_checked(t, call) if t.is_contiguous() else t.contiguous() for t in tensors]
    for b in bufs:
        _scaled(b, prescale_factor)
    request = comm.iallreduce_many(bufs, op=op)

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
    _process_set(process_set, call)
    comm = _live(call)
    _checked(tensor, call)
    _root(root_rank, comm, call)
    buf = tensor if tensor.is_contiguous() else tensor.contiguous()
    request = comm.ibroadcast(buf, root=root_rank)

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
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrite tensor with root_rank's; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def _root(root_rank, comm, call):
    if not isinstance(root_rank, int) or not 0 <= root_rank < comm.size:
        raise InvalidArgument("%s: root_rank %r is not a rank of this job (0 to %d)"
                              % (call, root_rank, comm.size - 1), InvalidArgument.code)


def _gather_shapes(tensor, comm, call):
    """Every rank's first dimension of tensor, after checking that the ranks' tensors agree in
    dtype and every other dimension (else Mismatch on every rank, naming them)."""
    every = _allgather_object((str(tensor.dtype), tuple(tensor.shape)), comm)
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
    _process_set(process_set, call)
    comm = _live(call)
    _checked(tensor, call)
    src = tensor.detach().contiguous()
    if src.dim() == 0:
        src = src.reshape(1)
    firsts = _gather_shapes(src, comm, call)
    rest = tuple(src.shape[1:])
    widest = max(firsts)
    if widest != src.shape[0]:
        padded = src.new_zeros((widest,) + rest)
        padded[:src.shape[0]] = src
        src = padded
    gathered = src.new_empty((widest * comm.size,) + rest)
    request = comm.iallgather(src, gathered)
    if all(f == widest for f in firsts):
        return _post([request], gathered)

    def finish():
        return torch.cat([gathered[r * widest:r * widest + f] for r, f in enumerate(firsts)])

    return _post([request], None, finish)


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's tensor concatenated along the first dimension, in rank order."""
    return synchronize(allgather_async(tensor, name, process_set))


def barrier(process_set=global_process_set):
    _process_set(process_set, "hvd.barrier")
    _live("hvd.barrier").barrier()


# ---- objects --------------------------------------------------------------------------------


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's obj (anything pickle takes, tensors included), on every rank."""
    call = "hvd.broadcast_object"
    _process_set(process_set, call)
    comm = _live(call)
    _root(root_rank, comm, call)
    if comm.rank == root_rank:
        data = bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        length = torch.tensor([len(data)], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    comm.broadcast(length, root=root_rank)
    if comm.rank != root_rank:
        data = bytearray(int(length.item()))
    comm.broadcast(data, root=root_rank, dtype="uint8")
    return pickle.loads(data)


def allgather_object(obj, name=None, process_set=global_process_set):
    """A list of every rank's obj, in rank order."""
    call = "hvd.allgather_object"
    _process_set(process_set, call)
    return _allgather_object(obj, _live(call))


def _allgather_object(obj, comm):
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    lengths = torch.empty(comm.size, dtype=torch.int64)
    comm.allgather(torch.tensor([len(data)], dtype=torch.int64), lengths)
    lengths = lengths.tolist()
    widest = max(lengths)
    every = bytearray(widest * comm.size)
    comm.allgather(bytearray(data.ljust(widest, b"\0")), every, dtype="uint8")
    return [pickle.loads(bytes(every[r * widest:r * widest + n])) for r, n in enumerate(lengths)]


# ---- the same model everywhere --------------------------------------------------------------


def _describe(entry):
    name, shape, dtype = entry
    return "%r (%s%s)" % (name, dtype.replace("torch.", ""), list(shape))


def _check_same(entries, comm, call):
    """Raise Mismatch on every rank unless every rank passed the same [(name, shape, dtype)],
    naming the first difference and the ranks. One allgather."""
    if comm.size == 1:
        return
    every = _allgather_object([(n, tuple(s), str(d)) for n, s, d in entries], comm)
    first = every[0]
    for r, theirs in enumerate(every[1:], 1):
        if theirs == first:
            continue
        for i, (a, b) in enumerate(zip(first, theirs)):
            if a != b:
                what = ("rank 0 has %s where rank %d has %s (tensor %d of %d)"
                        % (_describe(a), r, _describe(b), i, len(first)))
                break
        else:
            longer, lr, shorter, sr = ((first, 0, theirs, r) if len(first) > len(theirs)
                                       else (theirs, r, first, 0))
            what = ("rank %d has %d tensors and rank %d %d: the first without a counterpart is "
                    "rank %d's %s" % (lr, len(longer), sr, len(shorter), lr,
                                      _describe(longer[len(shorter)])))
        raise Mismatch("%s: the ranks' models differ: %s" % (call, what), Mismatch.code)


def _named(params, call):
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        items = list(params)
    else:
        raise ValueError("%s: invalid params of type %s" % (call, type(params).__name__))
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise ValueError("%s: expected (name, tensor) pairs, like model.named_parameters() "
                             "or model.state_dict(), got %r" % (call, type(item).__name__))
    return items


def broadcast_parameters(params, root_rank=0, prefix=None):
    """Overwrite every rank's tensors with root_rank's: params is a state_dict, or
    (name, tensor) pairs like model.named_parameters(). Raises Mismatch on every rank if the
    ranks' names, shapes or dtypes differ."""
    call = "hvd.broadcast_parameters"
    comm = _live(call)
    _root(root_rank, comm, call)
    items = [(n, p) for n, p in _named(params, call) if isinstance(p, torch.Tensor)]
    _check_same([(n, p.shape, p.dtype) for n, p in items], comm, call)
    handles = []
    with torch.no_grad():
        for _, p in items:
            handles.append(broadcast_async_(p.data if p.requires_grad else p, root_rank))
        for h in handles:
            synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank=0, prefix=None):
    """Give every rank root_rank's optimizer state (its state_dict: momenta, steps, and the
    param groups' settings such as lr). Raises Mismatch on every rank if the ranks' optimizers
    hold different parameters."""
    call = "hvd.broadcast_optimizer_state"
    comm = _live(call)
    _root(root_rank, comm, call)
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("%s: cannot broadcast the state of torch.optim.LBFGS" % call)
    _check_same(_optimizer_entries(optimizer), comm, call)
    state = broadcast_object(optimizer.state_dict() if comm.rank == root_rank else None,
                             root_rank)
    if comm.rank != root_rank:
        optimizer.load_state_dict(state)


def _optimizer_entries(optimizer, names=None):
    entries = []
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            name = names.get(p) if names else None
            entries.append((name or "param_groups[%d][%d]" % (g, i), p.shape, p.dtype))
    return entries


# ---- DistributedOptimizer -------------------------------------------------------------------

# The DistributedOptimizers of this process as they synchronized, latest last (weak references):
# join() repeats the latest cycle of them.
_synchronized = []


def _bucket_bytes():
    text = os.environ.get("HOOP_BUCKET_BYTES", "")
    try:
        return max(1, int(text)) if text else 1 << 20
    except ValueError:
        raise InvalidArgument("HOOP_BUCKET_BYTES %r is not a number of bytes" % text,
                              InvalidArgument.code) from None


class _DistributedMixin:
    """What DistributedOptimizer adds to the user's optimizer class (see there)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense):
        super().__init__(params)
        call = "hvd.DistributedOptimizer"
        self._comm = _live(call)
        self._compression = compression
        self._sparse_as_dense = sparse_as_dense
        if op not in (Average, Sum):
            _op(None, op, call)  # Adasum and unknown ops say so
            raise InvalidArgument("%s: op must be hvd.Average or hvd.Sum, not %r" % (call, op),
                                  InvalidArgument.code)
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("%s: gradient_predivide_factor needs op=hvd.Average" % call)
        if backward_passes_per_step < 1:
            raise ValueError("%s: backward_passes_per_step must be at least 1" % call)
        # Average with a predivide factor f: a sum of gradients divided by f, divided by size/f
        # after; otherwise hoop's own avg or sum.
        self._op = Sum if gradient_predivide_factor != 1.0 else op
        self._prescale = 1.0 / gradient_predivide_factor
        self._postscale = (gradient_predivide_factor / self._comm.size
                           if gradient_predivide_factor != 1.0 else 1.0)
        self._passes = backward_passes_per_step

        ordered = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(item, tuple) for item in named):
                raise ValueError("%s: named_parameters should be (name, parameter) pairs, as "
                                 "model.named_parameters() gives" % call)
            names = [n for n, _ in named]
            if len(set(names)) < len(names):
                dup = sorted({n for n in names if names.count(n) > 1})
                raise ValueError("%s: parameter names in named_parameters must be unique; "
                                 "repeated: %s" % (call, ", ".join(dup)))
            self._names = {p: n for n, p in named}
            unnamed = [i for i, p in enumerate(ordered) if p not in self._names]
            if unnamed:
                raise ValueError("%s: named_parameters was given, but %d of the optimizer's "
                                 "parameters are not in it (the first is parameter %d)"
                                 % (call, len(unnamed), unnamed[0]))
        else:
            self._names = {p: "allreduce.noname.%d" % i for i, p in enumerate(ordered)}
        _check_same(_optimizer_entries(self, self._names), self._comm, call)

        self._params = [p for p in ordered if p.requires_grad]
        self._buckets = self._make_buckets(groups, call)
        self._bucket_of = {p: b for b, bucket in enumerate(self._buckets) for p in bucket}
        self._hooks = []
        self._reset()
        self._should_synchronize = True
        self._synchronized = False
        if self._comm.size > 1:
            self._register_hooks()

    def _make_buckets(self, groups, call):
        """Fixed buckets, the same on every rank: parameters in the reverse of their order (as
        backward produces gradients), cut at HOOP_BUCKET_BYTES (default 1 MiB) of what travels
        and wherever the dtype changes; or the user's groups (Horovod's groups argument)."""
        params = self._params
        wire = {p: self._compression.compress(torch.empty(0, dtype=p.dtype))[0].dtype
                for p in params}
        if groups is None or groups == 0:
            cap, buckets, used = _bucket_bytes(), [], 0
            for p in reversed(params):
                nbytes = p.numel() * torch.empty(0, dtype=wire[p]).element_size()
                if not buckets or used + nbytes > cap or wire[buckets[-1][-1]] != wire[p]:
                    buckets.append([])
                    used = 0
                buckets[-1].append(p)
                used += nbytes
            return buckets
        if isinstance(groups, int):
            if groups < 0:
                raise ValueError("%s: groups must be a positive number or a list" % call)
            per = -(-len(params) // groups)
            chunks = [params[i:i + per] for i in range(0, len(params), per)]
        else:
            chunks = [list(g) for g in groups]
            listed = {p for g in chunks for p in g}
            if any(p not in set(params) for p in listed):
                raise ValueError("%s: groups name a parameter the optimizer does not hold" % call)
            chunks += [[p] for p in params if p not in listed]
        buckets = []
        for chunk in chunks:  # a group holding several dtypes travels as one bucket per dtype
            for dtype in sorted({wire[p] for p in chunk}, key=str):
                buckets.append([p for p in chunk if wire[p] == dtype])
        return [b for b in buckets if b]

    def _register_hooks(self):
        for p in self._params:
            # The hook of the gradient accumulator runs once the gradient has been added to
            # p.grad (torch 1.x and 2.x alike).
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            accumulator.register_hook(self._make_hook(p))
            self._hooks.append(accumulator)

    def _make_hook(self, p):
        def hook(*ignored):
            if self._delay[p] <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before "
                    "call to step(). Increase backward_passes_per_step to accumulate gradients "
                    "locally.")
            self._delay[p] -= 1
            if self._delay[p] == 0:
                b = self._bucket_of[p]
                self._ready[b] += 1
                self._post_ready()
        return hook

    def _reset(self):
        self._delay = {p: self._passes for p in self._params}
        self._ready = [0] * len(self._buckets)
        self._next = 0  # buckets go out in their order, so that every rank's calls match
        self._inflight = []

    def _post_ready(self):
        while (self._next < len(self._buckets)
               and self._ready[self._next] == len(self._buckets[self._next])):
            self._post(self._next)

    def _post(self, b, join_flag=0.0):
        grads, ctxs = [], []
        for p in self._buckets[b]:
            if p.grad is None:  # a parameter this pass did not reach counts as zeros
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
            elif p.grad.is_sparse:
                if not self._sparse_as_dense:
                    raise Unsupported("hvd.DistributedOptimizer: %s has a sparse gradient; pass "
                                      "sparse_as_dense=True" % self._names[p], Unsupported.code)
                p.grad = p.grad.to_dense()
            elif not p.grad.is_contiguous():
                p.grad = p.grad.contiguous()
            _checked(p.grad, "hvd.DistributedOptimizer")
            wire, ctx = self._compression.compress(p.grad)
            if wire is p.grad:
                _scaled(wire, self._prescale)
            elif self._prescale != 1.0:
                wire.mul_(self._prescale)
            grads.append(wire)
            ctxs.append(ctx)
        last = b == len(self._buckets) - 1
        if last:
            # One more element rides with the last bucket: how many ranks have joined (join()).
            grads.append(torch.full((1,), join_flag, dtype=grads[0].dtype))
        request = self._comm.iallreduce_many(grads, op=self._op)
        self._inflight.append((b, request, grads, ctxs))
        self._next = b + 1
        return grads[-1] if last else None

    def synchronize(self):
        """Finish every gradient's allreduce (starting those whose hook never ran, as zeros if
        the parameter has no gradient), leaving the averaged gradients in p.grad."""
        if self._comm.size == 1:
            self._synchronized = True
            return
        while self._next < len(self._buckets):
            self._post(self._next)
        try:
            for b, request, grads, ctxs in self._inflight:
                request.wait()
                for p, wire, ctx in zip(self._buckets[b], grads, ctxs):
                    if wire is p.grad:
                        _scaled(wire, self._postscale)
                    else:
                        out = self._compression.decompress(wire, ctx)
                        p.grad.copy_(out if self._postscale == 1.0 else out * self._postscale)
        finally:
            self._reset()
        self._synchronized = True
        _synchronized.append(weakref.ref(self))
        del _synchronized[:-64]

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() without synchronizing again, after an explicit synchronize() (for clipping)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(): the gradients are "
                              "allreduced again")
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._inflight or any(d != self._passes for d in self._delay.values()):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super().zero_grad(*args, **kwargs)

    def _join_round(self):
        """One step's calls with zeros, as a rank that joined makes them; returns how many ranks
        have joined."""
        for p in self._params:
            if p.grad is None:
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
            else:
                p.grad.zero_()
        self._reset()
        joined = None
        for b in range(len(self._buckets)):
            flag = self._post(b, join_flag=1.0)
            joined = flag if flag is not None else joined
        for _, request, _, _ in self._inflight:
            request.wait()
        self._reset()
        value = float(joined.float().item())
        return int(round(value * self._comm.size if self._op == Average else value))


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wrap optimizer so that step() applies gradients averaged over every rank (Horovod's
    semantics): a hook on each parameter starts its bucket's allreduce (non-blocking, through hoop)
    as soon as backward has produced the bucket's last gradient, while backward goes on; step()
    waits for them, then steps. Buckets are fixed and go out in one order on every rank, so no
    coordinator is needed. The result is an instance of the optimizer's own class."""
    call = "hvd.DistributedOptimizer"
    _process_set(process_set, call)
    if groups is None and num_groups:
        groups = num_groups
    base = optimizer.__class__
    cls = type(base.__name__, (_DistributedMixin, base), {"__module__": base.__module__})
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense)


def join(device=-1):
    """Say this rank has no more data: until every rank has joined, take part in the other ranks'
    DistributedOptimizer steps with zero gradients (uneven inputs end without a hang). Returns the
    rank that joined last. Other calls made by ranks that have not joined (a metric's allreduce)
    are not matched and fail with hoop.Mismatch or a timeout."""
    call = "hvd.join"
    comm = _live(call)
    if comm.size == 1:
        return comm.rank
    active = _join_cycle(comm)
    rounds = 0
    while True:
        rounds += 1
        if active:
            joined = [o._join_round() for o in active][-1]
        else:
            flag = torch.ones(1, dtype=torch.int32)
            comm.allreduce(flag)
            joined = int(flag.item())
        if joined >= comm.size:
            break
    last = torch.tensor([comm.rank if rounds == 1 else -1], dtype=torch.int64)
    comm.allreduce(last, op="max")
    return int(last.item())


def _join_cycle(comm):
    """The optimizers whose steps a joined rank repeats: those that synchronized since the latest
    one last synchronized before (the loop's cycle; usually one optimizer)."""
    log = [ref() for ref in _synchronized]
    log = [o for o in log if o is not None and o._comm is comm and o._buckets]
    if not log:
        return []
    latest = log[-1]
    earlier = [i for i, o in enumerate(log[:-1]) if o is latest]
    return log[earlier[-1] + 1:] if earlier else [latest]


# What Horovod raises where hoop does too (for `except hvd.HorovodInternalError`).
HorovodInternalError = HoopError
