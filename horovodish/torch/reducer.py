"""The gradient path of DistributedOptimizer: one object owns buckets, hooks, pending
work and accumulation (DDP's ``Reducer``, in Python).

A step's walk:

* **First step (learning).** A hook on every parameter submits its gradient the moment
  autograd has accumulated it, and the arrival order is recorded. At ``synchronize()``
  the ranks agree on one order (``_agree``), which is cut into buckets of one dtype up to
  ``bucket_cap_mb`` (or the user's ``groups=``).
* **Later steps (flat buckets).** Each bucket becomes one flat tensor and every
  member's ``param.grad`` a view of it (flat_buckets.py). The per-parameter hooks are
  removed; one hook per bucket, on the member that arrives last on this rank, checks
  that the bucket is complete and submits it as one in-place allreduce: one Python call,
  one negotiated name, one response-cache bit per bucket. ``synchronize()`` submits what
  no hook did (a changed graph), waits, and the views already hold the result.
* Parameters outside the flat buckets (sparse gradients, non-contiguous parameters, or
  ``gradient_as_bucket_view=False`` / ``bucket_cap_mb=0``: Horovod's per-tensor path)
  keep a hook each and go through the grouped per-tensor path.

A bucket that was late because its trigger came early (a new order of backward) makes
this rank watch one step with per-parameter hooks and pick new triggers: a local choice,
since the buckets' layout, which every rank must share, does not change.
"""
from __future__ import annotations

import weakref
from collections import deque
from typing import Any, Protocol, Sequence

import torch

from ..common.api.process_sets import ProcessSet
from ..common.compression import Compressor
from ..common.messages import ReduceOp
from . import mpi_ops
from .buckets import GradientBuckets
from .comm_hooks import CommHook, GradBucket
from .grad_ready import register_grad_ready_hook
from .flat_buckets import FlatBucket, plan, zero
from .sparse import sparse_allreduce_async, sparse_zeros

_STATS_KEPT = 1000


class _Pending:
    """One submission of this step: a runtime handle or a comm hook's finish."""

    __slots__ = ("wait", "params", "ctxs", "sparse", "bucket", "untouched")

    def __init__(self, wait: Any, params: list[torch.Tensor], ctxs: list[Any],
                 sparse: bool = False, bucket: FlatBucket | None = None,
                 untouched: bool = False) -> None:
        self.wait, self.params, self.ctxs = wait, params, ctxs
        self.sparse, self.bucket = sparse, bucket
        self.untouched = untouched  # the bucket must not change until it is reduced

    def result(self) -> Any:
        return self.wait() if callable(self.wait) else mpi_ops.synchronize(self.wait)


class BucketCollective(Protocol):
    """What a bucket's reduction is: the Reducer's own (an allreduce in place), or the
    sharded optimizer's (a reduce-scatter into this rank's shard)."""

    def send(self, bucket: FlatBucket) -> Any:
        """Start the bucket's collective: a runtime handle, or a callable that waits."""

    def finish(self, bucket: FlatBucket, result: Any) -> None:
        """The result is in: put it where the optimizer reads it."""


class Reducer:
    """``layout`` (the sharded optimizer's): fixed buckets, flat from the first step, sent
    by ``collective``; without it, buckets are learned and allreduced in place. Everything
    but the parameters and their names is a keyword: the replicated and the sharded
    optimizer configure it differently, and a keyword says which setting is which."""

    def __init__(self, params: Sequence[torch.Tensor], names: dict[torch.Tensor, str], *,
                 compression: Compressor, op: ReduceOp, process_set: ProcessSet,
                 passes: int = 1, predivide: float = 1.0, sparse_as_dense: bool = False,
                 bucket_cap_mb: float = 0.0, groups: list[list[torch.Tensor]] | None = None,
                 as_view: bool = True, layout: Sequence[Sequence[torch.Tensor]] | None = None,
                 collective: BucketCollective | None = None, packed: bool = False) -> None:
        self.params = list(params)
        self.names = names
        self.compression = compression
        self.op = op
        self.scale = (1.0 / predivide, predivide) if op == ReduceOp.AVERAGE else (1.0, 1.0)
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self.member = process_set.included()
        # Flat buckets whose views are the gradients (from the second step), or none: the
        # gradient tensors autograd made, each reduced in place (Horovod's per-tensor
        # path). A gradient outside the buckets is reduced in place either way.
        self.as_view = as_view
        self.holding = GradientBuckets(0.0 if layout else bucket_cap_mb * 2 ** 20, groups)
        # None: this object's own send/finish (no reference to itself: no cycle, so a
        # dropped optimizer's hooks go with it at once).
        self.collective = collective
        self.sparse: dict[torch.Tensor, int] = {}  # sparse_dim of sparse gradients
        self.agreed = False  # on sparsity (and bucket order): see _agree
        self.pending: list[_Pending] = []
        self.comm_hook: tuple[Any, CommHook] | None = None
        self.steps = 0  # synchronized steps (GradBucket.step)
        self.submitted: set[torch.Tensor] = set()  # loose parameters sent this step
        self.flat: list[FlatBucket] = []
        self.flattened = False  # the agreed buckets were turned into flat ones
        self.loose = list(self.params)  # parameters with a hook of their own
        self.arrival: list[torch.Tensor] = []  # this rank's hook order, while watched
        self.watching = True  # per-parameter hooks on every parameter, order recorded
        self.stats: deque[dict[str, int]] = deque(maxlen=_STATS_KEPT)
        self._step_start: tuple[int, int, int] | None = None
        self._submissions = self._arrivals = self._late = self._at_synchronize = 0
        self._submitted_after: list[int] = []
        self.set_passes(passes)
        self._hooks: dict[torch.Tensor, Any] = {}
        me = weakref.ref(self)

        def grad_hook(param: torch.Tensor) -> None:
            reducer = me()
            if reducer is not None:
                reducer.grad_ready(param)

        def bucket_hook(param: torch.Tensor) -> None:
            reducer = me()
            if reducer is not None:
                reducer.trigger_ready(param)
        self._grad_hook, self._bucket_hook = grad_hook, bucket_hook
        for param in self.params:
            self._hooks[param] = register_grad_ready_hook(param, grad_hook)
        self._trigger_of: dict[torch.Tensor, FlatBucket] = {}
        self._bucket_of: dict[torch.Tensor, FlatBucket] = {}
        if layout:  # flat from the start; the first step is watched for triggers
            self.agreed = True
            self._make_flat(layout, packed)
        # Hooks outlive a dropped optimizer otherwise, and would keep reducing gradients.
        weakref.finalize(self, _remove, self._hooks)

    # -- settings ----------------------------------------------------------------------
    def set_passes(self, passes: int) -> None:
        if int(passes) < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {passes}")
        self.passes = int(passes)
        self.delay = {p: self.passes for p in self.params}

    def register_comm_hook(self, state: Any, hook: CommHook) -> None:
        if self.pending or self.steps or self.submitted:
            raise RuntimeError("register_comm_hook: register the hook before the first "
                               "backward pass")
        self.comm_hook = (state, hook)

    # -- hooks -------------------------------------------------------------------------
    def grad_ready(self, param: torch.Tensor) -> None:
        """A per-parameter hook: param's gradient is accumulated for this pass."""
        if not self.member:
            return
        bucket = self._bucket_of.get(param)
        if bucket is not None:  # watched: record, and go by the bucket
            self.arrival.append(param)
            if param is bucket.trigger or (not bucket.packed and bucket.arrived() == len(
                    bucket.params) * self.passes):
                self._bucket_pass(bucket, param is bucket.trigger)
            return
        if param in self.submitted or self.delay[param] <= 0:
            raise self._too_many(param)
        self.delay[param] -= 1
        if self.delay[param] > 0:
            return
        if self.watching:
            self.arrival.append(param)
        self._arrivals += 1
        grad = param.grad
        if grad is not None and grad.is_sparse:
            self.sparse.setdefault(param, grad.sparse_dim())
            if self._sends_sparse(param):
                self._submit([param])
                return
        ready = self.holding.ready(param)
        if ready:
            self._submit(ready)

    def trigger_ready(self, param: torch.Tensor) -> None:
        """The hook of a bucket's last member on this rank."""
        if self.member:
            self._bucket_pass(self._trigger_of[param], True)

    def _bucket_pass(self, bucket: FlatBucket, counts_pass: bool) -> None:
        if counts_pass:
            bucket.passes += 1
            if bucket.submitted or bucket.passes > self.passes:
                raise self._too_many(bucket.trigger)
        if not bucket.submitted and bucket.passes >= self.passes and \
                bucket.complete(self.passes):
            self._submit_bucket(bucket)

    def _too_many(self, param: torch.Tensor) -> AssertionError:
        return AssertionError(
            f"the gradient of '{self.names[param]}' was computed more than "
            f"backward_passes_per_step={self.passes} times before step(). Call step() "
            "after each backward, or increase backward_passes_per_step to accumulate "
            "gradients locally.")

    # -- submission --------------------------------------------------------------------
    def _sends_sparse(self, param: torch.Tensor) -> bool:
        """Sparse gradients travel as (indices, values) unless asked for dense, or their
        parameter sits in a bucket (buckets are dense)."""
        return not self.sparse_as_dense and self.holding.index(param) is None

    def _begin_submission(self) -> None:
        if self._step_start is None:
            self._step_start = self._counters()
        self._submissions += 1

    def _submit_bucket(self, bucket: FlatBucket) -> None:
        """One collective for the whole bucket."""
        self._begin_submission()
        bucket.submitted = True
        self._arrivals += len(bucket.params)
        self._submitted_after.append(self._arrivals)
        wait = (self.collective or self).send(bucket)
        bucket.sent_version = bucket.flat._version
        self.pending.append(_Pending(wait, bucket.params, [], bucket=bucket, untouched=(
            not bucket.packed and self.comm_hook is None)))

    def send(self, bucket: FlatBucket) -> Any:
        """The bucket's flat tensor allreduced in place (cast first with compression),
        or what the registered comm hook sends."""
        prescale, postscale = self.scale
        if self.comm_hook is not None:
            state, hook = self.comm_hook
            return hook(state, GradBucket(len(self.pending), bucket.params, bucket.names,
                                          bucket.views, self.op, prescale, postscale,
                                          self.process_set, self.steps, buffer=bucket.flat))
        compressed, ctx = self.compression.compress(bucket.flat)
        handle = mpi_ops.allreduce_async_(
            compressed, name=bucket.name, op=self.op, prescale_factor=prescale,
            postscale_factor=postscale, process_set=self.process_set)
        if ctx is None:
            return handle
        return lambda: self.compression.decompress(mpi_ops.synchronize(handle), ctx)

    def finish(self, bucket: FlatBucket, result: Any) -> None:
        """The result into the bucket, unless it was reduced there."""
        if isinstance(result, torch.Tensor):
            if result is not bucket.flat:
                if result.numel() != bucket.flat.numel():
                    raise ValueError(f"a communication hook returned {result.numel()} "
                                     f"values for a bucket of {bucket.flat.numel()}")
                bucket.flat.copy_(result.reshape(-1))
            return
        with torch.no_grad():  # a comm hook's result per gradient
            for view, output in zip(bucket.views, result):
                if output is not view:
                    view.copy_(output)

    def _submit(self, params: Sequence[torch.Tensor]) -> None:
        """The per-tensor path: params' gradients as one grouped allreduce (or sparse)."""
        if self._step_start is None:
            self._step_start = self._counters()
        self._submitted_after.append(self._arrivals)
        self.submitted.update(params)
        dense, tensors, ctxs, names = [], [], [], []
        for param in params:
            name = self.names[param]  # the op prefix is names_for's, as Horovod's
            sparse = param in self.sparse and self._sends_sparse(param)
            if param.grad is None:  # no gradient on this rank: contribute zeros
                param.grad = sparse_zeros(param, self.sparse[param]) if sparse \
                    else torch.zeros_like(param)
            grad = param.grad
            if sparse and grad.is_sparse:
                handle = sparse_allreduce_async(grad, name, self.op, self.process_set)
                self.pending.append(_Pending(handle, [param], [None], sparse=True))
                self._submissions += 1
                continue
            compressed, ctx = self.compression.compress(
                grad.to_dense() if grad.is_sparse else grad)
            dense.append(param)
            tensors.append(compressed)
            ctxs.append(ctx)
            names.append(name)
        if not tensors:
            return
        self._submissions += 1
        prescale, postscale = self.scale
        if self.comm_hook is not None:
            state, hook = self.comm_hook
            bucket = GradBucket(len(self.pending), dense, [self.names[p] for p in dense],
                                tensors, self.op, prescale, postscale, self.process_set,
                                self.steps)
            self.pending.append(_Pending(hook(state, bucket), dense, ctxs))
            return
        # In place, into the tensors autograd made: against results in a runtime block
        # installed as the gradients, an MLP step of 1 to 4 MB weights on 2 ranks took
        # 0.93-0.94 of the time (alternating rounds of one job); on one rank nothing is
        # copied at all.
        handle = mpi_ops.grouped_allreduce_async_(
            tensors, name=names, op=self.op, prescale_factor=prescale,
            postscale_factor=postscale, process_set=self.process_set)
        self.pending.append(_Pending(handle, dense, ctxs))

    # -- the end of a step -------------------------------------------------------------
    def synchronize(self) -> None:
        """Finish every reduction of this step (submitting what no hook sent)."""
        if not self.member:
            return
        leftovers = [p for p in self.loose if p not in self.submitted]
        try:
            # Before the zeros for gradients this rank lacks: whether to send them
            # sparse depends on what the other ranks had.
            order = self._agree(leftovers) if not self.agreed else None
            if leftovers:
                self._submit(leftovers)
            for bucket in self.flat:
                if not bucket.submitted:  # complete now, but not at its hook: late
                    self._late += bucket.complete(self.passes)
                    self._at_synchronize += 1
                    bucket.adopt()
                    self._submit_bucket(bucket)
            self._install_results()
        except Exception:
            # A failed reduction (a lost or mismatched peer) ends the step: whatever
            # else is in flight is waited out, and the next backward starts afresh (an
            # elastic retry would otherwise find reductions pending for good).
            self.abandon_step()
            raise
        self._next_step()
        self.holding.end_step()
        if order is not None:  # settled, in a step that went through on this rank
            self.agreed = True
        if self.holding.learning:
            if order is None:  # not every rank took part: learn on a later step
                self.holding.forget_order()
            else:
                self.holding.learn(order)
        if self.agreed and not self.flattened and self.as_view and self.holding.buckets:
            self._flatten()
        elif self.flat and self.watching:
            self._watch(False)
        elif self._late:  # a bucket complete only after its trigger: a new order
            self._watch(True)
        elif self.watching:
            self.arrival.clear()
        self._record_stats()
        self.steps += 1

    def _install_results(self) -> None:
        while self.pending:
            pending = self.pending[0]
            if pending.untouched:
                _check_untouched(pending.bucket)  # (a failure leaves it to abandon)
            self.pending.pop(0)  # popped first: a failure leaves the rest to abandon
            outputs = pending.result()
            if pending.bucket is not None:
                (self.collective or self).finish(pending.bucket, outputs)
                continue
            params = pending.params
            if isinstance(outputs, torch.Tensor) and not pending.sparse:
                outputs = _split(outputs, params)  # a hook's flat result
            if pending.sparse:
                params[0].grad = outputs
                continue
            for param, output, ctx in zip(params, outputs, pending.ctxs):
                reduced = self.compression.decompress(output, ctx)
                grad = param.grad
                if reduced is grad:  # reduced in place
                    continue
                # A sparse gradient reduced as dense (sparse_as_dense, or in a group) goes
                # back sparse, as Horovod's does: the optimizer was chosen for sparse
                # gradients (SparseAdam refuses dense ones). A fresh decompressed tensor
                # is installed rather than copied over the old gradient, unless the
                # caller asked to keep gradient tensors or the parameter has another
                # memory layout.
                sparse_dim = self.sparse.get(param)
                if sparse_dim is not None:
                    param.grad = reduced.to_sparse(sparse_dim)
                elif grad.is_sparse or (self.as_view and param.is_contiguous()
                                        and reduced.dtype == grad.dtype):
                    param.grad = reduced
                else:
                    grad.copy_(reduced)

    def _next_step(self) -> None:
        """Nothing pending or submitted, every pass count full again."""
        self.pending.clear()
        self.submitted.clear()
        for param in self.loose:
            self.delay[param] = self.passes
        for bucket in self.flat:
            bucket.reset_step()

    def abandon_step(self) -> None:
        """Forget this step's reductions (each waited out, its error dropped) and the
        gradients accumulated towards it."""
        for pending in self.pending:
            try:
                pending.result()
            except Exception:
                pass
        self._next_step()
        self.holding.abandon_step()
        if self.watching:
            self.arrival.clear()
        self._step_start = None
        self._submissions = self._arrivals = self._late = self._at_synchronize = 0
        self._submitted_after = []

    def zero_grad(self, set_to_none: bool) -> None:
        """Gradients that are views of a bucket are zeroed in place, views kept (one fill
        per bucket); the others as torch does."""
        zero(self.flat)
        packed = [p for b in self.flat if b.packed for p in b.params]
        for param in [*self.loose, *packed] if self.flat else ():
            if param.grad is not None:
                if set_to_none:
                    param.grad = None
                else:
                    param.grad.detach_()
                    param.grad.zero_()

    def pending_work(self) -> bool:
        return bool(self.submitted or self.pending or any(
            b.passes or b.submitted for b in self.flat) or any(
            self.delay[p] != self.passes for p in self.loose))

    def restart_agreement(self) -> None:
        """Agree (and learn buckets) afresh from the next step, as a worker that joins an
        elastic job does: called on every rank by broadcast_optimizer_state."""
        self.agreed = False
        self.holding.relearn()
        if self.flattened:
            self._unflatten()

    # -- flat buckets ------------------------------------------------------------------
    def _flatten(self) -> None:
        """From the agreed buckets to flat ones: gradients become views, per-parameter
        hooks give way to one hook per bucket."""
        self.flattened = True
        self._make_flat(plan(self.holding.buckets), False)
        for bucket in self.flat:
            bucket.adopt()
        self.holding.keep_only(set(self.loose))
        self._watch(False)

    def _make_flat(self, layout: Sequence[Sequence[torch.Tensor]], packed: bool) -> None:
        for params in layout:
            bucket = FlatBucket(len(self.flat), params, [self.names[p] for p in params],
                                packed)
            self.flat.append(bucket)
            self._bucket_of.update((p, bucket) for p in params)
        self.loose = [p for p in self.params if p not in self._bucket_of]

    def _unflatten(self) -> None:
        self._watch(True)
        self.flat, self._bucket_of, self._trigger_of = [], {}, {}
        self.flattened = False
        self.loose = list(self.params)

    def _watch(self, on: bool) -> None:
        """Per-parameter hooks on bucketed parameters (on: this rank's order is
        recorded for one step), or one hook per bucket on its trigger (off): the member
        that arrived last in the watched step."""
        if not on:
            position = {p: i for i, p in enumerate(self.arrival)}
            self._trigger_of = {}
            for bucket in self.flat:
                bucket.trigger = max(bucket.params,
                                     key=lambda p: position.get(p, len(position)))
                self._trigger_of[bucket.trigger] = bucket
        self.arrival = []
        self.watching = on
        self._late = 0
        for bucket in self.flat:
            for param in bucket.params:
                hook = self._hooks.pop(param, None)
                if hook is not None:
                    hook.remove()
                if on:
                    self._hooks[param] = register_grad_ready_hook(param, self._grad_hook)
            if not on:
                self._hooks[bucket.trigger] = register_grad_ready_hook(bucket.trigger,
                                                                     self._bucket_hook)

    # -- agreement ---------------------------------------------------------------------
    def _agree(self, unseen: list[torch.Tensor]) -> list[torch.Tensor] | None:
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
        names = self.names
        params = sorted(self.params, key=names.__getitem__)
        count = len(params)
        position = {p: i + 1 for i, p in enumerate(self.holding.recorded(unseen))}
        mine = torch.zeros(1 + 3 * count, dtype=torch.int64)
        mine[0] = 1
        for i, param in enumerate(params):
            mine[1 + i] = position.get(param, count + 1)
            if param in self.sparse:
                mine[1 + count + i] = 1
                mine[1 + 2 * count + i] = self.sparse[param] + 1
        if self.process_set.size() > 1:
            name = f"DistributedOptimizer.agree.{count}.{names[params[0]]}" if params \
                else "DistributedOptimizer.agree.0"
            total = mpi_ops.allreduce(mine, name=name, op=ReduceOp.SUM,
                                      process_set=self.process_set)
        else:
            total = mine
        sums = total[1:1 + count].tolist()
        had_sparse = total[1 + count:1 + 2 * count].tolist()
        dims = total[1 + 2 * count:].tolist()
        self.sparse.update({p: dims[i] // had_sparse[i] - 1
                            for i, p in enumerate(params) if had_sparse[i]})
        if int(total[0]) < self.process_set.size():
            return None
        ranked = sorted(range(count), key=lambda i: (sums[i], names[params[i]]))
        return [params[i] for i in ranked if params[i] not in self.sparse]

    # -- statistics --------------------------------------------------------------------
    def _counters(self) -> tuple[int, int, int]:
        runtime = self.process_set.runtime
        return runtime.cycles, runtime.controller.slow_cycles, runtime.controller.fast_cycles

    def _record_stats(self) -> None:
        if self._step_start is None:
            return
        end = self._counters()
        cycles, slow, fast = (b - a for a, b in zip(self._step_start, end))
        self.stats.append({"cycles": cycles, "slow_cycles": slow, "fast_cycles": fast,
                           "submissions": self._submissions, "gradients": self._arrivals,
                           "submitted_after": self._submitted_after,
                           "buckets_at_synchronize": self._at_synchronize})
        self._step_start = None
        self._submissions = self._arrivals = self._at_synchronize = 0
        self._submitted_after = []


def _check_untouched(bucket: FlatBucket) -> None:
    """The bucket was not written between its submission and synchronize(): what a
    second backward before step() would do while its allreduce runs."""
    if bucket.flat._version != bucket.sent_version:
        raise RuntimeError(
            f"the gradients of '{bucket.names[0]}' and the {len(bucket.params) - 1} other "
            "parameters of its bucket changed while the bucket was being reduced: a "
            "backward pass (or an in-place change of param.grad) ran after the bucket was "
            "complete and before synchronize(). Call step() after each backward, or set "
            "backward_passes_per_step.")


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


def _remove(hooks: dict[Any, Any]) -> None:
    for hook in hooks.values():
        hook.remove()
