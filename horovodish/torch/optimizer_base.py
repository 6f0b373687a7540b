"""What every torch DistributedOptimizer shares, written once.

``hvd.DistributedOptimizer`` returns one of three optimizers (gradients averaged and
replicated, optimizer state sharded, or Adasum's delta rule). To the user they are the
same object: an instance of a class that subclasses the wrapped optimizer's class and
shares its state, param groups and defaults, with ``synchronize()``,
``skip_synchronize()``, ``set_backward_passes_per_step()``, ``step()`` and
``zero_grad()``. The class (``WrappedOptimizer`` mixed in before the wrapped class) holds
the behaviour; what differs lives in one ``OptimizerSync`` kept as the optimizer's
``_horovodish``, the only attribute of the runtime's on it besides Horovod's
``backward_passes_per_step`` and ``_parameter_names`` (as DDP keeps one ``Reducer`` on its
wrapper).
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterator

import torch

from .functions import load_state_in_place
from .tracked import UntrackedGradients

LocalStep = Callable[[Callable[[], Any] | None], Any]


class OptimizerSync:
    """One wrapped optimizer's reduction: the state the three optimizers share (whether
    step() reduces, whether synchronize() ran, the untracked-gradient check, the buffer
    sync), and the hooks each one fills in."""

    def __init__(self, optimizer: torch.optim.Optimizer, tracked: list[torch.Tensor],
                 names: dict[torch.Tensor, str],
                 buffer_sync: Callable[[], None] | None = None) -> None:
        self.untracked = UntrackedGradients(optimizer, set(tracked), names)
        self.buffer_sync = buffer_sync
        self.should_sync = True  # False inside skip_synchronize()
        self.synchronized = False  # synchronize() ran since the last step()

    # -- what each optimizer fills in ----------------------------------------------------
    @property
    def passes(self) -> int:
        return 1

    def set_passes(self, passes: int) -> None:
        if passes != 1:
            raise ValueError(f"set_backward_passes_per_step({passes}): this optimizer "
                             "reduces once per step")

    def synchronize(self) -> None:
        """Finish this step's reductions."""
        self.synchronized = True

    def step(self, closure: Callable[[], Any] | None, local_step: LocalStep) -> Any:
        """Reduce (unless skipped) and update; ``local_step`` is the wrapped class's."""
        self.reduce_unless_skipped()
        result = local_step(closure)
        self.after_step()
        return result

    def pending_work(self) -> bool:
        return False

    def zero_grad(self, set_to_none: bool, plain: Callable[[bool], None]) -> None:
        plain(set_to_none)

    def abandon_step(self) -> None:
        self.synchronized = False

    def register_comm_hook(self, state: Any, hook: Callable[..., Any]) -> None:
        raise ValueError("register_comm_hook does not apply to this optimizer")

    def negotiation_stats(self) -> list[dict[str, int]]:
        return []

    def broadcast_state(self, root_rank: int) -> bool:
        """broadcast_optimizer_state's work, where this optimizer does it itself (True)."""
        return False

    def restart_agreement(self) -> None:
        """Called on every rank by broadcast_optimizer_state."""

    # -- shared steps ----------------------------------------------------------------------
    def reduce_unless_skipped(self) -> None:
        if self.should_sync:
            if self.synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "after optimizer.synchronize(); the gradients are reduced "
                              "again. Wrap step() in `with optimizer.skip_synchronize():`.")
            self.synchronize()
        self.synchronized = False

    def after_step(self) -> None:
        if self.buffer_sync is not None:
            self.buffer_sync()

    def check_nothing_pending(self) -> None:
        if self.pending_work():
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(): gradient reductions are "
                "pending (or accumulating for backward_passes_per_step), and zeroing now "
                "would race with them. Call step() (or synchronize()) first.")


class WrappedOptimizer:
    """Mixed in before the wrapped optimizer's class; delegates to ``_horovodish``."""

    _horovodish: OptimizerSync

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Reduce on every passes-th backward; gradients accumulate locally in between."""
        self._horovodish.set_passes(passes)
        self.backward_passes_per_step = self._horovodish.passes

    def synchronize(self) -> None:
        """Finish every gradient reduction of this step (submitting what no hook sent)."""
        self._horovodish.synchronize()

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """For ``synchronize(); clip gradients; with skip_synchronize(): step()``."""
        self._horovodish.should_sync = False
        try:
            yield
        finally:
            self._horovodish.should_sync = True

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        return self._horovodish.step(closure, super().step)  # type: ignore[misc]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch's, except for gradients in flat buckets (from the second step on):
        those are zeroed in place and stay views of their bucket, whatever
        ``set_to_none`` says (see docs/pytorch.md, "Flat gradient buckets")."""
        self._horovodish.check_nothing_pending()
        self._horovodish.zero_grad(set_to_none, super().zero_grad)  # type: ignore[misc]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as torch does, but in place (see functions.load_state_in_place), and
        abandon a step in progress, as Horovod does: an elastic restore follows a
        failed step."""
        self._horovodish.abandon_step()
        load_state_in_place(self, state_dict, super().load_state_dict)  # type: ignore[misc]

    def register_comm_hook(self, state: Any, hook: Callable[..., Any]) -> None:
        """Send each bucket through ``hook(state, bucket)`` instead of an exact allreduce
        (DDP's ``register_comm_hook``; see horovodish/torch/comm_hooks.py): built-ins
        ``hvd.fp16_compress_hook``, ``hvd.bf16_compress_hook``, and ``hvd.powersgd_hook``
        with a ``hvd.PowerSGDState``. Every rank registers the same hook, once, before
        the first backward. Sparse gradients (unless ``sparse_as_dense``) bypass it."""
        self._horovodish.register_comm_hook(state, hook)

    def negotiation_stats(self) -> list[dict[str, int]]:
        """Per synchronized step (oldest first, the last 1000): runtime ``cycles``,
        ``slow_cycles`` and ``fast_cycles`` from this step's first submission to the end
        of synchronize(); ``submissions`` (calls into the core); ``gradients`` (gradients
        found final by hooks, or sent in a flat bucket); ``submitted_after``: for each
        submission, how many gradients were final when it went out (with learned
        buckets that follow execution it rises in step with arrivals, e.g. [4, 8, 12]
        for three buckets of four); and ``buckets_at_synchronize``: flat buckets that no
        hook found complete, sent by synchronize() (a changed graph)."""
        return self._horovodish.negotiation_stats()


# Our step() already runs inside the wrapped class's hooked step (via super()), so torch
# must not wrap it again when it re-patches classes in load_state_dict/__setstate__.
WrappedOptimizer.step.hooked = True  # type: ignore[attr-defined]

_classes: dict[tuple[type, type], type] = {}


def wrap(optimizer: torch.optim.Optimizer, mixin: type[WrappedOptimizer],
         names: dict[torch.Tensor, str],
         make_sync: Callable[[Any], OptimizerSync]) -> Any:
    """A new object of class (mixin, type(optimizer)) sharing ``optimizer``'s state,
    param groups, defaults and hooks, with ``make_sync(wrapped)`` as its ``_horovodish``."""
    if isinstance(optimizer, WrappedOptimizer):
        raise ValueError("this optimizer is already a DistributedOptimizer; wrap the plain "
                         "torch optimizer once")
    base = type(optimizer)
    if (mixin, base) not in _classes:
        _classes[mixin, base] = type(base.__name__, (mixin, base), {"__module__": mixin.__module__})
    cls = _classes[mixin, base]
    wrapped = cls.__new__(cls)
    # "step" is dropped: an LR scheduler may have put a bound step of the original there.
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k != "step"})
    wrapped._parameter_names = names
    wrapped._horovodish = make_sync(wrapped)
    wrapped.backward_passes_per_step = wrapped._horovodish.passes
    return wrapped


def trained(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters an optimizer trains (those that require grad), in group order."""
    return [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
