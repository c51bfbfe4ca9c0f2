"""ringd.torch.syncbn - batch normalization over the whole global batch,
on any device, through torch.distributed collectives.

    model = rdist.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DDP(model)          # in rdist.run's setup()

torch.nn.SyncBatchNorm does the same on CUDA (torch 1.13 refuses CPU
input: its statistics kernels exist on CUDA only) and works on the ringd
backend there too; this one is for CPU training, and for tests of what a
SyncBatchNorm model does under a view change, on machines without a GPU.

Forward, in training with a world of more than one: each rank's per-
channel count, sum and sum of squares (in float64) are summed over the
group in one allreduce; every rank normalizes with the global batch's
mean and biased variance, and updates its running statistics with the
global mean and unbiased variance, so they are equal on every rank (as
one process on the whole global batch would have them, up to rounding).
Backward: the per-channel sums of dy and dy * (x - mean) are summed in one
allreduce for the input's gradient; the weight's and bias's gradients are
this rank's own, which DDP then averages with the others'. Evaluation,
or a world of one, is plain batch_norm. The process group is the
module's (process_group=) or the default one, read at every forward: a
group made again after a view change is used as it is.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def _stats_dims(x):
    return [0] + list(range(2, x.dim()))


def _shape(x):
    return [1, -1] + [1] * (x.dim() - 2)


class _SyncBN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps,
                momentum, group):
        dims = _stats_dims(x)
        c = x.shape[1]
        xd = x.detach().double()
        local = torch.cat([xd.sum(dims), (xd * xd).sum(dims),
                           torch.tensor([float(x.numel() // c)],
                                        dtype=torch.float64)])
        dist.all_reduce(local, group=group)
        n = local[2 * c].item()
        if n <= 1:
            raise ValueError("SyncBatchNorm: %d value(s) per channel in the "
                             "global batch: need more than 1" % int(n))
        mean = local[:c] / n
        var = (local[c:2 * c] / n - mean * mean).clamp_(min=0.0)
        invstd = (var + eps).rsqrt()
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(
                (mean * momentum).to(running_mean.dtype))
        if running_var is not None:
            running_var.mul_(1 - momentum).add_(
                (var * (n / (n - 1)) * momentum).to(running_var.dtype))
        mean_t, invstd_t = mean.to(x.dtype), invstd.to(x.dtype)
        xhat = (x - mean_t.view(_shape(x))) * invstd_t.view(_shape(x))
        y = xhat
        if weight is not None:
            y = y * weight.view(_shape(x))
        if bias is not None:
            y = y + bias.view(_shape(x))
        ctx.save_for_backward(xhat, weight, invstd_t)
        ctx.n, ctx.group, ctx.has_bias = n, group, bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        xhat, weight, invstd = ctx.saved_tensors
        dims = _stats_dims(dy)
        c = dy.shape[1]
        dyd = dy.double()
        sum_dy = dyd.sum(dims)
        sum_dy_xhat = (dyd * xhat.double()).sum(dims)
        grad_w = sum_dy_xhat.to(dy.dtype) if weight is not None else None
        grad_b = sum_dy.to(dy.dtype) if ctx.has_bias else None
        both = torch.cat([sum_dy, sum_dy_xhat])
        dist.all_reduce(both, group=ctx.group)
        mean_dy = (both[:c] / ctx.n).to(dy.dtype).view(_shape(dy))
        mean_dy_xhat = (both[c:] / ctx.n).to(dy.dtype).view(_shape(dy))
        scale = invstd.view(_shape(dy))
        if weight is not None:
            scale = scale * weight.view(_shape(dy))
        dx = (dy - mean_dy - xhat * mean_dy_xhat) * scale
        return dx, grad_w, grad_b, None, None, None, None, None


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """torch.nn.SyncBatchNorm's interface (num_features, eps, momentum,
    affine, track_running_stats, process_group), on any device."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None,
                 dtype=None):
        super().__init__(num_features, eps, momentum, affine,
                         track_running_stats, device=device, dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError("expected at least 2D input (got %dD input)" %
                             x.dim())

    def forward(self, x):
        self._check_input_dim(x)
        if self.momentum is None:
            raise ValueError("SyncBatchNorm: momentum=None (a cumulative "
                             "average) is not supported")
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
        group = self.process_group or (dist.group.WORLD
                                       if dist.is_initialized() else None)
        world = dist.get_world_size(group) if group is not None else 1
        bn_training = self.training or self.running_mean is None
        if not (self.training and world > 1):
            return F.batch_norm(
                x, self.running_mean if not self.training or
                self.track_running_stats else None,
                self.running_var if not self.training or
                self.track_running_stats else None,
                self.weight, self.bias, bn_training, self.momentum, self.eps)
        rm = self.running_mean if self.track_running_stats else None
        rv = self.running_var if self.track_running_stats else None
        return _SyncBN.apply(x, self.weight, self.bias, rm, rv, self.eps,
                             self.momentum, group)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """Every BatchNorm*D of module replaced by a SyncBatchNorm holding
        the same Parameter and buffer objects (an optimizer made before
        keeps working)."""
        out = module
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and \
                not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum,
                      module.affine, module.track_running_stats,
                      process_group)
            if module.affine:
                out.weight = module.weight
                out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child,
                                                            process_group))
        return out
