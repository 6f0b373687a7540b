"""DistributedOptimizer: average gradients across ranks while backward still runs.

Contract (Horovod's):

* Every rank builds the same model and wraps the same kind of optimizer; parameters are
  matched across ranks by name (``named_parameters``), so give names whenever the
  parameter order could differ. Start from identical weights: call
  ``broadcast_parameters(model.state_dict(), root_rank=0)`` and
  ``broadcast_optimizer_state(optimizer, root_rank=0)`` once.
* A hook on each parameter submits an allreduce of its gradient as soon as autograd has
  accumulated it, so communication overlaps the rest of backward. ``step()`` waits for
  all of them (``synchronize()``), then runs the wrapped update.
* After ``synchronize()`` each ``param.grad`` is the reduced gradient, reduced in place:
  by default (from the second step) in a flat bucket that the gradient is a view of, the
  same tensor from step to step (DDP's ``gradient_as_bucket_view=True``), so a reference
  to ``param.grad`` taken before ``synchronize()`` holds the reduced gradient after it,
  as in Horovod. ``gradient_as_bucket_view=False`` turns the buckets off: each gradient
  stays the tensor autograd made and is reduced in it (Horovod's per-tensor path). ``op=Adasum`` builds a different optimizer (Horovod's delta
  rule), which updates parameters, not gradients, and ignores this flag.
* A parameter that got no gradient on this rank is reduced with zeros at
  ``synchronize()``, so a branch taken on some ranks only never stalls the others.
* ``backward_passes_per_step=k``: gradients accumulate locally for k backward passes and
  are reduced on the k-th (not divided by k: scale the loss if you want a mean).
* Buffers (BatchNorm running statistics, ...) are not touched; pass ``buffer_sync=``
  (see ``BufferSync``) or use ``SyncBatchNorm``.

Example (run with ``horovodishrun -np 2 python train.py``)::

    import torch
    import horovodish.torch as hvd

    hvd.init()
    model = torch.nn.Linear(10, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for _ in range(10):
        optimizer.zero_grad()
        loss = model(torch.randn(32, 10)).pow(2).mean()
        loss.backward()
        optimizer.step()          # gradients are averaged over ranks first

The returned object's class subclasses the wrapped optimizer's class (``isinstance``,
``state_dict``, LR schedulers work) and shares its state, param_groups and defaults.
"""
from __future__ import annotations

import warnings
from collections import Counter
from typing import Any, Callable, Iterable

import torch

from ..common.compression import Compressor
from ..common.messages import ReduceOp
from ..common.api.process_sets import ProcessSet, global_process_set
from .comm_hooks import CommHook
from .compression import Compression
from .optimizer_base import OptimizerSync, WrappedOptimizer, trained, wrap
from .reducer import Reducer
from .zero import ShardedOptimizer, ShardedSync


class ReplicatedSync(OptimizerSync):
    """The replicated optimizer's reduction: one ``Reducer`` (reducer.py) averaging
    every gradient while backward runs."""

    def __init__(self, optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, str], *,
                 compression: Compressor, backward_passes_per_step: int, op: ReduceOp,
                 predivide: float, groups: list[list[torch.Tensor]] | None,
                 sparse_as_dense: bool, process_set: ProcessSet, bucket_cap_mb: float,
                 buffer_sync: Callable[[], None] | None,
                 gradient_as_bucket_view: bool) -> None:
        params = trained(optimizer)
        super().__init__(optimizer, params, names, buffer_sync)
        self.compression = compression
        self.reducer = Reducer(
            params, names, compression=compression, op=op, process_set=process_set,
            passes=backward_passes_per_step, predivide=predivide,
            sparse_as_dense=sparse_as_dense, bucket_cap_mb=bucket_cap_mb, groups=groups,
            as_view=gradient_as_bucket_view)

    @property
    def passes(self) -> int:
        return self.reducer.passes

    def set_passes(self, passes: int) -> None:
        self.reducer.set_passes(passes)

    def synchronize(self) -> None:
        reducer = self.reducer
        if reducer.member:
            try:
                self.untracked.check()
            except Exception:
                reducer.abandon_step()
                raise
            reducer.synchronize()
        self.synchronized = True

    def pending_work(self) -> bool:
        return self.reducer.pending_work()

    def zero_grad(self, set_to_none: bool, plain: Callable[[bool], None]) -> None:
        if self.reducer.flat:
            self.reducer.zero_grad(set_to_none)
        else:
            plain(set_to_none)

    def abandon_step(self) -> None:
        self.reducer.abandon_step()
        self.synchronized = False

    def register_comm_hook(self, state: Any, hook: CommHook) -> None:
        if self.reducer.comm_hook is not None:
            raise RuntimeError("register_comm_hook: a communication hook is registered "
                               "already (one per optimizer, as in DDP)")
        if self.compression is not Compression.none:
            raise ValueError("register_comm_hook: this optimizer compresses already "
                             f"(compression={self.compression.__name__}); use the "
                             "hook alone (e.g. hvd.fp16_compress_hook)")
        if not callable(hook):
            raise TypeError(f"register_comm_hook: hook must be callable, got {hook!r}")
        self.reducer.register_comm_hook(state, hook)

    def negotiation_stats(self) -> list[dict[str, int]]:
        return list(self.reducer.stats)

    def restart_agreement(self) -> None:
        """Agree (and learn buckets) afresh from the next step."""
        self.reducer.restart_agreement()


def _adasum_optimizer(optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, str],
                      compression: Compressor, backward_passes_per_step: int,
                      process_set: ProcessSet) -> Any:
    from .adasum_optimizer import AdasumSync
    if backward_passes_per_step != 1:
        raise ValueError("DistributedOptimizer(op=Adasum) combines the deltas of every step; "
                         "backward_passes_per_step must be 1 (accumulate gradients yourself "
                         "and call step() once per combined update).")
    return wrap(optimizer, WrappedOptimizer, names,
                lambda wrapped: AdasumSync(wrapped, names, compression, process_set))


def _sharded_optimizer(optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, str],
                       compression: Compressor, backward_passes_per_step: int, op: ReduceOp,
                       predivide: float, groups: Any, process_set: ProcessSet,
                       bucket_cap_mb: float, buffer_sync: Callable[[], None] | None,
                       stage: int) -> Any:
    if stage not in (1, 2):
        raise ValueError(f"zero_stage must be 1 or 2, not {stage}")
    if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError("shard_optimizer_state=True supports op=Average or Sum")
    if groups:
        raise ValueError("shard_optimizer_state=True makes its own buckets; groups= does "
                         "not apply (use bucket_cap_mb=)")
    base = type(optimizer)
    return wrap(optimizer, ShardedOptimizer, names, lambda wrapped: ShardedSync(
        wrapped, base, names, stage=stage, compression=compression,
        backward_passes_per_step=backward_passes_per_step, op=op, predivide=float(predivide),
        process_set=process_set, bucket_cap_mb=bucket_cap_mb, buffer_sync=buffer_sync))


def _parameter_names(optimizer: torch.optim.Optimizer,
                     named_parameters: Iterable[tuple[str, torch.Tensor]] | None
                     ) -> dict[torch.Tensor, str]:
    """Parameter -> name, kept as the wrapper's ``_parameter_names`` (Horovod's attribute,
    which scripts read). Without named_parameters: the names a torch >= 2.6 optimizer
    built from named_parameters() keeps, else Horovod's ``allreduce.noname.{group}.{i}``,
    the same on every rank that builds the same optimizer."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        names: dict[torch.Tensor, str] = {}
        for i, group in enumerate(optimizer.param_groups):
            given = group.get("param_names") or [None] * len(group["params"])
            for j, (param, name) in enumerate(zip(group["params"], given)):
                names[param] = name if name is not None else f"allreduce.noname.{i}.{j}"
        return names
    pairs = list(named_parameters)
    if any(not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[0], str)
           for pair in pairs):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                         "usually model.named_parameters().")
    counts = Counter(name for name, _ in pairs)
    duplicates = sorted(name for name, count in counts.items() if count > 1)
    if duplicates:
        raise ValueError("parameter names in named_parameters must be unique; found "
                         f"duplicates: {', '.join(duplicates)}")
    names = {param: name for name, param in pairs}
    missing = [i for i, p in enumerate(params) if p not in names]
    if missing:
        raise ValueError(
            "named_parameters was given, but it does not name every parameter of the "
            f"optimizer (positions {missing[:10]} in the optimizer's param_groups). Pass "
            "model.named_parameters() for the same model the optimizer was built from.")
    return names


def _groups(params: list[torch.Tensor], groups: Any) -> list[list[torch.Tensor]] | None:
    if groups is None or (isinstance(groups, int) and groups == 0):
        return None
    if isinstance(groups, int):
        if groups < 0:
            raise ValueError(f"groups must be a non-negative integer or a list of lists of "
                             f"parameters, got {groups}")
        count = min(groups, len(params)) or 1
        base, extra = divmod(len(params), count)
        chunks, start = [], 0
        for i in range(count):
            end = start + base + (1 if i < extra else 0)
            chunks.append(params[start:end])
            start = end
        return chunks
    seen: set[torch.Tensor] = set()
    result = []
    for group in groups:
        for param in group:
            if not isinstance(param, torch.Tensor):
                raise ValueError("groups must be lists of torch.Tensor parameters")
            if param in seen:
                raise ValueError("a parameter can appear in only one group")
            seen.add(param)
        result.append(list(group))
    return result


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression: Compressor = Compression.none,
                         backward_passes_per_step: int = 1, op: ReduceOp = ReduceOp.AVERAGE,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: Any = None, sparse_as_dense: bool = False,
                         process_set: ProcessSet = global_process_set,
                         bucket_cap_mb: float = 25.0,
                         buffer_sync: Callable[[], None] | None = None,
                         gradient_as_bucket_view: bool = True,
                         shard_optimizer_state: bool = False, zero_stage: int = 2) -> Any:
    """Wrap ``optimizer`` so that step() uses gradients reduced over all ranks.

    Horovod's arguments, plus (beyond Horovod) ``bucket_cap_mb`` (learned bucket order:
    0 submits every gradient on its own, as Horovod does), ``buffer_sync`` (a callable
    run after every step, e.g. ``hvd.BufferSync(model)``) and ``gradient_as_bucket_view``
    (default True: gradients live in flat buckets, each ``param.grad`` a view of its
    bucket, reduced in place; False keeps every gradient the tensor autograd made and
    reduces it in place there, Horovod's per-tensor path),
    ``shard_optimizer_state`` (ZeRO: each rank keeps 1/N of the optimizer state and
    steps only its shard; see horovodish/torch/zero.py) with ``zero_stage`` 2 (default:
    gradients are reduce-scattered, each rank keeps its shard of them) or 1 (gradients
    are allreduced, ``param.grad`` is the averaged gradient). See the module docstring
    for the contract and an example.
    """
    op = ReduceOp(op)
    if op not in (ReduceOp.AVERAGE, ReduceOp.SUM, ReduceOp.ADASUM):
        raise ValueError(f"DistributedOptimizer supports op=Average, Sum or Adasum, not "
                         f"{op.name.capitalize()}")
    if gradient_predivide_factor != 1.0 and op != ReduceOp.AVERAGE:
        raise ValueError("gradient_predivide_factor is only supported with op=Average")
    names = _parameter_names(optimizer, named_parameters)
    if shard_optimizer_state:
        return _sharded_optimizer(optimizer, names, compression,
                                  backward_passes_per_step, op, gradient_predivide_factor,
                                  groups or num_groups, process_set, bucket_cap_mb,
                                  buffer_sync, zero_stage)
    if zero_stage != 2:
        raise ValueError("zero_stage applies to shard_optimizer_state=True only")
    if op == ReduceOp.ADASUM:
        unsupported = [name for name, given in (
            ("groups", groups is not None or num_groups), ("sparse_as_dense", sparse_as_dense),
            ("buffer_sync", buffer_sync is not None)) if given]
        if unsupported:  # (Horovod ignores them silently)
            raise ValueError(f"DistributedOptimizer(op=Adasum) does not support "
                             f"{', '.join(unsupported)}: the Adasum optimizer reduces each "
                             "parameter's delta on its own, after the local step.")
        return _adasum_optimizer(optimizer, names, compression, backward_passes_per_step,
                                 process_set)
    if num_groups:
        warnings.warn("num_groups is deprecated; use groups=", DeprecationWarning)
        groups = num_groups if groups is None else groups
    chunks = _groups(trained(optimizer), groups)
    return wrap(optimizer, WrappedOptimizer, names, lambda wrapped: ReplicatedSync(
        wrapped, names, compression=compression,
        backward_passes_per_step=backward_passes_per_step, op=op,
        predivide=float(gradient_predivide_factor), groups=chunks,
        sparse_as_dense=sparse_as_dense, process_set=process_set,
        bucket_cap_mb=bucket_cap_mb, buffer_sync=buffer_sync,
        gradient_as_bucket_view=gradient_as_bucket_view))
