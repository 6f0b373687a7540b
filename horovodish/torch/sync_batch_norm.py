"""SyncBatchNorm: batch statistics over the whole distributed batch, on the CPU too.

In training mode each rank sends (count, mean, M2) per channel in one allgather and
combines them with Chan's parallel formula, so uneven (even empty) local batches weigh
correctly and no rank ever sums squares of large values. Backward allreduces the two
per-channel gradient sums in one call. Output, running statistics and gradients equal
torch's BatchNorm on the concatenated batch (input gradients: of the sum of the ranks'
losses; weight and bias gradients are this rank's share, to be averaged or summed by
DistributedOptimizer like every other gradient).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from ..common.api.process_sets import ProcessSet, global_process_set
from . import mpi_ops

class _SyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None,
                bias: torch.Tensor | None, running_mean: torch.Tensor | None,
                running_var: torch.Tensor | None, eps: float, momentum: float,
                process_set: ProcessSet, name: str) -> torch.Tensor:
        channels = x.shape[1]
        dims = [0, *range(2, x.dim())]
        count = x.numel() // channels if channels else 0
        if count:
            var, mean = torch.var_mean(x, dim=dims, correction=0)
        else:
            var = mean = x.new_zeros(channels)
        row = torch.cat([mean.new_tensor([float(count)], dtype=torch.float64),
                         mean.double(), var.double() * count]).unsqueeze(0)
        rows = mpi_ops.allgather(row, name=f"{name}.stats", process_set=process_set)
        counts, means, m2s = rows[:, :1], rows[:, 1:channels + 1], rows[:, channels + 1:]
        total = float(counts.sum())
        if total <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got "
                             f"{int(total)} over all ranks (input size {list(x.shape)})")
        global_mean = (counts * means).sum(0) / total
        m2 = (m2s + counts * (means - global_mean) ** 2).sum(0)
        invstd = torch.rsqrt(m2 / total + eps)
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(global_mean.to(running_mean.dtype),
                                                 alpha=momentum)
        if running_var is not None:
            running_var.mul_(1 - momentum).add_((m2 / (total - 1)).to(running_var.dtype),
                                                alpha=momentum)
        shape = [1, channels] + [1] * (x.dim() - 2)
        invstd = invstd.to(x.dtype).view(shape)
        x_hat = (x - global_mean.to(x.dtype).view(shape)) * invstd
        ctx.save_for_backward(x_hat, invstd, weight)
        ctx.args = (total, dims, shape, process_set, name)
        out = x_hat
        if weight is not None:
            out = out * weight.view(shape)
        if bias is not None:
            out = out + bias.view(shape)
        # The input's dtype, as torch's BatchNorm returns under autocast (float32
        # weights would otherwise promote a bfloat16 activation).
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        x_hat, invstd, weight = ctx.saved_tensors
        total, dims, shape, process_set, name = ctx.args
        sum_dy = grad.sum(dims)
        sum_dy_xhat = (grad * x_hat).sum(dims)
        grad_input = None
        if ctx.needs_input_grad[0]:
            # Every rank's input needs a grad or none does (same model), so all ranks agree
            # on running this allreduce.
            sums = mpi_ops.allreduce(torch.cat([sum_dy, sum_dy_xhat]).double(),
                                     name=f"{name}.grad", op=mpi_ops.Sum,
                                     process_set=process_set)
            mean_dy, mean_dy_xhat = (sums / total).to(grad.dtype).chunk(2)
            scale = invstd if weight is None else invstd * weight.view(shape)
            grad_input = (grad - mean_dy.view(shape) - x_hat * mean_dy_xhat.view(shape)) * scale
        grad_weight = sum_dy_xhat if weight is not None and ctx.needs_input_grad[1] else None
        grad_bias = sum_dy if ctx.needs_input_grad[2] else None
        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """BatchNorm whose training statistics cover the batch of every rank (of process_set).

    Same arguments as ``torch.nn.BatchNorm*d``; any input of 2 or more dimensions.
    Eval mode uses the running statistics, which every rank updates identically. Every
    rank must run the layer the same number of times per step (each run is a collective).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_set: ProcessSet = global_process_set, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.process_set = process_set
        # Named by width, not by instance: a rank that builds one more SyncBatchNorm (an
        # EMA copy, say) must not shift the names of the ones all ranks run. Layers of one
        # width share names (their collectives run one at a time) and so the response
        # cache entry, which only sees the same shapes under a name.
        self._sync_name = f"sync_batch_norm.{num_features}"

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        use_running = not self.training or self.track_running_stats
        running_mean = self.running_mean if use_running else None
        running_var = self.running_var if use_running else None
        if not (batch_stats and self.training) or self.process_set.size() == 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                                batch_stats, factor, self.eps)
        return _SyncBatchNorm.apply(input, self.weight, self.bias, running_mean, running_var,
                                    self.eps, factor, self.process_set, self._sync_name)

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module,
                               process_set: ProcessSet = global_process_set) -> torch.nn.Module:
        """Replace every BatchNorm*d in module with a SyncBatchNorm holding its state."""
        converted = module
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_set)
            if module.affine:
                with torch.no_grad():
                    converted.weight = module.weight
                    converted.bias = module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.train(module.training)
        for child_name, child in module.named_children():
            converted.add_module(child_name, cls.convert_sync_batchnorm(child, process_set))
        return converted
