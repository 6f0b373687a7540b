"""DistributedOptimizer(op=Adasum): Horovod's delta optimizer.

Each rank takes the wrapped optimizer's step on its own gradients, then the parameter
changes (deltas) are combined with Adasum and every rank applies the combined delta to
the parameters it started the step from. Gradients themselves are never averaged:
Adasum adapts between averaging (parallel deltas) and summing (orthogonal ones), which
keeps large learning rates stable at scale.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..common.compression import Compressor
from ..common.execution.backends.adasum import is_power_of_two
from ..common.messages import ReduceOp
from ..common.api.process_sets import ProcessSet
from . import mpi_ops
from .optimizer_base import LocalStep, OptimizerSync, trained


class AdasumSync(OptimizerSync):
    """The Adasum optimizer's reduction: of parameter deltas, inside step()."""

    def __init__(self, optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, str],
                 compression: Compressor, process_set: ProcessSet) -> None:
        size = process_set.size()
        if not is_power_of_two(size):
            raise ValueError(f"DistributedOptimizer(op=Adasum) needs a power-of-two number of "
                             f"ranks, not {size}.")
        self.params = trained(optimizer)
        super().__init__(optimizer, self.params, names)
        self.names = names
        # Names this optimizer's agreement apart from another's (a GAN's two optimizers).
        self.tag = min((names[p] for p in self.params), default="none")
        self.compression = compression
        self.process_set = process_set

    def synchronize(self) -> None:
        """Nothing to reduce before the local step (deltas are combined inside step()),
        but ranks must agree on whether to take it: GradScaler skips step() on a rank
        whose own gradients overflowed, and a rank that skips alone would combine its
        next step with the others' current one, then stall. So if any rank's gradients
        are not finite, every rank's become so (one integer allreduce), as averaging
        would have made them. For ``synchronize(); scaler.unscale_(); with
        skip_synchronize(): scaler.step()``."""
        self.untracked.check()
        grads = [p.grad for p in self.params if p.grad is not None]
        dense = [g for g in grads if not g.is_sparse]
        finite = all(bool(torch.isfinite(g._values() if g.is_sparse else g).all())
                     for g in grads)
        overflowed = mpi_ops.allreduce(torch.tensor([0 if finite else 1]), op=ReduceOp.SUM,
                                       name=f"adasum.overflowed.{self.tag}",
                                       process_set=self.process_set)
        if finite and int(overflowed) and dense:
            with torch.no_grad():
                for grad in dense:
                    grad.fill_(float("nan"))

    def step(self, closure: Callable[[], Any] | None, local_step: LocalStep) -> Any:
        """The local step on this rank's own gradients, then every rank applies the
        Adasum combination of the deltas to the parameters it started from."""
        self.untracked.check()
        params = self.params
        starts = [p.detach().clone() for p in params]
        result = local_step(closure)
        with torch.no_grad():
            deltas, contexts = [], []
            for param, start in zip(params, starts):
                delta, context = self.compression.compress(param.detach() - start)
                deltas.append(delta)
                contexts.append(context)
            combined = mpi_ops.grouped_allreduce(
                deltas, name=[f"adasum.{self.names[p]}" for p in params],
                op=ReduceOp.ADASUM, process_set=self.process_set)
            for param, start, delta, context in zip(params, starts, combined, contexts):
                param.copy_(start + self.compression.decompress(delta, context))
        return result
