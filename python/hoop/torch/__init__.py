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
other's GPU memory by CUDA IPC, other ranks stage through host memory). What Horovod has and hoop
does not (Adasum) raises an error naming it. Process sets are sub-communicators of the job's,
running at the same time as the job's calls; hvd.elastic goes on after lost ranks (shrink) and
takes in newcomers (grow). allreduce, allgather, broadcast, alltoall and reducescatter record a
backward pass for a tensor that requires grad, by Horovod's rules (_autograd).

Failing well: ``broadcast_parameters``, ``broadcast_optimizer_state`` and ``DistributedOptimizer``
check that every rank has the same tensor names, shapes and dtypes, and otherwise raise
``hoop.Mismatch`` on every rank naming the first difference and the ranks; an exception that ends
one rank makes every other rank's next hoop call raise ``hoop.Aborted`` ("aborted by rank R: ...");
a rank that dies becomes ``hoop.PeerLost`` naming it.

Differences from Horovod that a program may meet: names (``name=``) are not negotiated; hoop
matches calls in the order each rank posts them and compares their names, so calls posted in
another order with different names raise ``hoop.Mismatch`` on every rank naming both, where Horovod
would reorder them. ``broadcast_object`` and ``allgather_object`` unpickle what peers send (as
Horovod's do: use them among ranks you trust); every other call exchanges only integers and plain
values (_plain), so hvd.elastic's ``ObjectState`` attributes must be None, bool, int, float, str,
bytes, tensors, or lists, tuples and dicts of them. After ``hvd.join()`` a rank repeats the
training loop's last cycle of calls (between its two latest DistributedOptimizer steps) where
Horovod negotiates each call, so the loop must make the same calls every step; sparse gradients
need ``sparse_as_dense=True``; Adasum and the
timeline raise hoop.Unsupported naming what to use. The README's PyTorch section tables every
difference from Horovod and torch.distributed that remains.

The package is split by responsibility: _ops (op names), _sets (process sets), _compression, _job
(init, rank, size; the one module that holds the communicator), _handles (poll, synchronize),
_collectives (allreduce, broadcast, allgather, alltoall, reducescatter, barrier), _autograd
(their backward passes), _objects
(the pickled object calls), _plain (values between ranks without pickle), _params (broadcast_parameters, broadcast_optimizer_state, the same-model check), _optimizer
(DistributedOptimizer), _join, _syncbn (SyncBatchNorm), _hooks (a DistributedDataParallel comm hook with hoop's
compression), _elastic (hvd.elastic), _sampler (its ElasticSampler) and _backend
(the torch.distributed backend, with _works, its Work objects, and _groups, its pg_options and the
end of a group). This module re-exports their public names.
"""

from .. import (Aborted, HoopError, InvalidArgument, Mismatch, PeerLost,  # noqa: F401
                Timeout, Unsupported)
from ._backend import ProcessGroupHoop  # registers the torch.distributed backend "hoop"
from ._ops import Adasum, Average, Max, Min, Product, Sum, global_process_set
from ._compression import (BF16Compressor, Compression, Compressor,  # noqa: F401
                           FP8Compressor, FP16Compressor, Int8Compressor, NoneCompressor,
                           WireBF16Compressor)
from ._job import init, is_initialized, local_rank, local_size, rank, shutdown, size, stats
# Horovod's names that hoop answers with False, or refuses with hoop.Unsupported naming them.
from ._job import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built,  # noqa: F401
                   elastic, gloo_built, gloo_enabled, mpi_built, mpi_enabled,
                   mpi_threads_supported, nccl_built, rocm_built, start_timeline, stop_timeline)
from ._sets import ProcessSet, add_process_set, remove_process_set
from ._handles import poll, synchronize
from ._collectives import (allgather, allgather_async, allreduce, allreduce_, allreduce_async,
                           allreduce_async_, alltoall, alltoall_async, barrier, broadcast,
                           broadcast_, broadcast_async, broadcast_async_, grouped_allgather,
                           grouped_allgather_async, grouped_allreduce, grouped_allreduce_,
                           grouped_allreduce_async, grouped_allreduce_async_,
                           grouped_reducescatter, grouped_reducescatter_async, reducescatter,
                           reducescatter_async)
from ._objects import allgather_object, broadcast_object
from ._params import broadcast_optimizer_state, broadcast_parameters
from ._optimizer import DistributedOptimizer
from ._join import join
from ._syncbn import SyncBatchNorm
from ._hooks import HookState, allreduce_hook

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "allgather",
    "allgather_async", "grouped_allgather", "grouped_allgather_async", "alltoall",
    "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "synchronize", "poll", "barrier", "join", "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "allgather_object", "DistributedOptimizer", "Compression", "Average", "Sum",
    "Min", "Max", "Product", "Adasum", "HoopError", "Aborted", "PeerLost", "Mismatch", "Timeout",
    "ProcessGroupHoop", "global_process_set", "ProcessSet", "add_process_set",
    "remove_process_set", "SyncBatchNorm", "stats", "HookState", "allreduce_hook",
]

# What Horovod raises where hoop does too (for `except hvd.HorovodInternalError`).
HorovodInternalError = HoopError
