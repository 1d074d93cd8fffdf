"""SyncBatchNorm (Horovod's hvd.SyncBatchNorm): batch normalization whose
statistics in training are those of the whole batch over every rank.

Forward (training): every rank's per-channel count, mean and M2 (sum of
squared deviations), computed in float64, are allgathered bit for bit
(raw bytes through the hub) and combined in rank order (Chan et al.'s
pairwise formula, float64): the whole batch's mean and biased variance,
which normalize; the running statistics take the unbiased variance, as
torch's BatchNorm. Backward: the per-channel sums of dy and of
dy * (x - mean) are allgathered and summed in float64 in rank order, which
gives the input's gradient of the whole batch; the weight's and bias's
gradients stay this rank's (DistributedOptimizer averages them, as with
torch's SyncBatchNorm under DDP). A rank may have an empty batch. In eval
mode (or with one rank) it is torch's batch_norm.

Thread use: the training loop's; every rank runs forward and backward.
"""
import torch
import torch.nn.functional as F

from . import _context
from .collectives import allgather


def _channels_last(x):
    """x (N, C, ...) as (C, N * ...)."""
    return x.transpose(0, 1).reshape(x.shape[1], -1)


def _gather_rows(row):
    """Every rank's float64 row (1, k), as (size, k), bit for bit."""
    return allgather(row.view(1, -1))


class _SyncBN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum):
        c = x.shape[1]
        xc = _channels_last(x.detach()).to(torch.float64)
        n = xc.shape[1]
        mean_l = xc.mean(1) if n else torch.zeros(c, dtype=torch.float64)
        m2_l = ((xc - mean_l[:, None]) ** 2).sum(1)
        rows = _gather_rows(torch.cat([torch.tensor([float(n)], dtype=torch.float64),
                                       mean_l, m2_l]))
        count, mean, m2 = 0.0, torch.zeros(c, dtype=torch.float64), \
            torch.zeros(c, dtype=torch.float64)
        for r in range(rows.shape[0]):  # rank order
            nb, mb, m2b = rows[r, 0].item(), rows[r, 1:1 + c], rows[r, 1 + c:]
            if nb == 0:
                continue
            total = count + nb
            delta = mb - mean
            mean = mean + delta * (nb / total)
            m2 = m2 + m2b + delta * delta * (count * nb / total)
            count = total
        if count == 0:
            raise ValueError("SyncBatchNorm: every rank's batch is empty")
        var = m2 / count
        invstd = 1.0 / torch.sqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                unbiased = m2 / max(count - 1.0, 1.0)
                running_mean.mul_(1 - momentum).add_(momentum * mean.to(running_mean.dtype))
                running_var.mul_(1 - momentum).add_(momentum * unbiased.to(running_var.dtype))
        shape = [1, c] + [1] * (x.dim() - 2)
        xhat = (x.detach().to(torch.float64) - mean.view(shape)) * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.detach().to(torch.float64).view(shape) + \
                bias.detach().to(torch.float64).view(shape)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.count = count
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, mean, invstd = ctx.saved_tensors
        c = x.shape[1]
        shape = [1, c] + [1] * (x.dim() - 2)
        dy = grad.to(torch.float64)
        xmu = x.detach().to(torch.float64) - mean.view(shape)
        dyc, xmuc = _channels_last(dy), _channels_last(xmu)
        local = torch.cat([dyc.sum(1), (dyc * xmuc).sum(1)])
        rows = _gather_rows(local)
        total = torch.zeros_like(local)
        for r in range(rows.shape[0]):  # rank order
            total = total + rows[r]
        sum_dy, sum_dy_xmu = total[:c], total[c:]
        w = weight.detach().to(torch.float64) if weight is not None else \
            torch.ones(c, dtype=torch.float64)
        n = ctx.count
        gx = (dy - (sum_dy / n).view(shape) -
              xmu * (invstd ** 2 * sum_dy_xmu / n).view(shape)) * (invstd * w).view(shape)
        gw = gb = None
        if weight is not None:
            xhat = xmu * invstd.view(shape)
            gw = _channels_last(dy * xhat).sum(1).to(weight.dtype)
            gb = dyc.sum(1).to(weight.dtype)
        return gx.to(x.dtype), gw, gb, None, None, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """BatchNorm over the whole batch of every rank (module docstring).
    Arguments as torch.nn.BatchNorm*d; inputs (N, C, ...) of any rank >= 2."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"SyncBatchNorm: expected an input of 2 or more dimensions "
                             f"(N, C, ...), got {x.dim()}")

    def forward(self, x):
        self._check_input_dim(x)
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
        momentum = self.momentum
        if momentum is None:  # cumulative moving average, as torch's BatchNorm
            momentum = 1.0 / float(self.num_batches_tracked)
        if not self.training or _context.need().size == 1:
            use_batch = self.training or not self.track_running_stats
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                use_batch, momentum, self.eps)
        running = self.track_running_stats
        return _SyncBN.apply(x, self.weight, self.bias,
                             self.running_mean if running else None,
                             self.running_var if running else None, self.eps, momentum)
