"""hoop.torch: a DistributedDataParallel communication hook that hands each gradient bucket to
hoop, with hoop's compression between hosts and error feedback::

    ddp = torch.nn.parallel.DistributedDataParallel(model)   # on the "hoop" backend, or gloo
    ddp.register_comm_hook(hvd.HookState(compression=hvd.Compression.int8), hvd.allreduce_hook)

Each bucket's average is hoop's allreduce on the bucket's own flat buffer, posted at once and
finished on a thread of its own, so backward goes on meanwhile, as with DDP's default. The
compression is one of hvd.Compression's:

- none: the bucket as it is (what DDP's own allreduce gives, over hoop's communicator);
- fp16, bf16: cast before the call and back after, divided by the ranks first, as torch's
  fp16_compress_hook and bf16_compress_hook do (the same bits as those hooks on the hoop backend);
- int8, fp8, wire_bf16: the bucket stays float32; hoop encodes it only where it crosses hosts
  (exact within a host, hoop(3), "Slow links"), every replica ends with the same bits, and what one
  step's encoding dropped is added to the next step's (the bucket's buffer is registered with the
  communicator, whose residual costs 4 bytes per element that crosses hosts).

torch's own hooks (fp16_compress_hook, bf16_compress_hook, powerSGD_hook) run unchanged on the hoop
backend too; this one is hoop's for its wire formats."""

import threading

import torch
import torch.distributed as dist

from .. import HoopError, InvalidArgument, _shared_comm
from ._compression import Compression, _CastCompressor
from ._works import _Work


class HookState:
    """What allreduce_hook needs: the compression (an hvd.Compression member) and the group whose
    ranks average the buckets (None for torch.distributed's default group, or the job's
    communicator where no group was made). It keeps each bucket's registration for error feedback;
    give each DistributedDataParallel model a state of its own."""

    def __init__(self, compression=Compression.none, process_group=None):
        if not (isinstance(compression, type) and hasattr(compression, "compress")):
            raise InvalidArgument("hvd.HookState: compression must be a member of hvd.Compression, "
                                  "not %r" % (compression,), InvalidArgument.code)
        self.compression = compression
        self.process_group = process_group
        self._buckets = {}  # bucket index -> (communicator, data_ptr, numel, registration)
        self._lock = threading.Lock()

    def _comm(self):
        from ._backend import ProcessGroupHoop
        group = self.process_group
        if group is None and dist.is_available() and dist.is_initialized():
            group = dist.group.WORLD
        if group is None:
            return _shared_comm()
        if isinstance(group, ProcessGroupHoop):
            return group._comm
        comm = _shared_comm()
        if group.size() == comm.size and group.rank() == comm.rank:
            return comm  # another backend's group of the whole job: hoop's job communicator
        raise InvalidArgument("hvd.allreduce_hook: a %s group of %d ranks is not hoop's; give "
                              "the hook a group of the \"hoop\" backend (new_group) or the whole "
                              "job" % (group.name(), group.size()), InvalidArgument.code)

    def _registered(self, comm, index, buf):
        """Bucket index's buffer registered with comm (anew when DDP rebuilt its buckets, which
        it does once, after the first step)."""
        with self._lock:
            held = self._buckets.get(index)
            if held is not None and held[:3] == (comm, buf.data_ptr(), buf.numel()):
                return
            if held is not None and held[0] is comm:
                try:
                    comm.deregister(held[3])
                except HoopError:
                    pass
            self._buckets[index] = (comm, buf.data_ptr(), buf.numel(), comm.register(buf))


def _buffer(bucket):
    return bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()


def allreduce_hook(state, bucket):
    """DistributedDataParallel's communication hook (register_comm_hook(state, allreduce_hook)):
    the bucket averaged over the group's ranks by hoop, compressed as state says. state may also
    be None or a process group, as torch's own hooks take (no compression then). Returns the
    torch.futures.Future of the averaged bucket."""
    if not isinstance(state, HookState):
        state = HookState(process_group=state)
    comm = state._comm()
    buf = _buffer(bucket)
    name = "ddp.bucket%d" % bucket.index()
    compression = state.compression
    wire_format = getattr(compression, "wire_format", None)
    if comm.size == 1:
        future = torch.futures.Future()
        future.set_result(buf)
        return future
    then = None
    if wire_format:
        state._registered(comm, bucket.index(), buf)
        request = comm.iallreduce(buf, op="avg", compress=wire_format + "+feedback", name=name)
    elif issubclass(compression, _CastCompressor) and buf.dtype != compression.wire:
        wire = buf.to(compression.wire).div_(comm.size)
        request = comm.iallreduce(wire, op="sum", name=name)
        then = lambda: buf.copy_(wire)  # noqa: E731
    else:
        request = comm.iallreduce(buf, op="avg", name=name)
    # The backend's Work, held by no group: its future is set once the request completes.
    return _Work(None, [request], buf, then).get_future()
