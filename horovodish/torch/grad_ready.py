"""One hook per parameter that fires once its gradient is accumulated, on every torch
the runtime supports: ``Tensor.register_post_accumulate_grad_hook`` from torch 2.1, and
on torch 2.0 a post hook on the parameter's gradient accumulator (the autograd node that
writes ``.grad``), which fires at the same point of the backward pass."""
from __future__ import annotations

from typing import Any, Callable

import torch

GradReadyHook = Callable[[torch.Tensor], None]

HAS_POST_ACCUMULATE_HOOK = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


class _AccumulatorHook:
    """The handle of a hook on a gradient accumulator. It holds the accumulator: autograd
    keeps only a weak reference to it, and a new one (without the hook) would replace it
    once this one is gone."""

    def __init__(self, param: torch.Tensor, hook: GradReadyHook) -> None:
        self.accumulator = param.view_as(param).grad_fn.next_functions[0][0]
        self.handle = self.accumulator.register_hook(lambda *_grads: hook(param))

    def remove(self) -> None:
        self.handle.remove()
        self.accumulator = None


def register_grad_ready_hook(param: torch.Tensor, hook: GradReadyHook) -> Any:
    """Call ``hook(param)`` each time backward has accumulated ``param.grad``. Returns a
    handle with ``remove()``."""
    if HAS_POST_ACCUMULATE_HOOK:
        return param.register_post_accumulate_grad_hook(hook)
    return _AccumulatorHook(param, hook)
