"""hoop.torch: the same model everywhere: broadcast_parameters, broadcast_optimizer_state, and the
check that every rank has the same tensor names, shapes and dtypes (else hoop.Mismatch)."""

import torch

from .. import Mismatch, ProtocolError
from ._collectives import broadcast_async_
from ._handles import synchronize
from ._job import _live, _root
from . import _plain


def _describe(entry):
    name, shape, dtype = entry
    return "%r (%s%s)" % (name, dtype.replace("torch.", ""), list(shape))


def _check_same(entries, comm, call):
    """Raise Mismatch on every rank unless every rank passed the same [(name, shape, dtype)],
    naming the first difference and the ranks. One allgather of a digest where they agree; the
    lists themselves (as plain values, never pickled) where they do not."""
    if comm.size == 1:
        return
    mine = [(str(n), [int(x) for x in s], str(d)) for n, s, d in entries]
    if _plain.digest_agrees(mine, comm, call):
        return
    every = _plain.allgather(mine, comm, call)
    for r, theirs in enumerate(every):
        if not isinstance(theirs, list) or any(
                not (isinstance(e, tuple) and len(e) == 3 and isinstance(e[0], str) and
                     isinstance(e[1], list) and isinstance(e[2], str)) for e in theirs):
            raise ProtocolError("%s: rank %d sent something other than a list of tensors' "
                                "names, shapes and dtypes" % (call, r), ProtocolError.code)
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
    state = _plain.broadcast(optimizer.state_dict() if comm.rank == root_rank else None,
                             root_rank, comm, call)
    if comm.rank != root_rank:
        optimizer.load_state_dict(state)


def _optimizer_entries(optimizer, names=None):
    entries = []
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            name = names.get(p) if names else None
            entries.append((name or "param_groups[%d][%d]" % (g, i), p.shape, p.dtype))
    return entries
