"""hoop.torch: Python objects between ranks (broadcast_object, allgather_object), pickled.

These two calls, like Horovod's and torch.distributed's *_object calls, unpickle what peers send:
a member of the job can make them run code on this rank. Use them only among ranks you trust with
your user's rights; hoop.torch's other calls never unpickle a peer's bytes (see _plain.py)."""

import pickle

import torch

from ._plain import _bounded, _widest
from ._ops import global_process_set
from ._sets import _process_set, _set_root


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's obj (anything pickle takes, tensors included), on every rank. Unpickles the
    root's bytes: the root can run code on every rank (trust your peers)."""
    call = "hvd.broadcast_object"
    comm = _process_set(process_set, call)
    root_rank = _set_root(root_rank, process_set, comm, call)
    if comm.rank == root_rank:
        data = bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        length = torch.tensor([len(data)], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    comm.broadcast(length, root=root_rank)
    if comm.rank != root_rank:
        _bounded([int(length.item())], call)
        data = bytearray(int(length.item()))
    comm.broadcast(data, root=root_rank, dtype="uint8")
    return pickle.loads(data)


def allgather_object(obj, name=None, process_set=global_process_set):
    """A list of every rank's obj, in rank order. Unpickles every peer's bytes: any rank can run
    code on every other (trust your peers)."""
    call = "hvd.allgather_object"
    return _allgather_object(obj, _process_set(process_set, call), call)


def _allgather_object(obj, comm, call):
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    lengths = torch.empty(comm.size, dtype=torch.int64)
    comm.allgather(torch.tensor([len(data)], dtype=torch.int64), lengths)
    lengths = lengths.tolist()
    widest = _widest(lengths, call)
    every = bytearray(widest * comm.size)
    comm.allgather(bytearray(data.ljust(widest, b"\0")), every, dtype="uint8")
    return [pickle.loads(bytes(every[r * widest:r * widest + n])) for r, n in enumerate(lengths)]
