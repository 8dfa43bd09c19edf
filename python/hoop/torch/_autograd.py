"""hoop.torch: gradients through the collectives, by Horovod's backward rules.

hvd.allreduce, allgather, broadcast, alltoall and reducescatter, called on a tensor that requires
grad while autograd records, return a tensor whose backward pass is itself a collective (so every
rank must run backward through the same calls in the same order, as Horovod requires):

- allreduce: the gradient allreduced with the same op and scale factors;
- allgather: the gradient averaged over the ranks, and this rank's rows of it;
- broadcast: the gradient averaged over the ranks on the root, zero elsewhere;
- alltoall: the gradient's rows sent back where they came from (the reverse alltoall);
- reducescatter: the ranks' gradient rows gathered (divided by the rank count for Average, and
  scaled as the forward call was).

The in-place and asynchronous calls do not record (as in Horovod).
"""

import torch

from ._ops import Average, global_process_set
from ._sets import _process_set


def wants_grad(tensor):
    """Whether a call on tensor must record a backward pass."""
    return torch.is_grad_enabled() and isinstance(tensor, torch.Tensor) and tensor.requires_grad


def _c():
    from . import _collectives  # the collectives import this module lazily: no cycle
    return _collectives


def _factor(op, prescale, postscale, process_set, call):
    factor = prescale * postscale
    if op == Average:
        factor /= _process_set(process_set, call).size
    return factor


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale, postscale, process_set):
        ctx.args = (average, op, prescale, postscale, process_set)
        return _c().synchronize(_c().allreduce_async(tensor, average, name, op, prescale,
                                                     postscale, process_set))

    @staticmethod
    def backward(ctx, grad):
        average, op, prescale, postscale, process_set = ctx.args
        out = _c().synchronize(_c().allreduce_async(grad.contiguous(), average, None, op,
                                                    prescale, postscale, process_set))
        return (out,) + (None,) * 6


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows, ctx.process_set = tensor.shape[0], process_set
        return _c().synchronize(_c().allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        c, process_set = _c(), ctx.process_set
        averaged = c.synchronize(c.allreduce_async(grad.contiguous(), None, None, Average,
                                                   1.0, 1.0, process_set))
        rows = c.synchronize(c.allgather_async(torch.tensor([ctx.rows], dtype=torch.int64),
                                               None, process_set))
        me = _process_set(process_set, "hvd.allgather (backward)").rank
        offset = int(rows[:me].sum()) if me else 0
        return averaged.narrow(0, offset, ctx.rows), None, None


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _c().synchronize(_c().broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        c = _c()
        averaged = c.synchronize(c.allreduce_async(grad.contiguous(), None, None, Average, 1.0,
                                                   1.0, ctx.process_set))
        from ._job import rank  # a rank of the job, as root_rank is
        if rank() != ctx.root_rank:
            averaged.zero_()
        return averaged, None, None, None


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        out, received = _c().synchronize(_c().alltoall_async(tensor, splits, name, process_set))
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _received):
        back, _ = _c().synchronize(_c().alltoall_async(grad.contiguous(), ctx.received, None,
                                                       ctx.process_set))
        return back, None, None, None


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale, postscale):
        call = "hvd.reducescatter"
        ctx.process_set = process_set
        ctx.factor = _factor(_c()._op(None, op, call), prescale, postscale, process_set, call)
        return _c().synchronize(_c().reducescatter_async(tensor, name, op, process_set, prescale,
                                                         postscale))

    @staticmethod
    def backward(ctx, grad):
        gathered = _c().synchronize(_c().allgather_async(grad.contiguous(), None,
                                                         ctx.process_set))
        if ctx.factor != 1.0:
            gathered = gathered * ctx.factor
        return gathered, None, None, None, None, None


def allreduce(tensor, average, name, op, prescale, postscale, process_set=global_process_set):
    return _Allreduce.apply(tensor, average, name, op, prescale, postscale, process_set)


def allgather(tensor, name, process_set):
    return _Allgather.apply(tensor, name, process_set)


def broadcast(tensor, root_rank, name, process_set):
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def alltoall(tensor, splits, name, process_set):
    return _Alltoall.apply(tensor, splits, name, process_set)


def reducescatter(tensor, name, op, process_set, prescale, postscale):
    return _Reducescatter.apply(tensor, name, op, process_set, prescale, postscale)
