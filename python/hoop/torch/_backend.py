"""hoop.torch's torch.distributed backend "hoop".

Importing hoop.torch registers the torch.distributed backend "hoop", so that a program written for
torch.distributed runs on hoop by naming it:

    import torch.distributed as dist
    import hoop.torch  # registers the backend
    dist.init_process_group("hoop")
    dist.all_reduce(tensor)                      # and broadcast, all_gather, barrier
    work = dist.all_reduce(tensor, async_op=True); work.wait()

Nothing here is compiled against torch: the process group is a Python subclass of torch's
ProcessGroup, over hoop's non-blocking calls (so the same file serves Debian's torch 1.13 and
torch 2.x). Tensors live on the CPU, or on a GPU where libhoop takes CUDA buffers. Calls the backend does not have raise
NotImplementedError naming the call.
"""

import datetime
import queue
import threading

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, Work

from .. import HoopError, _shared_comm

__all__ = ["ProcessGroupHoop"]


def _op_name(op, call):
    table = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "prod", dist.ReduceOp.MIN: "min",
             dist.ReduceOp.MAX: "max"}
    if hasattr(dist.ReduceOp, "AVG"):
        table[dist.ReduceOp.AVG] = "avg"
    for known, name in table.items():
        if op == known:
            return name
    raise NotImplementedError("hoop backend: %s with reduce op %s is not supported (SUM, PRODUCT, "
                              "MIN, MAX, AVG are)" % (call, op))


class _Work(Work):
    """One collective of the process group: hoop requests, and what to do once they complete.

    Its future (get_future, which DistributedDataParallel chains its bucket's work on) completes
    when the collective does, set by the completer thread; so backward goes on while the
    collective runs on hoop's progress thread."""

    def __init__(self, group, requests, result, then=None):
        super().__init__()
        self._group = group
        self._requests = requests
        self._result = result
        self._then = then
        self._error = None
        self._done = False
        self._future = None
        self._lock = threading.Lock()  # one thread at a time completes the requests

    def _complete(self):
        with self._lock:
            if self._done:
                return
            try:
                for request in self._requests:
                    request.wait()
                if self._then:
                    self._then()
            except HoopError as err:
                self._error = err
            self._done = True
        self._group._forget(self)

    def is_completed(self):
        if self._done:
            return True
        if not self._lock.acquire(blocking=False):
            return False  # the completer thread is waiting for it
        try:
            ready = all(request.test() for request in self._requests)
        except HoopError:
            ready = True  # failed: _complete records the error
        finally:
            self._lock.release()
        if ready:
            self._complete()
        return self._done

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def wait(self, timeout=datetime.timedelta(0)):
        self._complete()
        if self._error is not None:
            raise RuntimeError("hoop backend: %s" % self._error) from self._error
        return True

    def synchronize(self):
        self.wait()

    def result(self):
        self.wait()
        return self._result

    def get_future(self):
        if self._future is None:
            self._future = torch.futures.Future()
            _completer.add(self)
        return self._future

    def _settle(self):
        """On the completer thread: complete, then set the future."""
        try:
            self.wait()
            self._future.set_result(self._result)
        except RuntimeError as err:
            self._future.set_exception(err)


class _Completer:
    """A daemon thread that completes the works whose futures were asked for, in order, blocked in
    hoop_wait (which ctypes runs without the GIL)."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()

    def add(self, work):
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hoop-futures",
                                                daemon=True)
                self._thread.start()
        self._queue.put(work)

    def _run(self):
        while True:
            self._queue.get()._settle()


_completer = _Completer()


class ProcessGroupHoop(ProcessGroup):
    """torch.distributed's process group over a hoop Communicator (hoop.init())."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._comm = _shared_comm()
        if self._comm.rank != rank or self._comm.size != size:
            raise RuntimeError("hoop backend: torch.distributed says rank %d of %d, hoop's job "
                               "says rank %d of %d (start the ranks with hooprun, or give both "
                               "the same RANK and WORLD_SIZE)"
                               % (rank, size, self._comm.rank, self._comm.size))
        self._pending = []  # the Work objects alive until they complete (see PYTHON.md)

    def _forget(self, work):
        if work in self._pending:
            self._pending.remove(work)

    def _work(self, requests, result, then=None):
        work = _Work(self, requests, result, then)
        self._pending.append(work)
        return work

    def getBackendName(self):
        return "hoop"

    def name(self):
        return "hoop"

    # -- the collectives --

    def allreduce(self, tensors, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "all_reduce")
        requests = [self._comm.iallreduce(t, op=op) for t in tensors]
        return self._work(requests, tensors)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        requests = [self._comm.ibroadcast(t, root=root) for t in tensors]
        return self._work(requests, tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        requests, copies = [], []
        for outputs, tensor in zip(output_tensors, input_tensors):
            if len(outputs) != self.size():
                raise ValueError("hoop backend: all_gather needs %d output tensors, got %d"
                                 % (self.size(), len(outputs)))
            flat = torch.empty((self.size(),) + tuple(tensor.shape), dtype=tensor.dtype,
                               device=tensor.device)
            requests.append(self._comm.iallgather(tensor.contiguous(), flat))
            copies.append((outputs, flat))

        def scatter_back():
            for outputs, flat in copies:
                for r, out in enumerate(outputs):
                    out.copy_(flat[r])

        return self._work(requests, output_tensors, scatter_back)

    def _allgather_base(self, output, tensor, opts=None):
        return self._work([self._comm.iallgather(tensor.contiguous(), output)], [output])

    def barrier(self, opts=None):
        return self._work([self._comm.ibarrier()], [])


def _unsupported(call):
    def refuse(self, *args, **kwargs):
        raise NotImplementedError("hoop backend: %s is not supported (all_reduce, broadcast, "
                                  "all_gather and barrier are)" % call)
    refuse.__name__ = call
    return refuse


for _call in ("reduce", "gather", "scatter", "reduce_scatter", "_reduce_scatter_base", "alltoall",
              "alltoall_base", "send", "recv", "recv_anysource", "allreduce_coalesced",
              "allgather_coalesced", "monitored_barrier"):
    setattr(ProcessGroupHoop, _call, _unsupported(_call))


def _create(store, rank, size, timeout, *rest):
    return ProcessGroupHoop(store, rank, size, timeout)


if "hoop" not in dict(dist.Backend.__members__ if hasattr(dist.Backend, "__members__") else {}):
    try:
        # torch 2.x asks which devices a backend serves (and warns when not told); 1.13 has no such
        # argument.
        import inspect
        if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
            dist.Backend.register_backend("hoop", _create, devices=["cpu", "cuda"])
        else:
            dist.Backend.register_backend("hoop", _create)
    except (RuntimeError, ValueError) as err:  # registered already (a second import)
        if "already" not in str(err).lower():
            raise
