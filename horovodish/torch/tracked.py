"""Which parameters a DistributedOptimizer reduces, and a clear error for the others.

The wrapper fixes that list when it is built (hooks can only be registered on tensors
that require grad). A parameter frozen then and unfrozen later, or added with
``add_param_group`` afterwards, would be stepped on its local gradient alone: the ranks'
weights drift apart without any error (Horovod does the same). So each step looks for
such gradients and refuses them.
"""
from __future__ import annotations

from typing import Container

import torch


def check_tracked(optimizer: torch.optim.Optimizer, tracked: Container[torch.Tensor],
                  names: dict[torch.Tensor, str]) -> None:
    """ValueError naming the first parameter with a gradient that is not tracked."""
    for index, group in enumerate(optimizer.param_groups):
        for position, param in enumerate(group["params"]):
            if param.grad is not None and param.requires_grad and param not in tracked:
                name = names.get(param, f"param_groups[{index}]['params'][{position}]")
                raise ValueError(
                    f"DistributedOptimizer: parameter '{name}' has a gradient that is not "
                    "reduced across ranks: it did not require grad when the "
                    "DistributedOptimizer was built, or was added with add_param_group() "
                    "since. Each rank would step it on its own gradient and the replicas "
                    "would drift apart. Build the DistributedOptimizer again once the "
                    "parameters to train are set (then broadcast_optimizer_state).")
