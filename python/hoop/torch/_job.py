"""hoop.torch: the job (init, shutdown, rank, size), and what Horovod has and hoop does not.

This module holds the communicator of the Horovod API (_comm, bound by init() and shutdown()).
The others ask _live() for it, never keep a copy of their own.
"""

import os

import torch

from .. import InvalidArgument, Unsupported, _shared_comm
from . import _cycle, _handles


_comm = None


# A newcomer to an elastic job (hooprun --max-np's replacement: HOOP_JOIN=1) until its first
# hvd.elastic.run sync: the members are in that sync meanwhile, so it makes no call of its own
# before (DistributedOptimizer's check of the model waits for the sync's).
newcomer_unsynced = False


def init(comm=None, process_sets=None):
    """Join the job hooprun started (a job of one rank when started alone)."""
    global _comm, newcomer_unsynced
    if comm is not None:
        raise Unsupported("hvd.init: an MPI communicator is not supported by hoop (start the "
                          "ranks with hooprun)", Unsupported.code)
    if _comm is None or _comm._handle is None:
        _comm = _shared_comm()
        newcomer_unsynced = os.environ.get("HOOP_JOIN") == "1" and _comm.generation > 0
    # As the torch backend does: deterministic algorithms ask for reductions whose bits do not
    # change from run to run (hoop(3), "Reproducible reductions").
    if torch.are_deterministic_algorithms_enabled():
        _comm.reproducible = True
    if process_sets:
        from ._sets import add_process_set
        for process_set in process_sets:
            add_process_set(process_set)


def shutdown():
    """Leave the job (waits for outstanding calls first)."""
    global _comm
    if _comm is not None:
        _handles._handles.clear()
        from ._sets import _forget_all
        _forget_all()
        _cycle.clear()
        _comm.finalize()
        _comm = None


def is_initialized():
    return _comm is not None and _comm._handle is not None


def _live(call):
    if not is_initialized():
        raise ValueError("%s: hoop.torch has not been initialized; call hvd.init() first" % call)
    return _comm


def _root(root_rank, comm, call):
    if not isinstance(root_rank, int) or not 0 <= root_rank < comm.size:
        raise InvalidArgument("%s: root_rank %r is not a rank of this job (0 to %d)"
                              % (call, root_rank, comm.size - 1), InvalidArgument.code)


def rank():
    return _live("hvd.rank").rank


def size():
    return _live("hvd.size").size


def local_rank():
    return _live("hvd.local_rank").local_rank


def local_size():
    return _live("hvd.local_size").local_size


def cross_rank():
    """Horovod's: this rank's index among the ranks whose local rank is its own (on hosts that
    each run the same number of ranks, this host's index)."""
    return _live("hvd.cross_rank").cross_rank


def cross_size():
    """Horovod's: the number of ranks whose local rank is this rank's (the number of hosts, on
    hosts that each run the same number of ranks)."""
    return _live("hvd.cross_size").cross_size


def stats():
    """hoop's own, not Horovod's: what this rank measured of the job's calls and the rendezvous
    server's word on which ranks come late (hoop.Communicator.stats; hoop(3), "Finding the slow
    rank")."""
    return _live("hvd.stats").stats()


def mpi_threads_supported():
    return False


def _built_false():
    return False


mpi_built = mpi_enabled = gloo_built = gloo_enabled = nccl_built = ddl_built = ccl_built = \
    rocm_built = _built_false


def cuda_built():
    """True where hoop's collectives take CUDA tensors: libhoop was built with CUDA and the driver
    loads (hoop.cuda_supported()), which is what Horovod programs ask cuda_built() before they
    hand it GPU tensors."""
    from .. import cuda_supported
    return cuda_supported()


def _unsupported(name, why):
    def refuse(*args, **kwargs):
        raise Unsupported("hvd.%s is not supported by hoop: %s" % (name, why), Unsupported.code)
    refuse.__name__ = name
    return refuse


for _name, _why in (("start_timeline", "use HOOP_TRACE=FILE for a Chrome trace"),
                    ("stop_timeline", "use HOOP_TRACE=FILE for a Chrome trace")):
    globals()[_name] = _unsupported(_name, _why)


class _Elastic:
    """hvd.elastic: the names of _elastic, loaded when first used (it needs _params, which needs
    this module)."""

    def __getattr__(self, name):
        from . import _elastic
        if name not in _elastic.__all__:
            raise AttributeError("hvd.elastic has no %s" % name)
        return getattr(_elastic, name)


elastic = _Elastic()
