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

from ..common.compression import Compressor
from ..common.execution.backends.adasum import is_power_of_two
from ..common.messages import ReduceOp
from ..common.api.process_sets import ProcessSet
from . import mpi_ops
from .tracked import check_tracked


class _DistributedAdasumOptimizer:
    """Mixed in before the wrapped optimizer's class."""

    def _hvd_adasum_setup(self, names: dict[torch.Tensor, str], compression: Compressor,
                          process_set: ProcessSet) -> None:
        size = process_set.size()
        if not is_power_of_two(size):
            raise ValueError(f"DistributedOptimizer(op=Adasum) needs a power-of-two number of "
                             f"ranks, not {size}.")
        self._parameter_names = names
        self._hvd_params = [p for group in self.param_groups for p in group["params"]
                            if p.requires_grad]
        self._hvd_tracked = set(self._hvd_params)
        # Names this optimizer's agreement apart from another's (a GAN's two optimizers).
        self._hvd_tag = min((names[p] for p in self._hvd_params), default="none")
        self._hvd_compression = compression
        self._hvd_process_set = process_set

    def synchronize(self) -> None:
        """Nothing to reduce before the local step (deltas are combined inside step()),
        but ranks must agree on whether to take it: GradScaler skips step() on a rank
        whose own gradients overflowed, and a rank that skips alone would combine its
        next step with the others' current one, then stall. So if any rank's gradients
        are not finite, every rank's become so (one integer allreduce), as averaging
        would have made them. For ``synchronize(); scaler.unscale_(); with
        skip_synchronize(): scaler.step()``."""
        check_tracked(self, self._hvd_tracked, self._parameter_names)
        grads = [p.grad for p in self._hvd_params if p.grad is not None]
        dense = [g for g in grads if not g.is_sparse]
        finite = all(bool(torch.isfinite(g._values() if g.is_sparse else g).all())
                     for g in grads)
        overflowed = mpi_ops.allreduce(torch.tensor([0 if finite else 1]), op=ReduceOp.SUM,
                                       name=f"adasum.overflowed.{self._hvd_tag}",
                                       process_set=self._hvd_process_set)
        if finite and int(overflowed) and dense:
            with torch.no_grad():
                for grad in dense:
                    grad.fill_(float("nan"))

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        yield

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        check_tracked(self, self._hvd_tracked, self._parameter_names)
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
                deltas, name=[f"adasum.{self._parameter_names[p]}" for p in params],
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
