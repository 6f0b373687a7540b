"""Which parameters a DistributedOptimizer reduces, and a clear error for the others.

The wrapper fixes that list when it is built (hooks can only be registered on tensors
that require grad). A parameter frozen then and unfrozen later, or added with
``add_param_group`` afterwards, would be stepped on its local gradient alone: the ranks'
weights drift apart without any error (Horovod does the same). So each step looks for
such gradients and refuses them.
"""
from __future__ import annotations

import weakref
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


class UntrackedGradients:
    """check_tracked at a cost per untracked parameter, not per parameter: the tracked
    list is fixed, so only parameters outside it (and any added since) can fail."""

    def __init__(self, optimizer: torch.optim.Optimizer, tracked: Container[torch.Tensor],
                 names: dict[torch.Tensor, str]) -> None:
        # Weakly: the optimizer holds this object, and a cycle would keep a dropped
        # optimizer's gradient hooks alive until the next garbage collection.
        self._optimizer = weakref.ref(optimizer)
        self._tracked, self._names = tracked, names
        self._count = self._params(optimizer)
        self._outside = [p for group in optimizer.param_groups for p in group["params"]
                         if p not in tracked]

    @staticmethod
    def _params(optimizer: torch.optim.Optimizer) -> int:
        return sum(len(group["params"]) for group in optimizer.param_groups)

    def check(self) -> None:
        optimizer = self._optimizer()
        if optimizer is not None and (self._params(optimizer) != self._count or any(
                p.grad is not None and p.requires_grad for p in self._outside)):
            check_tracked(optimizer, self._tracked, self._names)
