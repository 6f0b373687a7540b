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
* After ``synchronize()`` each ``param.grad`` is the reduced gradient, by default
  installed as a view of the runtime's result block (nothing is copied back into the
  old gradient tensor, as with DDP's ``gradient_as_bucket_view=True``): a reference to
  ``param.grad`` taken before ``synchronize()`` keeps the local, unreduced gradient.
  ``gradient_as_bucket_view=False`` reduces into the existing gradient tensors instead
  (Horovod's behaviour). ``op=Adasum`` builds a different optimizer (Horovod's delta
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

import contextlib
import warnings
import weakref
from collections import Counter, deque
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from ..common.messages import ReduceOp
from ..common.api.process_sets import ProcessSet, global_process_set
from . import mpi_ops
from .buckets import GradientBuckets
from .comm_hooks import CommHook, GradBucket
from .compression import Compression
from .functions import load_state_in_place
from .sparse import sparse_allreduce_async, sparse_zeros
from .tracked import check_tracked
from .zero import _ShardedOptimizer, sharded_class

_STATS_KEPT = 1000


class _DistributedOptimizer:
    """Mixed in before the wrapped optimizer's class; state lives in ``_hvd_*`` fields."""

    def _hvd_setup(self, names: dict[torch.Tensor, str], compression: Any,
                   backward_passes_per_step: int, op: ReduceOp, predivide: float,
                   groups: list[list[torch.Tensor]] | None, sparse_as_dense: bool,
                   process_set: ProcessSet, bucket_cap_mb: float,
                   buffer_sync: Callable[[], None] | None,
                   gradient_as_bucket_view: bool = True) -> None:
        self._parameter_names = names
        self._hvd_params = [p for group in self.param_groups for p in group["params"]
                            if p.requires_grad]
        self._hvd_compression = compression
        self._hvd_op = op
        self._hvd_scale = (1.0 / predivide, predivide) if op == ReduceOp.AVERAGE else (1.0, 1.0)
        self._hvd_sparse_as_dense = sparse_as_dense
        self._hvd_process_set = process_set
        self._hvd_member = process_set.included()
        self._hvd_buffer_sync = buffer_sync
        # Results as views of runtime blocks (no copy back), or reduced in place into the
        # gradient tensors (Horovod's semantics: param.grad keeps its identity).
        self._hvd_as_view = gradient_as_bucket_view
        self._hvd_buckets = GradientBuckets(bucket_cap_mb * 2 ** 20, groups)
        self._hvd_sparse: dict[torch.Tensor, int] = {}  # sparse_dim of sparse gradients
        self._hvd_agreed = False  # on sparsity (and bucket order): see _hvd_agree
        # (handle, or a comm hook's finish; params, compression contexts, sent as sparse)
        self._hvd_pending: list[tuple[Any, list[torch.Tensor], list[Any], bool]] = []
        self._hvd_comm_hook: tuple[Any, CommHook] | None = None
        self._hvd_steps = 0  # synchronized steps, for comm hooks (GradBucket.step)
        self._hvd_submitted: set[torch.Tensor] = set()
        self._hvd_should_sync = True
        self._hvd_synchronized = False
        self._hvd_stats: deque[dict[str, int]] = deque(maxlen=_STATS_KEPT)
        self._hvd_step_start: tuple[int, int, int] | None = None
        self._hvd_submissions = 0
        self._hvd_arrivals = 0  # gradients final for this step so far (hook order)
        self._hvd_submitted_after: list[int] = []
        self.set_backward_passes_per_step(backward_passes_per_step)
        me = weakref.ref(self)

        def hook(param: torch.Tensor) -> None:
            optimizer = me()
            if optimizer is not None:
                optimizer._hvd_grad_ready(param)
        handles = [p.register_post_accumulate_grad_hook(hook) for p in self._hvd_params]
        # Hooks outlive a dropped optimizer otherwise, and would keep reducing gradients.
        weakref.finalize(self, _remove, handles)

    # -- public API --------------------------------------------------------------------
    def set_backward_passes_per_step(self, passes: int) -> None:
        """Reduce on every passes-th backward; gradients accumulate locally in between."""
        if int(passes) < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {passes}")
        self.backward_passes_per_step = int(passes)
        self._hvd_delay = {p: self.backward_passes_per_step for p in self._hvd_params}

    def synchronize(self) -> None:
        """Finish every gradient reduction of this step (submitting what no hook sent)."""
        if not self._hvd_member:
            self._hvd_synchronized = True
            return
        leftovers = [p for p in self._hvd_params if p not in self._hvd_submitted]
        try:
            check_tracked(self, self._hvd_delay, self._parameter_names)
            # Before the zeros for gradients this rank lacks: whether to send them
            # sparse depends on what the other ranks had.
            order = self._hvd_agree(leftovers) if not self._hvd_agreed else None
            if leftovers:
                self._hvd_submit(leftovers)
            self._hvd_install_results()
        except Exception:
            # A failed reduction (a lost or mismatched peer) ends the step: whatever
            # else is in flight is waited out, and the next backward starts afresh (an
            # elastic retry would otherwise find reductions pending for good).
            self._hvd_abandon_step()
            raise
        self._hvd_next_step()
        self._hvd_buckets.end_step()
        if order is not None:  # settled, in a step that went through on this rank
            self._hvd_agreed = True
        if self._hvd_buckets.learning:
            if order is None:  # not every rank took part: learn on a later step
                self._hvd_buckets.forget_order()
            else:
                self._hvd_buckets.learn(order)
        self._hvd_record_stats()
        self._hvd_steps += 1
        self._hvd_synchronized = True

    def _hvd_next_step(self) -> None:
        """Nothing pending or submitted, every parameter's pass count full again."""
        self._hvd_pending.clear()
        self._hvd_submitted.clear()
        for param in self._hvd_params:
            self._hvd_delay[param] = self.backward_passes_per_step

    def _hvd_install_results(self) -> None:
        while self._hvd_pending:  # popped first: a failure leaves the rest to abandon
            handle, params, ctxs, sparse = self._hvd_pending.pop(0)
            outputs = handle() if callable(handle) else mpi_ops.synchronize(handle)
            if isinstance(outputs, torch.Tensor) and not sparse:  # a hook's flat result
                outputs = _split(outputs, params)
            if sparse:
                params[0].grad = outputs
                continue
            for param, output, ctx in zip(params, outputs, ctxs):
                reduced = self._hvd_compression.decompress(output, ctx)
                grad = param.grad
                if reduced is grad:  # reduced in place
                    continue
                # A sparse gradient reduced as dense (sparse_as_dense, or in a group) goes
                # back sparse, as Horovod's does: the optimizer was chosen for sparse
                # gradients (SparseAdam refuses dense ones). A result in a runtime block
                # (or a fresh decompressed tensor) is installed rather than copied over
                # the old gradient, unless the caller asked to keep gradient tensors or
                # the parameter has another memory layout.
                sparse_dim = self._hvd_sparse.get(param)
                if sparse_dim is not None:
                    param.grad = reduced.to_sparse(sparse_dim)
                elif grad.is_sparse or (self._hvd_as_view and param.is_contiguous()
                                        and reduced.dtype == grad.dtype):
                    param.grad = reduced
                else:
                    grad.copy_(reduced)

    def _hvd_abandon_step(self) -> None:
        """Forget this step's reductions (each waited out, its error dropped) and the
        gradients accumulated towards it."""
        for handle, *_ in self._hvd_pending:
            try:
                handle() if callable(handle) else mpi_ops.synchronize(handle)
            except Exception:
                pass
        self._hvd_next_step()
        self._hvd_buckets.abandon_step()
        self._hvd_step_start = None
        self._hvd_submissions = self._hvd_arrivals = 0
        self._hvd_submitted_after = []
        self._hvd_synchronized = False

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as torch does, but in place (see functions.load_state_in_place), and
        abandon a step in progress, as Horovod does: an elastic restore follows a
        failed step."""
        self._hvd_abandon_step()
        load_state_in_place(self, state_dict, super().load_state_dict)

    def register_comm_hook(self, state: Any, hook: CommHook) -> None:
        """Send each bucket through ``hook(state, bucket)`` instead of an exact allreduce
        (DDP's ``register_comm_hook``; see horovodish/torch/comm_hooks.py): built-ins
        ``hvd.fp16_compress_hook``, ``hvd.bf16_compress_hook``, and ``hvd.powersgd_hook``
        with a ``hvd.PowerSGDState``. Every rank registers the same hook, once, before
        the first backward. Sparse gradients (unless ``sparse_as_dense``) bypass it."""
        if self._hvd_comm_hook is not None:
            raise RuntimeError("register_comm_hook: a communication hook is registered "
                               "already (one per optimizer, as in DDP)")
        if self._hvd_compression is not Compression.none:
            raise ValueError("register_comm_hook: this optimizer compresses already "
                             f"(compression={self._hvd_compression.__name__}); use the "
                             "hook alone (e.g. hvd.fp16_compress_hook)")
        if self._hvd_pending or self._hvd_steps or self._hvd_submitted:
            raise RuntimeError("register_comm_hook: register the hook before the first "
                               "backward pass")
        if not callable(hook):
            raise TypeError(f"register_comm_hook: hook must be callable, got {hook!r}")
        self._hvd_comm_hook = (state, hook)

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """For ``synchronize(); clip gradients; with skip_synchronize(): step()``."""
        self._hvd_should_sync = False
        try:
            yield
        finally:
            self._hvd_should_sync = True

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        if self._hvd_should_sync:
            if self._hvd_synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "after optimizer.synchronize(); the gradients are reduced "
                              "again. Wrap step() in `with optimizer.skip_synchronize():`.")
            self.synchronize()
        self._hvd_synchronized = False
        result = super().step(closure)
        if self._hvd_buffer_sync is not None:
            self._hvd_buffer_sync()
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._hvd_submitted or self._hvd_pending or any(
                d != self.backward_passes_per_step for d in self._hvd_delay.values()):
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(): gradient reductions are "
                "pending (or accumulating for backward_passes_per_step), and zeroing now "
                "would race with them. Call step() (or synchronize()) first.")
        super().zero_grad(set_to_none)

    def negotiation_stats(self) -> list[dict[str, int]]:
        """Per synchronized step (oldest first, the last 1000): runtime ``cycles``,
        ``slow_cycles`` and ``fast_cycles`` from this step's first gradient submission to
        the end of synchronize(); ``submissions`` (calls into the core); ``gradients``
        (hooks that found a final gradient); and ``submitted_after``: for each submission,
        how many gradients had arrived when it went out. With learned buckets that follow
        execution it rises in step with arrivals (e.g. [4, 8, 12] for three buckets of
        four); a bucket whose members arrive far apart shows as a late entry."""
        return list(self._hvd_stats)

    # -- gradient flow -----------------------------------------------------------------
    def _hvd_grad_ready(self, param: torch.Tensor) -> None:
        if not self._hvd_member:
            return
        if param in self._hvd_submitted or self._hvd_delay[param] <= 0:
            raise AssertionError(
                f"the gradient of '{self._parameter_names[param]}' was computed more than "
                f"backward_passes_per_step={self.backward_passes_per_step} times before "
                "step(). Call step() after each backward, or increase "
                "backward_passes_per_step to accumulate gradients locally.")
        self._hvd_delay[param] -= 1
        if self._hvd_delay[param] > 0:
            return
        self._hvd_arrivals += 1
        grad = param.grad
        if grad is not None and grad.is_sparse:
            self._hvd_sparse.setdefault(param, grad.sparse_dim())
            if self._hvd_sends_sparse(param):
                self._hvd_submit([param])
                return
        ready = self._hvd_buckets.ready(param)
        if ready:
            self._hvd_submit(ready)

    def _hvd_sends_sparse(self, param: torch.Tensor) -> bool:
        """Sparse gradients travel as (indices, values) unless asked for dense, or their
        parameter sits in a bucket (buckets are dense)."""
        return not self._hvd_sparse_as_dense and self._hvd_buckets.index(param) is None

    def _hvd_submit(self, params: Sequence[torch.Tensor]) -> None:
        if self._hvd_step_start is None:
            self._hvd_step_start = self._hvd_counters()
        self._hvd_submitted_after.append(self._hvd_arrivals)
        self._hvd_submitted.update(params)
        dense, tensors, ctxs, names = [], [], [], []
        for param in params:
            name = self._parameter_names[param]  # the op prefix is names_for's, as Horovod's
            sparse = param in self._hvd_sparse and self._hvd_sends_sparse(param)
            if param.grad is None:  # no gradient on this rank: contribute zeros
                param.grad = sparse_zeros(param, self._hvd_sparse[param]) if sparse \
                    else torch.zeros_like(param)
            grad = param.grad
            if sparse and grad.is_sparse:
                handle = sparse_allreduce_async(grad, name, self._hvd_op,
                                                self._hvd_process_set)
                self._hvd_pending.append((handle, [param], [None], True))
                self._hvd_submissions += 1
                continue
            compressed, ctx = self._hvd_compression.compress(
                grad.to_dense() if grad.is_sparse else grad)
            dense.append(param)
            tensors.append(compressed)
            ctxs.append(ctx)
            names.append(name)
        if tensors and self._hvd_comm_hook is not None:
            state, hook = self._hvd_comm_hook
            bucket = GradBucket(len(self._hvd_pending), dense,
                                [self._parameter_names[p] for p in dense], tensors,
                                self._hvd_op, *self._hvd_scale, self._hvd_process_set,
                                self._hvd_steps)
            self._hvd_pending.append((hook(state, bucket), dense, ctxs, False))
            self._hvd_submissions += 1
        elif tensors:
            prescale, postscale = self._hvd_scale
            allreduce = mpi_ops.grouped_allreduce_into_runtime_async if self._hvd_as_view \
                else mpi_ops.grouped_allreduce_async_
            handle = allreduce(
                tensors, name=names, op=self._hvd_op, prescale_factor=prescale,
                postscale_factor=postscale, process_set=self._hvd_process_set)
            self._hvd_pending.append((handle, dense, ctxs, False))
            self._hvd_submissions += 1

    def _hvd_agree(self, unseen: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """First steps: agree across ranks on which gradients are sparse (so that a rank
        without one sends an empty sparse gradient, not dense zeros under another name)
        and on one gradient order to bucket by (so that every rank fuses alike).

        One Sum allreduce of integer counts, not an allgather: a rank that has joined
        takes part with zeros. Entries go by parameter name (ranks may list parameters in
        different orders). The sparse gradients the ranks that took part report apply at
        once; the order waits for a step every rank takes part in (the counts show it),
        since a joined rank learns nothing and every rank must bucket alike. The order
        is by the ranks' summed positions (ties by name), the same on every rank.
        Returns the order to bucket by, or None while not settled."""
        names = self._parameter_names
        params = sorted(self._hvd_params, key=names.__getitem__)
        count = len(params)
        position = {p: i + 1 for i, p in enumerate(self._hvd_buckets.recorded(unseen))}
        mine = torch.zeros(1 + 3 * count, dtype=torch.int64)
        mine[0] = 1
        for i, param in enumerate(params):
            mine[1 + i] = position.get(param, count + 1)
            if param in self._hvd_sparse:
                mine[1 + count + i] = 1
                mine[1 + 2 * count + i] = self._hvd_sparse[param] + 1
        if self._hvd_process_set.size() > 1:
            name = f"DistributedOptimizer.agree.{count}.{names[params[0]]}" if params \
                else "DistributedOptimizer.agree.0"
            total = mpi_ops.allreduce(mine, name=name, op=ReduceOp.SUM,
                                      process_set=self._hvd_process_set)
        else:
            total = mine
        sums = total[1:1 + count].tolist()
        had_sparse = total[1 + count:1 + 2 * count].tolist()
        dims = total[1 + 2 * count:].tolist()
        self._hvd_sparse.update({p: dims[i] // had_sparse[i] - 1
                                 for i, p in enumerate(params) if had_sparse[i]})
        if int(total[0]) < self._hvd_process_set.size():
            return None
        ranked = sorted(range(count), key=lambda i: (sums[i], names[params[i]]))
        return [params[i] for i in ranked if params[i] not in self._hvd_sparse]

    def _hvd_restart_agreement(self) -> None:
        """Agree (and learn buckets) afresh from the next step, as a worker that joins an
        elastic job does: called on every rank by broadcast_optimizer_state."""
        self._hvd_agreed = False
        self._hvd_buckets.relearn()

    def _hvd_counters(self) -> tuple[int, int, int]:
        runtime = self._hvd_process_set.runtime
        return runtime.cycles, runtime.controller.slow_cycles, runtime.controller.fast_cycles

    def _hvd_record_stats(self) -> None:
        if self._hvd_step_start is None:
            return
        end = self._hvd_counters()
        cycles, slow, fast = (b - a for a, b in zip(self._hvd_step_start, end))
        self._hvd_stats.append({"cycles": cycles, "slow_cycles": slow, "fast_cycles": fast,
                                "submissions": self._hvd_submissions,
                                "gradients": self._hvd_arrivals,
                                "submitted_after": self._hvd_submitted_after})
        self._hvd_step_start = None
        self._hvd_submissions = 0
        self._hvd_arrivals = 0
        self._hvd_submitted_after = []


def _adasum_optimizer(optimizer: torch.optim.Optimizer,
                      named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
                      compression: Any, backward_passes_per_step: int,
                      process_set: ProcessSet) -> Any:
    from .adasum_optimizer import adasum_class
    if backward_passes_per_step != 1:
        raise ValueError("DistributedOptimizer(op=Adasum) combines the deltas of every step; "
                         "backward_passes_per_step must be 1 (accumulate gradients yourself "
                         "and call step() once per combined update).")
    names = _parameter_names(optimizer, named_parameters)
    cls = adasum_class(type(optimizer))
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k != "step"})
    wrapped._hvd_adasum_setup(names, compression, process_set)
    return wrapped


def _sharded_optimizer(optimizer: torch.optim.Optimizer,
                       named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
                       compression: Any, backward_passes_per_step: int, op: ReduceOp,
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
    if isinstance(optimizer, (_DistributedOptimizer, _ShardedOptimizer)):
        raise ValueError("this optimizer is already a DistributedOptimizer; wrap the plain "
                         "torch optimizer once")
    names = _parameter_names(optimizer, named_parameters)
    cls = sharded_class(type(optimizer))
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k != "step"})
    wrapped._zero_setup(names, stage, compression, backward_passes_per_step, op,
                        float(predivide), process_set, bucket_cap_mb, buffer_sync)
    return wrapped


# Our step() already runs inside the wrapped class's hooked step (via super()), so torch
# must not wrap it again when it re-patches classes in load_state_dict/__setstate__.
_DistributedOptimizer.step.hooked = True  # type: ignore[attr-defined]

_classes: dict[type, type] = {}


def _split(flat: torch.Tensor, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """A hook's flat result as one view per parameter."""
    if flat.numel() != sum(p.numel() for p in params):
        raise ValueError(f"a communication hook returned {flat.numel()} values for a bucket "
                         f"of {sum(p.numel() for p in params)}")
    views, offset = [], 0
    for param in params:
        views.append(flat[offset:offset + param.numel()].view(param.shape))
        offset += param.numel()
    return views


def _remove(handles: list[Any]) -> None:
    for handle in handles:
        handle.remove()


def _distributed_class(base: type) -> type:
    if base not in _classes:
        _classes[base] = type(base.__name__, (_DistributedOptimizer, base),
                              {"__module__": __name__})
    return _classes[base]


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
                         compression: Any = Compression.none,
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
    (default True: reduced gradients are installed as views of the runtime's result
    blocks, saving a copy; False reduces into the existing gradient tensors, as Horovod
    and DDP's default do, for code that holds on to ``param.grad`` across ``step()``),
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
    if shard_optimizer_state:
        return _sharded_optimizer(optimizer, named_parameters, compression,
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
        return _adasum_optimizer(optimizer, named_parameters, compression,
                                 backward_passes_per_step, process_set)
    if isinstance(optimizer, (_DistributedOptimizer, _ShardedOptimizer)):
        raise ValueError("this optimizer is already a DistributedOptimizer; wrap the plain "
                         "torch optimizer once")
    if num_groups:
        warnings.warn("num_groups is deprecated; use groups=", DeprecationWarning)
        groups = num_groups if groups is None else groups
    names = _parameter_names(optimizer, named_parameters)
    wrapped = _distributed_class(type(optimizer)).__new__(_distributed_class(type(optimizer)))
    # Share the wrapped optimizer's state, groups, defaults and hooks. "step" is dropped:
    # an LR scheduler may have put a bound step of the original there.
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k != "step"})
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    wrapped._hvd_setup(names, compression, backward_passes_per_step, op,
                       float(gradient_predivide_factor), _groups(params, groups),
                       sparse_as_dense, process_set, bucket_cap_mb, buffer_sync,
                       gradient_as_bucket_view)
    return wrapped
