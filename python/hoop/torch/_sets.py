"""hoop.torch: Horovod's process sets, each a sub-communicator of the job's (hoop_comm_split).

Every rank registers a process set (hvd.add_process_set, or hvd.init(process_sets=...)) at the
same point, the ranks outside it too, as Horovod requires; its members then run collectives on it
with process_set=, at the same time as the job's and other sets' calls. As in Horovod, the
root_rank of a broadcast on a set is a rank of the job (a member of the set), while the set's own
rank() counts from 0 in the set's order.
"""

from .. import InvalidArgument
from ._job import _live, _root
from ._ops import _GlobalProcessSet, global_process_set


class ProcessSet:
    """A set of the job's ranks (sorted) on which collectives may run (process_set=...)."""

    def __init__(self, ranks):
        self.ranks = sorted(int(r) for r in ranks)
        if len(set(self.ranks)) != len(self.ranks) or not self.ranks:
            raise InvalidArgument("hvd.ProcessSet: %s is not a list of distinct ranks"
                                  % list(ranks), InvalidArgument.code)
        self.process_set_id = None
        self._comm = None

    def __repr__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)

    def included(self):
        """Whether this rank is in the set."""
        return _live("hvd.ProcessSet.included").rank in self.ranks

    def size(self):
        return len(self.ranks)

    def rank(self):
        """This rank's rank in the set (None outside it)."""
        me = _live("hvd.ProcessSet.rank").rank
        return self.ranks.index(me) if me in self.ranks else None


_next_id = [1]
_registered = {}


def add_process_set(process_set):
    """Register a process set (a ProcessSet or a list of ranks) on every rank: all ranks call it,
    in the same order. Returns the ProcessSet."""
    call = "hvd.add_process_set"
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise InvalidArgument("%s: %r is registered already" % (call, process_set),
                              InvalidArgument.code)
    comm = _live(call)
    for r in process_set.ranks:
        if not 0 <= r < comm.size:
            raise InvalidArgument("%s: rank %d is not a rank of the job (0 to %d)"
                                  % (call, r, comm.size - 1), InvalidArgument.code)
    me = comm.rank
    inside = me in process_set.ranks
    process_set._comm = comm.split(0 if inside else None, process_set.ranks.index(me)
                                   if inside else 0)
    process_set.process_set_id = _next_id[0]
    _next_id[0] += 1
    _registered[process_set.process_set_id] = process_set
    return process_set


def remove_process_set(process_set):
    """Forget a registered process set (its members' sub-communicator is finalized). Returns
    whether it was registered."""
    if not isinstance(process_set, ProcessSet) or process_set.process_set_id not in _registered:
        return False
    del _registered[process_set.process_set_id]
    if process_set._comm is not None:
        process_set._comm.finalize()
        process_set._comm = None
    process_set.process_set_id = None
    return True


def _forget_all():
    """At hvd.shutdown: the sets' sub-communicators go before the job's."""
    for process_set in list(_registered.values()):
        remove_process_set(process_set)


def _process_set(process_set, call):
    """The communicator a call with this process_set runs on."""
    if process_set is None or isinstance(process_set, _GlobalProcessSet):
        return _live(call)
    if not isinstance(process_set, ProcessSet):
        raise InvalidArgument("%s: %r is not a process set (hvd.global_process_set, or a "
                              "hvd.ProcessSet registered with hvd.add_process_set)"
                              % (call, process_set), InvalidArgument.code)
    if process_set.process_set_id is None:
        raise InvalidArgument("%s: %r is not registered (hvd.add_process_set)"
                              % (call, process_set), InvalidArgument.code)
    if process_set._comm is None:
        raise InvalidArgument("%s: this rank (%d) is not in %r" % (call, _live(call).rank,
                                                                  process_set),
                              InvalidArgument.code)
    return process_set._comm


def _set_root(root_rank, process_set, comm, call):
    """The rank in comm (process_set's communicator) of root_rank, a rank of the job as Horovod
    counts it; InvalidArgument when it is not one, or not a member of the set."""
    if process_set is None or isinstance(process_set, _GlobalProcessSet):
        _root(root_rank, comm, call)
        return root_rank
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or \
            root_rank not in process_set.ranks:
        raise InvalidArgument("%s: root_rank %r is not a member of %r (root_rank is a rank of "
                              "the job, as in Horovod)" % (call, root_rank, process_set),
                              InvalidArgument.code)
    return process_set.ranks.index(root_rank)


__all__ = ["ProcessSet", "add_process_set", "remove_process_set", "global_process_set"]
