"""Sharded optimizer state (ZeRO stages 1 and 2): ``DistributedOptimizer(optimizer,
named_parameters, shard_optimizer_state=True)``.

Why a flag on DistributedOptimizer rather than a second class: a Horovod script turns it
on by adding one argument, and keeps every other argument, ``synchronize()`` /
``skip_synchronize()``, ``broadcast_optimizer_state`` and its training loop.

How it works. At construction the parameters each param group trains are cut into
buckets (reverse definition order, the order gradients usually arrive in, one dtype
each, up to ``bucket_cap_mb``) and each bucket's parameters are moved into one flat
tensor (``param.data`` becomes a view of it). Rank r of N owns the r-th of N nearly
equal ranges of every bucket (its *shard*), and builds one optimizer of the wrapped
class over that shard alone, so optimizer state takes 1/N of the memory.

* Backward: the replicated DistributedOptimizer's ``Reducer`` (reducer.py), with these
  buckets as its fixed layout, sends a bucket as soon as its last gradient has arrived
  (one hook per bucket). Stage 2: the bucket's gradients are concatenated (one call) and
  reduce-scattered, each rank receives only its shard of the averaged gradient, and the
  parameters' gradients are freed. Stage 1: the gradients are views of a flat bucket,
  allreduced in place, so ``param.grad`` is the averaged gradient, as without sharding.
* ``step()``: bucket by bucket, the shard's optimizer steps, and the updated shard is
  allgathered straight into the flat parameters; the allgather of one bucket runs while
  the next bucket's shard is stepped. ``step()`` returns once parameters are whole.

The update must be elementwise (SGD, Adam, AdamW, Adagrad, RMSprop, ...): an optimizer
that looks at a whole matrix (Muon, Adafactor, LBFGS) cannot run on a flat shard and is
refused.
"""
from __future__ import annotations

import inspect
import weakref
from typing import Any, Callable, Sequence

import torch

from ..common.api.process_sets import ProcessSet
from ..common.bucketing import consecutive_runs
from ..common.compression import Compressor
from ..common.messages import ReduceOp
from . import mpi_ops
from .async_ops import allgather_into_async
from .flat_buckets import FlatBucket
from .functions import broadcast_object
from .optimizer_base import LocalStep, OptimizerSync, WrappedOptimizer
from .reducer import Reducer
from .zero_state import SHARDED_KEY, bucket_layout, consolidate, shard_of

# Optimizers whose update of an element depends on other elements of the same parameter.
_NOT_ELEMENTWISE = {"LBFGS", "SparseAdam", "Adafactor", "Muon"}
_NOT_HYPERPARAMETERS = ("params", "param_names")


class _ShardedGroup:
    """Parameters of one param group and dtype, stored in one flat tensor; this rank's
    shard of it, and the optimizer that steps the shard."""

    def __init__(self, index: int, group: int, params: list[torch.Tensor], names: list[str],
                 rank: int, size: int) -> None:
        self.index, self.group, self.params, self.names = index, group, params, names
        self.numels = [p.numel() for p in params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(params))]
        total = sum(self.numels)
        base, extra = divmod(total, size)  # the core's reducescatter split
        self.counts = [base + (1 if r < extra else 0) for r in range(size)]
        self.start, self.count = sum(self.counts[:rank]), self.counts[rank]
        self.flat = torch.empty(total, dtype=params[0].dtype, device=params[0].device)
        self.views = [self.flat[o:o + n].view(p.shape)
                      for p, o, n in zip(params, self.offsets, self.numels)]
        with torch.no_grad():
            for view, param in zip(self.views, params):
                view.copy_(param.detach())
        self.adopt()
        self.shard = self.flat[self.start:self.start + self.count]
        self.optimizer: torch.optim.Optimizer | None = None
        self.reduced: torch.Tensor | None = None  # stage 2: the shard; 1: the whole bucket
        tag = f"{names[0]}.{len(params)}"
        self.reduce_name, self.gather_name = f"zero.reduce.{tag}", f"zero.gather.{tag}"

    def adopt(self) -> None:
        """Move the parameters into the flat tensor (again, for any whose ``.data`` was
        replaced since, e.g. by ``param.data = ...``)."""
        with torch.no_grad():
            for param, view in zip(self.params, self.views):
                if param.data_ptr() != view.data_ptr() or param.stride() != view.stride():
                    if param.shape != view.shape:
                        raise ValueError(f"parameter shape changed to {list(param.shape)} "
                                         f"from {list(view.shape)} under a sharded optimizer")
                    view.copy_(param.detach())
                    param.data = view


class ShardedSync(OptimizerSync):
    """The sharded optimizer's reduction and state, kept as its ``_horovodish``. The
    wrapped optimizer only keeps the param groups the user sees; the shards' optimizers
    live in the flat groups."""

    def __init__(self, optimizer: torch.optim.Optimizer, base: type,
                 names: dict[torch.Tensor, str], *, stage: int, compression: Compressor,
                 backward_passes_per_step: int, op: ReduceOp, predivide: float,
                 process_set: ProcessSet, bucket_cap_mb: float,
                 buffer_sync: Callable[[], None] | None) -> None:
        self.base = cls = base
        if cls.__name__ in _NOT_ELEMENTWISE:
            raise ValueError(f"shard_optimizer_state=True steps each rank's flat shard of the "
                             f"parameters, which needs an elementwise update; {cls.__name__} "
                             "looks at whole tensors. Use it without sharding.")
        if not process_set.included():
            raise ValueError("shard_optimizer_state=True: this rank is not in the process set")
        self.names = names
        # The same list and group dicts as the optimizer's (load_state_in_place keeps them).
        self.param_groups = optimizer.param_groups
        self.defaults = optimizer.defaults
        self.stage = stage
        self.compression = compression
        self.op = op
        self.scale = (1.0 / predivide, predivide) if op == ReduceOp.AVERAGE else (1.0, 1.0)
        self.process_set = process_set
        self.loaded: dict[str, Any] | None = None  # see broadcast_state
        old_state = torch.optim.Optimizer.state_dict(optimizer) if optimizer.state else None
        self.index = {p: i for i, p in enumerate(
            p for group in self.param_groups for p in group["params"])}
        self.buckets = self.build_buckets(bucket_cap_mb * 2 ** 20)
        self.bucket_of = {p: b for b in self.buckets for p in b.params}
        self.gathering: dict[_ShardedGroup, int] = {}  # deferred allgathers
        self.defer = False
        params = list(self.bucket_of)
        self.reducer = Reducer(
            params, names, compression=compression, op=op, process_set=process_set,
            passes=backward_passes_per_step, predivide=predivide,
            layout=[b.params for b in self.buckets],
            collective=_ShardReduction(self.buckets, stage, compression, op,
                                       self.scale, process_set),
            packed=stage == 2)
        super().__init__(optimizer, params, names, buffer_sync)
        if old_state is not None:  # the plain optimizer had state: it becomes the shards'
            optimizer.state.clear()
            self.load_consolidated(old_state)

    def build_buckets(self, cap_bytes: float) -> list[_ShardedGroup]:
        rank, size = self.process_set.rank(), self.process_set.size()
        buckets: list[_ShardedGroup] = []
        for group_index, group in enumerate(self.param_groups):
            runs = consecutive_runs(
                reversed([p for p in group["params"] if p.requires_grad]),
                lambda p: p.dtype, lambda p: p.numel() * p.element_size(), cap_bytes)
            for params in runs:
                bucket = _ShardedGroup(len(buckets), group_index, params,
                                 [self.names[p] for p in params], rank, size)
                if bucket.count:
                    bucket.optimizer = self.shard_optimizer(bucket)
                buckets.append(bucket)
        return buckets

    def shard_optimizer(self, bucket: _ShardedGroup) -> torch.optim.Optimizer:
        cls = self.base
        group = {k: v for k, v in self.param_groups[bucket.group].items()
                 if k not in _NOT_HYPERPARAMETERS}
        # The defaults the constructor takes (AdamW's defaults hold one it sets itself);
        # the group carries every hyper-parameter anyway.
        accepted = inspect.signature(cls.__init__).parameters
        takes_any = any(p.kind == p.VAR_KEYWORD for p in accepted.values())
        defaults = {k: v for k, v in self.defaults.items() if takes_any or k in accepted}
        try:
            return cls([dict(group, params=[bucket.shard])], **defaults)
        except TypeError as exc:
            raise ValueError(f"shard_optimizer_state=True builds one {cls.__name__} per shard "
                             f"as {cls.__name__}(param_groups, **optimizer.defaults), which "
                             f"failed: {exc}") from exc

    # -- OptimizerSync ------------------------------------------------------------------
    @property
    def passes(self) -> int:
        return self.reducer.passes

    def set_passes(self, passes: int) -> None:
        self.reducer.set_passes(passes)

    def synchronize(self) -> None:
        """Finish every bucket's reduction (submitting those no hook completed). Stage 2:
        each rank then holds its shard of the averaged gradients (``param.grad`` is
        None); stage 1: ``param.grad`` is the averaged gradient."""
        try:
            self.untracked.check()
            self.reducer.synchronize()
        except Exception:
            self.abandon_step()
            raise
        self.synchronized = True

    def register_comm_hook(self, state: Any, hook: Callable[..., Any]) -> None:
        raise ValueError("register_comm_hook does not apply with shard_optimizer_state=True: "
                         "gradients are reduce-scattered, not allreduced. For fewer bytes "
                         "use compression=hvd.Compression.fp16 or .bf16.")

    def negotiation_stats(self) -> list[dict[str, int]]:
        return list(self.reducer.stats)

    def step(self, closure: Callable[[], Any] | None, local_step: LocalStep) -> Any:
        """Reduce (unless synchronized already), step every shard, allgather the updated
        shards into the parameters. A closure runs first (it usually runs forward and
        backward), and its loss is returned."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reduce_unless_skipped()
        self.loaded = None
        self.wait_for_parameters()
        for bucket in self.buckets:
            bucket.adopt()
            if bucket.optimizer is not None:
                shard_grad = self.shard_grad(bucket)
                inner_group = bucket.optimizer.param_groups[0]
                for key, value in self.param_groups[bucket.group].items():
                    if key not in _NOT_HYPERPARAMETERS:
                        inner_group[key] = value
                bucket.shard.grad = shard_grad
                bucket.optimizer.step()
                bucket.shard.grad = None
            if self.stage == 2:
                bucket.reduced = None
            # The shard is this rank's part of flat: gathered in place.
            self.gathering[bucket] = allgather_into_async(
                bucket.shard, bucket.flat, name=bucket.gather_name,
                process_set=self.process_set)
        if not self.defer:
            self.wait_for_parameters()
        self.after_step()
        return loss

    def defer_parameter_gather(self, model: torch.nn.Module) -> None:
        """Let ``step()`` return once the updated shards' allgathers are started: each
        module of ``model`` waits for its own parameters in a forward pre-hook, so the
        gathers of later layers overlap the forward of earlier ones. Parameters read
        outside a forward of ``model`` (saving, evaluation by other code) need
        ``wait_for_parameters()`` first; ``step()``, the state dict methods and
        ``broadcast_optimizer_state`` wait themselves. Under torch.compile each hook is
        a graph break."""
        me = weakref.ref(self)
        handles = []
        for module in model.modules():
            buckets = {self.bucket_of[p] for p in module.parameters(recurse=False)
                       if p in self.bucket_of}
            if buckets:
                def hook(module: Any, args: Any, buckets: set[_ShardedGroup] = buckets) -> None:
                    sync = me()
                    if sync is not None:
                        sync.wait(buckets)
                handles.append(module.register_forward_pre_hook(hook))
        weakref.finalize(self, _remove, handles)
        self.defer = True

    def wait_for_parameters(self) -> None:
        """Wait for the allgathers ``step()`` left running (``defer_parameter_gather``)."""
        self.wait(list(self.gathering))

    def wait(self, buckets: Any) -> None:
        for bucket in buckets:
            handle = self.gathering.pop(bucket, None)
            if handle is not None:
                mpi_ops.synchronize(handle)

    def pending_work(self) -> bool:
        return self.reducer.pending_work()

    def zero_grad(self, set_to_none: bool, plain: Callable[[bool], None]) -> None:
        """Stage 1's gradients are views of their bucket, zeroed in place whatever
        ``set_to_none`` says (as the replicated optimizer's)."""
        self.reducer.zero_grad(set_to_none)
        for bucket in self.buckets:
            bucket.reduced = None

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scale the averaged gradients so that their norm over all shards is at most
        max_norm, as ``torch.nn.utils.clip_grad_norm_`` over every parameter would;
        returns that total norm. Collective: every rank calls it, after
        ``synchronize()`` and before ``step()`` (inside ``skip_synchronize()``)."""
        if not self.synchronized:
            raise RuntimeError("clip_grad_norm_() needs the reduced gradients: call "
                               "optimizer.synchronize() first, then step() inside "
                               "`with optimizer.skip_synchronize():`.")
        norm_type = float(norm_type)
        shards = [self.shard_grad(b) for b in self.buckets if b.count]
        if norm_type == float("inf"):
            local = max((float(g.abs().max()) for g in shards if g.numel()), default=0.0)
            total = mpi_ops.allreduce(torch.tensor(local, dtype=torch.float64),
                                      name="zero.clip.max", op=ReduceOp.MAX,
                                      process_set=self.process_set)
        else:
            local = sum((torch.linalg.vector_norm(g, norm_type, dtype=torch.float64)
                         ** norm_type for g in shards), torch.tensor(0.0, dtype=torch.float64))
            total = mpi_ops.allreduce(local, name="zero.clip.sum", op=ReduceOp.SUM,
                                      process_set=self.process_set) ** (1.0 / norm_type)
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        with torch.no_grad():
            for bucket in self.buckets:  # stage 1: param.grad too (views of it)
                if bucket.reduced is not None:
                    bucket.reduced.mul_(coefficient.to(bucket.reduced.dtype))
        return total

    # -- state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's shards of the optimizer state (no communication). Load it back on
        the same rank of the same job, or pass every rank's to load_state_dict on any
        number of ranks; ``consolidate_state_dict()`` gives torch's plain format."""
        self.wait_for_parameters()
        groups = []
        for group in self.param_groups:
            hyper = {k: v for k, v in group.items() if k not in _NOT_HYPERPARAMETERS}
            groups.append(dict(hyper, params=[self.index[p] for p in group["params"]]))
        state = {}
        for bucket in self.buckets:
            if bucket.optimizer is not None:
                entries = bucket.optimizer.state_dict()["state"].get(0)
                if entries:
                    state[bucket.index] = entries
        layouts = [bucket_layout([self.index[p] for p in b.params],
                                 [p.shape for p in b.params], b.start, b.count)
                   for b in self.buckets]
        return {"state": state, "param_groups": groups,
                SHARDED_KEY: {"world_size": self.process_set.size(),
                              "rank": self.process_set.rank(),
                              "stage": self.stage, "buckets": layouts}}

    def consolidate_state_dict(self, to: int | None = 0) -> dict[str, Any] | None:
        """The whole optimizer state in torch's plain format (what the wrapped optimizer
        would hold without sharding; loadable into it, or into a sharded optimizer on any
        number of ranks) on rank ``to`` (a world rank; None: on every rank), None on the
        others. Collective. Peak memory: the whole state on ``to``, one rank's shards
        elsewhere."""
        mine = self.state_dict()
        ranks = self.process_set.ranks or list(range(self.process_set.size()))
        gathered = []
        for index, world_rank in enumerate(ranks):
            piece = broadcast_object(mine if index == self.process_set.rank() else None,
                                     root_rank=world_rank,
                                     name=f"zero.consolidate.{index}",
                                     process_set=self.process_set)
            if to is None or _world_rank() == to:
                gathered.append(piece)
        return consolidate(gathered) if gathered else None

    def load_state_dict(self, state_dict: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """Load a consolidated state dict (torch's format, e.g. from
        ``consolidate_state_dict()`` or a plain optimizer), this rank's own sharded one,
        or the list of every rank's sharded ones (from any number of ranks). Local: each
        rank takes its shards. Abandons a step in progress, as DistributedOptimizer's."""
        self.wait_for_parameters()
        self.abandon_step()
        if isinstance(state_dict, (list, tuple)):
            state_dict = consolidate(state_dict)
        meta = state_dict.get(SHARDED_KEY)
        if meta is None:
            self.load_consolidated(state_dict)
            self.loaded = state_dict
            return
        layouts = [bucket_layout([self.index[p] for p in b.params],
                                 [p.shape for p in b.params], b.start, b.count)
                   for b in self.buckets]
        if meta["world_size"] != self.process_set.size() or \
                meta["rank"] != self.process_set.rank() or meta["buckets"] != layouts:
            raise ValueError(
                f"load_state_dict: this sharded state dict is rank {meta['rank']}'s of "
                f"{meta['world_size']} ranks, with its own layout; on rank "
                f"{self.process_set.rank()} of {self.process_set.size()} pass the "
                "list of every rank's sharded state dicts, or a consolidated one.")
        self.load_groups(state_dict["param_groups"])
        for bucket in self.buckets:
            if bucket.optimizer is not None:
                self.load_shard(bucket, state_dict["state"].get(bucket.index, {}))

    def load_consolidated(self, state_dict: dict[str, Any]) -> None:
        self.load_groups(state_dict["param_groups"])
        for bucket in self.buckets:
            if bucket.optimizer is not None:
                layout = bucket_layout([self.index[p] for p in bucket.params],
                                       [p.shape for p in bucket.params], bucket.start,
                                       bucket.count)
                self.load_shard(bucket, shard_of(state_dict, layout, bucket.names))

    def load_groups(self, groups: list[dict[str, Any]]) -> None:
        if len(groups) != len(self.param_groups) or any(
                len(g["params"]) != len(mine["params"])
                for g, mine in zip(groups, self.param_groups)):
            raise ValueError("load_state_dict: the state dict's param groups do not match "
                             "this optimizer's (number of groups or of parameters in one)")
        for mine, loaded in zip(self.param_groups, groups):
            mine.update({k: v for k, v in loaded.items() if k not in _NOT_HYPERPARAMETERS})

    def load_shard(self, bucket: _ShardedGroup, entries: dict[str, Any]) -> None:
        inner = bucket.optimizer
        group = dict(inner.param_groups[0], **{
            k: v for k, v in self.param_groups[bucket.group].items()
            if k not in _NOT_HYPERPARAMETERS})
        group["params"] = [0]
        inner.state.clear()
        inner.load_state_dict({"state": {0: entries} if entries else {},
                               "param_groups": [group]})

    def broadcast_state(self, root_rank: int) -> bool:
        """``broadcast_optimizer_state`` for sharded state (collective). The shards are
        one state between them, so what root sends is its hyper-parameters, and the state
        it loaded from a consolidated dict since its last step (the usual resume: rank 0
        loads a checkpoint, then broadcasts), which every rank then loads its part of."""
        is_root = _world_rank() == root_rank
        loaded = broadcast_object(self.loaded if is_root else None, root_rank,
                                  name="zero.broadcast_state.loaded",
                                  process_set=self.process_set)
        if loaded is not None:
            if not is_root:
                self.load_state_dict(loaded)
            self.loaded = None
            return True
        groups = broadcast_object(
            [{k: v for k, v in g.items() if k not in _NOT_HYPERPARAMETERS}
             for g in self.param_groups] if is_root else None, root_rank,
            name="zero.broadcast_state.groups", process_set=self.process_set)
        if len(groups) != len(self.param_groups):
            raise ValueError(f"broadcast_optimizer_state: rank {root_rank} has {len(groups)} "
                             f"param groups, this rank {len(self.param_groups)}")
        for mine, theirs in zip(self.param_groups, groups):
            mine.update(theirs)
        return True

    def shard_state_bytes(self) -> int:
        """Bytes of the tensors in this rank's optimizer state."""
        return sum(v.numel() * v.element_size() for b in self.buckets
                   if b.optimizer is not None for entries in b.optimizer.state.values()
                   for v in entries.values() if isinstance(v, torch.Tensor))

    # -- gradient flow -----------------------------------------------------------------
    def shard_grad(self, bucket: _ShardedGroup) -> torch.Tensor:
        reduced = bucket.reduced
        if reduced is None:
            raise RuntimeError("the gradients were not reduced: call synchronize() first")
        if self.stage == 1:
            reduced = reduced[bucket.start:bucket.start + bucket.count]
        return reduced if reduced.dtype == bucket.shard.dtype else reduced.to(bucket.shard.dtype)

    def abandon_step(self) -> None:
        self.reducer.abandon_step()
        for bucket in self.buckets:
            bucket.reduced = None
        self.synchronized = False

class ShardedOptimizer(WrappedOptimizer):
    """The sharded optimizer's own methods, beside the shared ones (WrappedOptimizer)."""

    _horovodish: ShardedSync

    def register_comm_hook(self, state: Any, hook: Callable[..., Any]) -> None:
        raise ValueError("register_comm_hook does not apply with shard_optimizer_state=True: "
                         "gradients are reduce-scattered, not allreduced. For fewer bytes "
                         "use compression=hvd.Compression.fp16 or .bf16.")

    def defer_parameter_gather(self, model: torch.nn.Module) -> None:
        self._horovodish.defer_parameter_gather(model)

    def wait_for_parameters(self) -> None:
        self._horovodish.wait_for_parameters()

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        return self._horovodish.clip_grad_norm_(max_norm, norm_type)

    def state_dict(self) -> dict[str, Any]:
        return self._horovodish.state_dict()

    def consolidate_state_dict(self, to: int | None = 0) -> dict[str, Any] | None:
        return self._horovodish.consolidate_state_dict(to)

    def load_state_dict(self, state_dict: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        self._horovodish.load_state_dict(state_dict)

    def shard_state_bytes(self) -> int:
        return self._horovodish.shard_state_bytes()


for _method in ("defer_parameter_gather", "wait_for_parameters", "clip_grad_norm_",
                "state_dict", "consolidate_state_dict", "load_state_dict", "shard_state_bytes"):
    getattr(ShardedOptimizer, _method).__doc__ = getattr(ShardedSync, _method).__doc__


def _world_rank() -> int:
    from ..common.api.process_state import rank
    return rank()


def _remove(handles: list[Any]) -> None:
    for handle in handles:
        handle.remove()


class _ShardReduction:
    """The sharded optimizer's bucket collective (reducer.BucketCollective). Stage 2:
    the packed gradients reduce-scattered into this rank's shard, the gradients freed.
    Stage 1: the flat bucket allreduced in place (``param.grad`` stays its view)."""

    def __init__(self, buckets: list[_ShardedGroup], stage: int, compression: Compressor, op: ReduceOp,
                 scale: tuple[float, float], process_set: ProcessSet) -> None:
        self.buckets, self.stage, self.compression = buckets, stage, compression
        self.op, self.scale, self.process_set = op, scale, process_set

    def send(self, bucket: FlatBucket) -> Any:
        compressed, ctx = self.compression.compress(bucket.source())
        prescale, postscale = self.scale
        name = self.buckets[bucket.index].reduce_name
        if self.stage == 2:
            for param in bucket.params:  # each rank keeps only its shard of the sum
                param.grad = None
            handle = mpi_ops.reducescatter_async(
                compressed, name=name, op=self.op, process_set=self.process_set,
                prescale_factor=prescale, postscale_factor=postscale)
        else:
            handle = mpi_ops.allreduce_async_(
                compressed, name=name, op=self.op, prescale_factor=prescale,
                postscale_factor=postscale, process_set=self.process_set)
        if ctx is None:
            return handle
        return lambda: self.compression.decompress(mpi_ops.synchronize(handle), ctx)

    def finish(self, bucket: FlatBucket, result: torch.Tensor) -> None:
        if self.stage == 1 and result is not bucket.flat:
            bucket.flat.copy_(result)
        self.buckets[bucket.index].reduced = result if self.stage == 2 else bucket.flat
