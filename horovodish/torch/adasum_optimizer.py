"""DistributedOptimizer(op=Adasum): Horovod's delta optimizer.

Each rank takes the wrapped optimizer's step on its own gradients, then the parameter
changes (deltas) are combined with Adasum and every rank applies the combined delta to
the parameters it started the step from. Gradients themselves are never averaged:
Adasum adapts between averaging (parallel deltas) and summing (orthogonal ones), which
keeps large learning rates stable at scale.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from ..common.backends.adasum import is_power_of_two
from ..common.messages import ReduceOp
from ..common.process_sets import ProcessSet
from . import mpi_ops


class _DistributedAdasumOptimizer:
    """Mixed in before the wrapped optimizer's class."""

    def _hvd_adasum_setup(self, names: dict[torch.Tensor, str], compression: Any,
                          process_set: ProcessSet) -> None:
        size = process_set.size()
        if not is_power_of_two(size):
            raise ValueError(f"DistributedOptimizer(op=Adasum) needs a power-of-two number of "
                             f"ranks, not {size}.")
        self._hvd_names = names
        self._hvd_params = [p for group in self.param_groups for p in group["params"]
                            if p.requires_grad]
        self._hvd_compression = compression
        self._hvd_process_set = process_set

    def synchronize(self) -> None:
        """Nothing to reduce before the local step: deltas are combined inside step()."""

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        yield

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        params = self._hvd_params
        starts = [p.detach().clone() for p in params]
        result = super().step(closure)
        with torch.no_grad():
            deltas, contexts = [], []
            for param, start in zip(params, starts):
                delta, context = self._hvd_compression.compress(param.detach() - start)
                deltas.append(delta)
                contexts.append(context)
            combined = mpi_ops.grouped_allreduce(
                deltas, name=[f"adasum.{self._hvd_names[p]}" for p in params],
                op=ReduceOp.ADASUM, process_set=self._hvd_process_set)
            for param, start, delta, context in zip(params, starts, combined, contexts):
                param.copy_(start + self._hvd_compression.decompress(delta, context))
        return result


_DistributedAdasumOptimizer.step.hooked = True  # type: ignore[attr-defined]
_classes: dict[type, type] = {}


def adasum_class(base: type) -> type:
    if base not in _classes:
        _classes[base] = type(base.__name__, (_DistributedAdasumOptimizer, base),
                              {"__module__": __name__})
    return _classes[base]
