"""hoop.torch: hvd.SyncBatchNorm, batch normalization with statistics over every rank's batch.

In training, the mean and variance come from all the ranks' samples together (one allreduce of
each channel's sum, sum of squares and count), and backward reduces the two sums its input
gradient needs the same way; so a model normalizes exactly as it would on the global batch in one
process. The weight and bias gradients stay each rank's own, for DistributedOptimizer (or an
allreduce) to average as it does every other gradient. Works on CPU tensors (torch 1.13's
torch.nn.SyncBatchNorm takes only GPU ones) and on CUDA tensors. In eval mode, or on one rank, it
is torch's BatchNorm. A rank that has joined (hvd.join) adds nothing to the statistics: the others
normalize over their own samples.
"""

import torch

from . import _cycle, _job


def _channels_view(t, dim):
    return t.view((1, -1) + (1,) * (dim - 2))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum, comm):
        dims = [0] + list(range(2, input.dim()))
        channels = input.shape[1]
        local = torch.cat([input.sum(dims), (input * input).sum(dims),
                           torch.tensor([input.numel() // channels], dtype=input.dtype,
                                        device=input.device)])
        comm.allreduce(local, op="sum")
        _cycle.record("allreduce", [_cycle.spec(local)], "sum", None, None)  # for join()
        total = local[-1]
        mean = local[:channels] / total
        var = (local[channels:2 * channels] / total - mean * mean).clamp_(min=0)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(momentum * mean)
                unbiased = var * (total / (total - 1)) if total.item() > 1 else var
                running_var.mul_(1 - momentum).add_(momentum * unbiased)
        invstd = torch.rsqrt(var + eps)
        xhat = (input - _channels_view(mean, input.dim())) * _channels_view(invstd, input.dim())
        out = xhat
        if weight is not None:
            out = out * _channels_view(weight, input.dim()) + _channels_view(bias, input.dim())
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.total, ctx.comm = total.item(), comm
        return out

    @staticmethod
    def backward(ctx, grad_out):
        xhat, invstd, weight = ctx.saved_tensors
        dims = [0] + list(range(2, grad_out.dim()))
        channels = grad_out.shape[1]
        sum_dy = grad_out.sum(dims)
        sum_dy_xhat = (grad_out * xhat).sum(dims)
        grad_weight = sum_dy_xhat.clone() if weight is not None else None
        grad_bias = sum_dy.clone() if weight is not None else None
        both = torch.cat([sum_dy, sum_dy_xhat])
        ctx.comm.allreduce(both, op="sum")  # the input's gradient needs the global sums
        _cycle.record("allreduce", [_cycle.spec(both)], "sum", None, None)
        scale = invstd if weight is None else invstd * weight
        d = grad_out.dim()
        grad_input = _channels_view(scale / ctx.total, d) * (
            ctx.total * grad_out - _channels_view(both[:channels], d) -
            xhat * _channels_view(both[channels:], d))
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Horovod's SyncBatchNorm: BatchNorm over every rank's batch (see the module's
    description); takes BatchNorm1d/2d/3d's arguments."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("hvd.SyncBatchNorm: expected at least 2 dimensions, got %d"
                             % input.dim())

    def forward(self, input):
        self._check_input_dim(input)
        comm = _job._live("hvd.SyncBatchNorm") if _job.is_initialized() else None
        if not self.training or comm is None or comm.size == 1:
            return super().forward(input)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked)
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias,
            self.running_mean if self.track_running_stats else None,
            self.running_var if self.track_running_stats else None, self.eps, momentum, comm)
