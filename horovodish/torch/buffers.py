"""Per-buffer reduction strategies for module buffers (beyond Horovod).

DistributedOptimizer reduces gradients only; buffers (BatchNorm running statistics,
step counters, EMA shadows, ...) drift apart across ranks unless something syncs them.
DDP broadcasts all of them from rank 0 before every forward; that is one choice of many.
``BufferSync`` lets each buffer say how it is combined:

    'broadcast'  root_rank's value everywhere (the default; DDP's behaviour)
    'average'    mean over ranks (integers: truncated toward zero)
    'sum'        sum over ranks
    'none'       left alone (rank-local)
    callable     f(list of every rank's tensor, in rank order) -> tensor of the same shape

Keys of ``strategies`` are buffer names from ``module.named_buffers()`` or fnmatch
patterns (``'*.running_var'``); an exact name wins over a pattern, and earlier patterns
over later ones. A key that matches no buffer raises ValueError (typos fail loudly).

Each strategy costs one call into the core, whatever the number of buffers: broadcast
buffers travel packed (one buffer per dtype), averaged and summed ones as one grouped
allreduce each (fused), callables' inputs as one grouped allgather.

    sync = hvd.BufferSync(model, {'*.running_var': 'average', 'ema.*': 'none'})
    optimizer = hvd.DistributedOptimizer(opt, model.named_parameters(), buffer_sync=sync)
    # ... or call sync() (or hvd.sync_buffers(model, ...)) whenever you like, on every rank.
"""
from __future__ import annotations

import fnmatch
from typing import Callable, Mapping, Union

import torch

from ..common.api.process_sets import ProcessSet, global_process_set
from . import mpi_ops
from .functions import broadcast_tensors_

Strategy = Union[str, Callable[[list[torch.Tensor]], torch.Tensor]]
_NAMED = ("broadcast", "average", "sum", "none")


class BufferSync:
    """Syncs module's buffers by strategy each time it is called (collective)."""

    def __init__(self, module: torch.nn.Module, strategies: Mapping[str, Strategy] | None = None,
                 default: Strategy = "broadcast", root_rank: int = 0,
                 process_set: ProcessSet = global_process_set) -> None:
        self.module = module
        self.root_rank = root_rank
        self.process_set = process_set
        strategies = dict(strategies or {})
        for strategy in [default, *strategies.values()]:
            if not callable(strategy) and strategy not in _NAMED:
                raise ValueError(f"unknown buffer strategy {strategy!r}: use one of "
                                 f"{', '.join(map(repr, _NAMED))} or a callable")
        names = [name for name, _ in module.named_buffers()]
        unmatched = [key for key in strategies
                     if key not in names and not fnmatch.filter(names, key)]
        if unmatched:
            raise ValueError(f"buffer strategies name no buffer of the module: {unmatched}; "
                             f"its buffers are {names}")
        patterns = [key for key in strategies if key not in names]
        self.strategies: dict[str, Strategy] = {}
        for name in names:
            match = next((p for p in patterns if fnmatch.fnmatchcase(name, p)), None)
            self.strategies[name] = strategies.get(name, strategies.get(match, default))

    def __call__(self) -> None:
        self.sync()

    def sync(self) -> None:
        # Buffers are looked up on every call: modules may replace a buffer's tensor.
        buffers = dict(self.module.named_buffers())
        plan: dict[str, list[tuple[str, torch.Tensor]]] = {"broadcast": [], "average": [],
                                                           "sum": [], "call": []}
        for name, strategy in self.strategies.items():
            if strategy != "none" and name in buffers:
                plan["call" if callable(strategy) else strategy].append((name, buffers[name]))
        if plan["broadcast"]:
            broadcast_tensors_([b for _, b in plan["broadcast"]], self.root_rank,
                               "buffer_sync.broadcast", self.process_set)
        for key, op in (("average", mpi_ops.Average), ("sum", mpi_ops.Sum)):
            if plan[key]:
                mpi_ops.grouped_allreduce_([b for _, b in plan[key]],
                                           name=[f"buffer_sync.{n}" for n, _ in plan[key]],
                                           op=op, process_set=self.process_set)
        if plan["call"]:
            self._apply_callables(plan["call"])

    def _apply_callables(self, entries: list[tuple[str, torch.Tensor]]) -> None:
        gathered = mpi_ops.grouped_allgather(
            [b.detach().reshape(1, *b.shape) for _, b in entries],
            name=[f"buffer_sync.gather.{n}" for n, _ in entries], process_set=self.process_set)
        with torch.no_grad():
            for (name, buffer), rows in zip(entries, gathered):
                result = self.strategies[name](list(rows.unbind(0)))
                if not isinstance(result, torch.Tensor) or result.shape != buffer.shape:
                    raise ValueError(f"buffer strategy for '{name}' must return a tensor of "
                                     f"shape {tuple(buffer.shape)}, got {result!r:.80}")
                buffer.copy_(result)


def sync_buffers(module: torch.nn.Module, strategies: Mapping[str, Strategy] | None = None,
                 default: Strategy = "broadcast", root_rank: int = 0,
                 process_set: ProcessSet = global_process_set) -> None:
    """Sync module's buffers once; see BufferSync for the strategies."""
    BufferSync(module, strategies, default, root_rank, process_set).sync()
