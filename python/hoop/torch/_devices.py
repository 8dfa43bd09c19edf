"""What torch 2.x asks of a process group by device, for the hoop backend (_backend): the backend
behind a device (ProcessGroup._get_backend, which init_process_group(device_id=...), new_group,
split_group and batch_isend_irecv call), split_group, and coalescing (batch_isend_irecv's).

A group written in Python has no C++ backends: torch's own getBackend raises "No backend type
associated with device type cuda". A hoop group serves every device itself, so _get_backend gives
a small object that says what it can do and leads back to the group."""

import datetime

import torch
import torch.distributed as dist

from .. import Unsupported


def _torch_at_least(major, minor):
    try:
        got = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return got >= (major, minor)


# split_group asks the parent group itself to split from torch 2.9 on; before, it takes NCCL's
# communicator-splitting path (2.5-2.7 NCCL only; 2.8 registers a C++ backend), which a group
# written in Python cannot serve.
SPLITS = _torch_at_least(2, 9)


class _DeviceBackend:
    """What ProcessGroup._get_backend(device) gives for a hoop group."""

    supports_coalescing = True
    supports_time_estimate = False  # torch's _time_estimator then raises NotImplementedError
    supports_shrinking = False

    def __init__(self, group):
        self._group = group

    def supports_tensor_alloc(self, device):
        """FSDP2's allocation from the process group: no, torch.empty serves."""
        return False

    @property
    def supports_splitting(self):
        return SPLITS

    @property
    def options(self):
        """The group's pg_options (torch copies them for split_group), with the _timeout torch's
        own options carry."""
        from ._groups import Options, _read_options
        reproducible, compress, encrypt = _read_options(getattr(self._group, "_options", None))
        options = Options(reproducible, compress, encrypt)
        options._timeout = datetime.timedelta(seconds=self._group._comm.timeout)
        return options

    def eager_connect_single_device(self, device):
        """init_process_group(device_id=...): hoop's connections are made at init already; the
        group remembers the device, as torch does for its own backends (bound_device_id, which
        split_group and DeviceMesh read)."""
        if SPLITS and device is not None:
            self._group.bound_device_id = device

    def perform_nocolor_split(self, device):
        """A rank outside a new group made by splitting: nothing to take part in (hoop's groups
        are made by their members alone)."""

    def comm_split_count(self):
        return getattr(self._group, "_splits", 0)

    def _set_sequence_number_for_group(self):
        pass

    # hoop's own methods, where torch 2.x programs reach a backend's (pg._get_backend(device)).
    def stats(self):
        return self._group.stats()

    def register(self, tensor):
        return self._group.register(tensor)

    def deregister(self, handle):
        self._group.deregister(handle)

    def name(self):
        return "hoop"

    def getBackendName(self):
        return "hoop"


def _get_backend(self, device=None):
    return _DeviceBackend(self)


def split_group(self, ranks, timeout=None, opts=None, group_name=None, group_desc=None, **_):
    """torch >= 2.9's ProcessGroup.split_group, which dist.split_group calls on every rank of the
    parent: a new group of the listed ranks (of this group), made by them alone over a
    sub-communicator; None on the ranks left out."""
    from ._backend import ProcessGroupHoop
    ranks = sorted(int(r) for r in ranks)
    self._splits = getattr(self, "_splits", 0) + 1
    if self.rank() not in ranks:
        return None
    comm = self._comm.create_group(ranks)
    store = getattr(self, "_store", None)
    if store is not None and group_name is not None:
        store = dist.PrefixStore(group_name, store)
    group = ProcessGroupHoop(store, comm.rank, comm.size, timeout, comm=comm, options=opts)
    if group_name is not None:
        group.setGroupName(group_name)
    if group_desc is not None:
        group.setGroupDesc(group_desc)
    return group


def _start_coalescing(self, device=None):
    """batch_isend_irecv on CUDA tensors (torch 2.0-2.6, and newer torch where a group says it
    supports coalescing) brackets its sends and receives with these: the calls between are posted
    as they come (hoop's are non-blocking), and _end_coalescing's Work completes them all."""
    if getattr(self, "_coalesced", None) is not None:
        raise Unsupported("hoop backend: coalescing already started on this group (the last "
                          "batch_isend_irecv did not end)", Unsupported.code)
    self._coalesced = []


def _end_coalescing(self, device=None):
    works, self._coalesced = getattr(self, "_coalesced", None) or [], None

    def then():
        for work in works:
            work._complete()
            if work._error is not None:
                raise work._error

    return self._work([r for work in works for r in work._requests],
                      [t for work in works for t in (work._result or [])], then)


def _refuse_split(split):
    """dist.split_group before torch 2.9 on a hoop group: torch takes NCCL's path there."""
    def split_group(parent_pg=None, *args, **kwargs):
        from ._backend import ProcessGroupHoop
        parent = parent_pg
        if parent is None and dist.is_initialized():
            parent = dist.distributed_c10d._get_default_group()
        if isinstance(parent, ProcessGroupHoop):
            raise NotImplementedError(
                "hoop backend: split_group needs torch 2.9 or later (this is %s, whose "
                "split_group serves NCCL's communicators only); use new_group(ranks), which "
                "makes the same group" % torch.__version__)
        return split(parent_pg, *args, **kwargs)
    split_group._hoop_wrapped = True
    return split_group


def install(cls):
    split = getattr(dist, "split_group", None)
    if split is not None and not SPLITS and not getattr(split, "_hoop_wrapped", False):
        dist.split_group = dist.distributed_c10d.split_group = _refuse_split(split)
    cls._get_backend = _get_backend
    cls.split_group = split_group
    cls._start_coalescing = _start_coalescing
    cls._end_coalescing = _end_coalescing
