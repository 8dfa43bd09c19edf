"""hoop.torch's torch.distributed backend "hoop".

Importing hoop.torch registers the torch.distributed backend "hoop", so that a program written for
torch.distributed runs on hoop by naming it:

    import torch.distributed as dist
    import hoop.torch  # registers the backend
    dist.init_process_group("hoop")
    dist.all_reduce(tensor)   # and every other collective, send/recv, new_group
    work = dist.all_reduce(tensor, async_op=True); work.wait()

Nothing here is compiled against torch: the process group is a Python subclass of torch's
ProcessGroup, over hoop's non-blocking calls (so the same file serves Debian's torch 1.13 and
torch 2.x). Tensors live on the CPU, or on a GPU where libhoop takes CUDA buffers. The few calls
the backend does not have raise NotImplementedError naming the call and what to use instead; the
README's PyTorch section tables every difference from gloo and NCCL that remains (abort ends every
group of the job; the default group's communicator outlives destroy_process_group; split_group
from torch 2.9).
"""

import os

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

from .. import _shared_comm
from . import _devices
from ._groups import Options, _Ended, _read_options, _wrap_destroy
from ._works import _Work

__all__ = ["ProcessGroupHoop"]


def _op_name(op, call):
    table = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "prod", dist.ReduceOp.MIN: "min",
             dist.ReduceOp.MAX: "max", dist.ReduceOp.BAND: "band", dist.ReduceOp.BOR: "bor",
             dist.ReduceOp.BXOR: "bxor"}
    if hasattr(dist.ReduceOp, "AVG"):
        table[dist.ReduceOp.AVG] = "avg"
    for known, name in table.items():
        if op == known:
            return name
    raise NotImplementedError("hoop backend: %s with reduce op %s is not supported (SUM, PRODUCT, "
                              "MIN, MAX, AVG, BAND, BOR, BXOR and PREMUL_SUM are)" % (call, op))


def _reduction(opts, call):
    """hoop's op for opts.reduceOp, and the factor PREMUL_SUM multiplies every input by before it
    sums them (None for the other ops)."""
    op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
    premul = getattr(dist.ReduceOp, "PREMUL_SUM", None)
    if premul is None or not op == premul:
        return _op_name(op, call), None
    # torch keeps the factor in C++; from 2.x a ReduceOp's pickled state carries it ((op, factor),
    # the factor a float or a one-element tensor). Torch 1.13 gives a Python group no way to it.
    try:
        state = op.__getstate__()
    except (AttributeError, RuntimeError, TypeError):
        state = None
    if not isinstance(state, tuple) or len(state) != 2 or state[1] is None:
        raise NotImplementedError("hoop backend: %s with PREMUL_SUM: this torch (%s) does not let a "
                                  "process group written in Python read the factor; multiply the "
                                  "tensor by it and use SUM" % (call, torch.__version__))
    factor = state[1]
    return "sum", factor.item() if isinstance(factor, torch.Tensor) else float(factor)


def _premul(tensor, factor, in_place):
    """The input PREMUL_SUM sums: tensor times factor, in place where the result overwrites the
    tensor anyway, else in a copy (the caller's input stays as it was)."""
    if factor is None:
        return tensor
    return tensor.mul_(factor) if in_place else tensor * factor


class ProcessGroupHoop(ProcessGroup):
    """torch.distributed's process group over a hoop Communicator: the job's (hoop.init()) for
    the default group, a sub-communicator of it (hoop_comm_create_group) for a new_group."""

    Options = Options

    def __init__(self, store, rank, size, timeout, comm=None, options=None):
        reproducible, compress, encrypt = _read_options(options)  # before anything is made
        super().__init__(rank, size)
        self._store, self._options = store, options  # for split_group (_devices)
        self._owns_comm = comm is not None  # a new_group's own; else the job's, shared with hvd
        self._comm = comm if comm is not None else _shared_comm(encrypt)
        if encrypt is not None and self._comm.encrypt != encrypt:
            raise ValueError("hoop backend: pg_options' encrypt %r, but the job's connections were "
                             "made with HOOP_ENCRYPT=%s when it was joined (give the first group "
                             "the option, or set HOOP_ENCRYPT)" % (encrypt, self._comm.encrypt))
        if self._comm.rank != rank or self._comm.size != size:
            raise RuntimeError("hoop backend: torch.distributed says rank %d of %d, hoop's job "
                               "says rank %d of %d (start the ranks with hooprun, or give both "
                               "the same RANK and WORLD_SIZE)"
                               % (rank, size, self._comm.rank, self._comm.size))
        self._pending = []  # the Work objects alive until they complete (see PYTHON.md)
        seconds = _timeout_s(timeout)
        if seconds is not None:
            self._comm.timeout = seconds
        # torch.use_deterministic_algorithms(True) asks for results that do not change from run
        # to run: the group's reductions combine over hoop's fixed tree (hoop(3)).
        if torch.are_deterministic_algorithms_enabled():
            self._comm.reproducible = True
        if reproducible is not None:
            self._comm.reproducible = reproducible
        if compress is not None:
            self._comm.compress = compress

    @property
    def reproducible(self):
        """The group's reproducible mode (hoop.Communicator.reproducible): on where
        torch.use_deterministic_algorithms(True) was on when the group was made, or
        HOOP_REPRODUCIBLE=1; settable, alike on every member."""
        return self._comm.reproducible

    @reproducible.setter
    def reproducible(self, on):
        self._comm.reproducible = on

    def stats(self):
        """hoop's own: what this rank measured of the group's calls, and which ranks come late
        (hoop.Communicator.stats; ranks of the group)."""
        return self._comm.stats()

    def register(self, tensor):
        """hoop's own: register a tensor that many of the group's calls take as their input
        (hoop.Communicator.register), where error feedback ("+feedback" in the group's compress
        option) keeps what compression dropped, from one call to the next of the same shape.
        Returns a handle for deregister; the tensor must stay alive until then."""
        return self._comm.register(tensor)

    def deregister(self, handle):
        self._comm.deregister(handle)

    def shutdown(self):
        """torch 2.x's ProcessGroup.shutdown, which destroy_process_group calls (hoop.torch makes
        it do so on every torch): the group's outstanding works are waited for, then a
        new_group's communicator is freed. The default group's is the job's: it stays, shared with
        hvd and ready for another init_process_group (rank 0's rendezvous cannot be joined twice),
        and goes at hvd.shutdown() or exit. The group's calls then raise hoop.Failed."""
        if isinstance(self._comm, _Ended):
            return
        for work in list(self._pending):
            try:
                work.wait()
            except RuntimeError:
                pass
        self._pending.clear()
        # The store goes too: rank 0's serves the next init_process_group's port.
        self._store = None
        comm, self._comm = self._comm, _Ended("shut down (destroy_process_group)")
        if self._owns_comm:
            comm.finalize()
        else:
            global _default_made
            _default_made = False  # the next init_process_group's default group is the job's again

    def abort(self):
        """torch 2.x's ProcessGroup.abort, to leave a hang at once: hoop_abort on the group's
        communicator, whose connections are the job's, so every group of the job fails on every
        member (their current and next calls raise, naming this rank and the abort), where NCCL's
        fails only the group's own communicator. The group's calls then raise hoop.Failed."""
        if isinstance(self._comm, _Ended):
            return
        comm, self._comm = self._comm, _Ended("aborted")
        comm.abort("the process group was aborted on rank %d (ProcessGroup.abort)" % comm.rank)

    def _forget(self, work):
        if work in self._pending:
            self._pending.remove(work)

    def _work(self, requests, result, then=None):
        work = _Work(self, requests, result, then)
        self._pending.append(work)
        if getattr(self, "_coalesced", None) is not None:  # between _start/_end_coalescing
            self._coalesced.append(work)
        return work

    def get_group_store(self):
        """The store torch gave the group (torch 2.x keeps it per group; a Python group's C++
        side has none)."""
        return self._store

    def getBackendName(self):
        return "hoop"

    def name(self):
        return "hoop"

    # torch 2.x names every group, and DeviceMesh (so FSDP2 and DTensor) and the functional
    # collectives find a group by its name. torch keeps the name in a group's C++ backends, and a
    # process group written in Python has none ("ProcessGroup name not set"): the name lives
    # here. Python asks through _set_group_name and group_name; torch's C++ through the
    # trampoline's getGroupName and setGroupName.
    def setGroupName(self, name):
        self._hoop_group_name = name

    def getGroupName(self):
        name = getattr(self, "_hoop_group_name", None)
        if name is None:
            raise RuntimeError("hoop backend: this process group has no name yet (torch names a "
                               "group when init_process_group or new_group makes it)")
        return name

    def setGroupDesc(self, desc):
        self._hoop_group_desc = desc

    def getGroupDesc(self):
        return getattr(self, "_hoop_group_desc", "undefined")

    _set_group_name = setGroupName
    _set_group_desc = setGroupDesc
    group_name = property(getGroupName)
    group_desc = property(getGroupDesc)

    # -- the collectives --

    def allreduce(self, tensors, opts=None):
        op, factor = _reduction(opts, "all_reduce")
        requests = [self._comm.iallreduce(_premul(t, factor, True), op=op) for t in tensors]
        return self._work(requests, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        op, factor = _reduction(opts, "all_reduce_coalesced")
        tensors = [_premul(t, factor, True) for t in tensors]
        return self._work([self._comm.iallreduce_many(tensors, op=op)], tensors)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        requests = [self._comm.ibroadcast(t, root=root) for t in tensors]
        return self._work(requests, tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        requests, copies = [], []
        for outputs, tensor in zip(output_tensors, input_tensors):
            self._check_list("all_gather", "output tensors", outputs)
            flat = torch.empty((self.size(),) + tuple(tensor.shape), dtype=tensor.dtype,
                               device=tensor.device)
            requests.append(self._comm.iallgather(tensor.contiguous(), flat))
            copies.append((outputs, flat))
        return self._work(requests, output_tensors, _scatter_back(copies))

    def _allgather_base(self, output, tensor, opts=None):
        return self._work([self._comm.iallgather(tensor.contiguous(), output)], [output])

    # torch 2.x's functional collectives (DTensor's redistribute, FSDP2's full_tensor) call these
    # from C++, where a Python group's _allgather_base and _reduce_scatter_base are not seen.
    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        requests = [self._comm.iallgather(t.contiguous(), out) for out, t in zip(outputs, inputs)]
        return self._work(requests, outputs)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        op, factor = _reduction(opts, "reduce_scatter_tensor_coalesced")
        requests = [self._comm.ireduce_scatter(_premul(t.contiguous(), factor, False), out, op=op)
                    for out, t in zip(outputs, inputs)]
        return self._work(requests, outputs)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op, factor = _reduction(opts, "reduce_scatter")
        requests = []
        for out, inputs in zip(output_tensors, input_tensors):
            self._check_list("reduce_scatter", "input tensors", inputs)
            flat = _premul(torch.cat([t.reshape(-1) for t in inputs]), factor, True)
            requests.append(self._comm.ireduce_scatter(flat, out, op=op))
        return self._work(requests, output_tensors)

    def _reduce_scatter_base(self, output, tensor, opts=None):
        op, factor = _reduction(opts, "reduce_scatter_tensor")
        tensor = _premul(tensor.contiguous(), factor, False)
        return self._work([self._comm.ireduce_scatter(tensor, output, op=op)], [output])

    def alltoall_base(self, output, tensor, output_split_sizes, input_split_sizes, opts=None):
        tensor = tensor.contiguous()
        if not output_split_sizes and not input_split_sizes:
            return self._work([self._comm.ialltoall(tensor, output)], [output])
        # Splits count rows (the first dimension); hoop counts elements.
        n = self.size()
        send_rows = list(input_split_sizes) or [tensor.shape[0] // n] * n
        recv_rows = list(output_split_sizes) or [output.shape[0] // n] * n
        send_row = tensor[0].numel() if tensor.dim() > 0 and tensor.shape[0] else 1
        recv_row = output[0].numel() if output.dim() > 0 and output.shape[0] else 1
        if tensor.dim() > 1 or output.dim() > 1:
            send_row = tensor.numel() // max(tensor.shape[0], 1)
            recv_row = output.numel() // max(output.shape[0], 1)
        sendcounts = [r * send_row for r in send_rows]
        recvcounts = [r * recv_row for r in recv_rows]
        return self._work([self._comm.ialltoallv(tensor, sendcounts, output, recvcounts)],
                          [output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        self._check_list("all_to_all", "input tensors", input_tensors)
        self._check_list("all_to_all", "output tensors", output_tensors)
        send = torch.cat([t.reshape(-1) for t in input_tensors])
        recv = torch.empty(sum(t.numel() for t in output_tensors), dtype=send.dtype,
                           device=send.device)
        request = self._comm.ialltoallv(send, [t.numel() for t in input_tensors], recv,
                                        [t.numel() for t in output_tensors])

        def copy_out():
            at = 0
            for t in output_tensors:
                t.copy_(recv[at:at + t.numel()].view_as(t))
                at += t.numel()

        return self._work([request], output_tensors, copy_out)

    def reduce(self, tensors, opts=None):
        op, factor = _reduction(opts, "reduce")
        root = opts.rootRank if opts is not None else 0
        # Elsewhere than the root the tensor is only read: a scaled copy goes instead.
        at_root = self.rank() == root
        return self._work([self._comm.ireduce(_premul(t, factor, at_root), root=root, op=op)
                           for t in tensors], tensors)

    def gather(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        tensor = input_tensors[0].contiguous()
        if self.rank() == root:
            self._check_list("gather", "output tensors", output_tensors[0])
            flat = torch.empty((self.size(),) + tuple(tensor.shape), dtype=tensor.dtype,
                               device=tensor.device)
            request = self._comm.igather(tensor, flat, root=root)
            return self._work([request], output_tensors,
                              _scatter_back([(output_tensors[0], flat)]))
        return self._work([self._comm.igather(tensor, None, root=root)], output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        out = output_tensors[0]
        send = None
        if self.rank() == root:
            self._check_list("scatter", "input tensors", input_tensors[0])
            send = torch.cat([t.reshape(-1) for t in input_tensors[0]])
        return self._work([self._comm.iscatter(send, out, root=root)], output_tensors)

    def send(self, tensors, dstRank, tag=0):
        return self._work([self._comm.isend(t.contiguous(), dstRank, tag=tag) for t in tensors],
                          tensors)

    def recv(self, tensors, srcRank, tag=0):
        return self._work([self._comm.irecv(t, srcRank, tag=tag) for t in tensors], tensors)

    def barrier(self, opts=None):
        return self._work([self._comm.ibarrier()], [])

    def _check_list(self, call, what, tensors):
        if len(tensors) != self.size():
            raise ValueError("hoop backend: %s needs %d %s, got %d"
                             % (call, self.size(), what, len(tensors)))


def _scatter_back(copies):
    """Copy each row of a gathered flat tensor into its output tensor."""
    def run():
        for outputs, flat in copies:
            for r, out in enumerate(outputs):
                out.copy_(flat[r])
    return run


def _unsupported(call, instead):
    def refuse(self, *args, **kwargs):
        raise NotImplementedError("hoop backend: %s is not supported; %s" % (call, instead))
    refuse.__name__ = call
    return refuse


for _call, _instead in (
        ("recv_anysource", "receive from a named rank (hoop matches messages per pair, in order, "
                           "as NCCL does)"),
        ("allgather_coalesced", "all_gather each tensor, or all_gather_into_tensor one flat "
                                "tensor"),
        ("monitored_barrier", "barrier (a rank that does not come fails it within HOOP_TIMEOUT, "
                              "naming the rank)")):
    setattr(ProcessGroupHoop, _call, _unsupported(_call, _instead))


_devices.install(ProcessGroupHoop)

# The default group takes the job's communicator; every later group (new_group) is a
# sub-communicator of it, made by its members alone.
_default_made = False


def _group_comm(store, rank, size):
    """The members of a new group learn each other's ranks in the job through the group's own
    store (the creator's four-argument form passes no ranks, and this one route serves both
    forms), then make the sub-communicator together."""
    world = _shared_comm()
    store.set("hoop/job_rank/%d" % rank, str(world.rank))
    members = [int(store.get("hoop/job_rank/%d" % r)) for r in range(size)]
    return world.create_group(members)


def _timeout_s(timeout):
    """The seconds a group's calls may wait, from the timeout torch gives its backend
    (init_process_group's or new_group's): None to keep the communicator's, where torch gave none
    or gave its own default while HOOP_TIMEOUT is set (a user's setting, which torch's default
    does not override)."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
    default = getattr(getattr(dist, "constants", None), "default_pg_timeout", None)
    if seconds <= 0 or (timeout == default and os.environ.get("HOOP_TIMEOUT")):
        return None
    return seconds


def _create(store, rank, size, timeout, options=None):
    global _default_made
    _read_options(options)  # a bad pg_options fails before a communicator is made
    if not _default_made:
        _default_made = True
        return ProcessGroupHoop(store, rank, size, timeout, options=options)
    return ProcessGroupHoop(store, rank, size, timeout, comm=_group_comm(store, rank, size),
                            options=options)


def _create_extended(backend_options, pg_options):
    """The creator under register_backend(extended_api=True), which hands it the pg_options of
    init_process_group and new_group (torch 1.13 and 2.x alike)."""
    return _create(backend_options.store, backend_options.group_rank, backend_options.group_size,
                   backend_options.timeout, pg_options)


if not getattr(dist.destroy_process_group, "_hoop_wrapped", False):
    dist.destroy_process_group = dist.distributed_c10d.destroy_process_group = \
        _wrap_destroy(dist.destroy_process_group, ProcessGroupHoop)


if "hoop" not in dict(dist.Backend.__members__ if hasattr(dist.Backend, "__members__") else {}):
    try:
        # torch 2.x asks which devices a backend serves (and warns when not told); 1.13 has no such
        # argument.
        import inspect
        _params = inspect.signature(dist.Backend.register_backend).parameters
        _extra = {"devices": ["cpu", "cuda"]} if "devices" in _params else {}
        if "extended_api" in _params:
            dist.Backend.register_backend("hoop", _create_extended, extended_api=True, **_extra)
        else:
            dist.Backend.register_backend("hoop", _create, **_extra)
    except (RuntimeError, ValueError) as err:  # registered already (a second import)
        if "already" not in str(err).lower():
            raise
