"""Elastic-ready state: commit / restore / sync, and the retrying ``run`` decorator.

A full elastic launcher (adding and removing hosts) can come later; the state API is
Horovod's already, so training scripts written for it run unchanged:

    state = hvd.elastic.TorchState(model, optimizer, epoch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(state)

When a collective fails (``HorovodInternalError``: a lost or mismatched peer), ``run``
restores the last commit, re-initializes horovodish, syncs the state from rank 0 and
calls the function again.
"""
from __future__ import annotations

import copy
import functools
from typing import Any, Callable

import torch

from ..common import basics
from ..common.errors import HorovodInternalError, HostsUpdatedInterrupt
from .elastic_sampler import ElasticSampler

__all__ = ["ElasticSampler", "State", "TorchState", "run"]


class State:
    """Base: reset callbacks and the commit protocol, independent of the framework."""

    def __init__(self, **kwargs: Any) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self._known = dict(kwargs)
        for key, value in kwargs.items():
            setattr(self, key, value)

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save a restore point (call it every few batches)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Hosts never change without an elastic launcher; nothing to do yet."""

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class _Member:
    """A member kept in place (the user's own object): saved and restored through its
    state_dict, synced from rank 0. Restores load a copy of the saved state: torch's
    Optimizer.load_state_dict keeps the tensors it is given, which later steps update."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self._saved: Any = None
        self.save()

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self) -> None:
        from .functions import broadcast_object
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))


class _Model(_Member):
    def sync(self) -> None:
        from .functions import broadcast_parameters
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _Optimizer(_Member):
    def sync(self) -> None:
        from .functions import broadcast_optimizer_state
        broadcast_optimizer_state(self.value, root_rank=0)


class _Sampler(_Member):
    def sync(self) -> None:
        """Every rank processed different samples: all of them count as processed."""
        from .functions import allgather_object, broadcast_object
        state = self.value.state_dict()
        for theirs in allgather_object(state["processed_indices"]):
            state["processed_indices"] |= theirs
        self.value.load_state_dict(broadcast_object(state, root_rank=0))


def _member(value: Any) -> _Member | None:
    """How a TorchState keyword is kept: in place if it has a state_dict (models,
    optimizers, LR schedulers, samplers, GradScaler, ...); None for a plain value."""
    if isinstance(value, torch.nn.Module):
        return _Model(value)
    if isinstance(value, torch.optim.Optimizer):
        return _Optimizer(value)
    if isinstance(value, ElasticSampler):
        return _Sampler(value)
    if callable(getattr(value, "state_dict", None)) and \
            callable(getattr(value, "load_state_dict", None)):
        return _Member(value)
    return None


class TorchState(State):
    """Models, optimizers, LR schedulers, an ElasticSampler (any object with
    ``state_dict``/``load_state_dict``, kept in place: ``state.scheduler`` stays the
    user's scheduler), and picklable attributes (epoch, batch, ...) replaced on restore
    and sync."""

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        members = {"model": model, "optimizer": optimizer, **kwargs}
        self._members: dict[str, _Member] = {}
        plain: dict[str, Any] = {}
        for key, value in members.items():
            kept = _member(value) if value is not None else None
            if kept is not None:
                self._members[key] = kept
            elif key in kwargs:
                plain[key] = value
        self.model = model
        self.optimizer = optimizer
        for key, kept in self._members.items():
            setattr(self, key, kept.value)
        super().__init__(**plain)
        self._saved: dict[str, Any] = {}
        self.save()

    def _attributes(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self._known}

    def save(self) -> None:
        for kept in self._members.values():
            kept.save()
        self._saved = copy.deepcopy(self._attributes())

    def restore(self) -> None:
        for kept in self._members.values():
            kept.restore()
        for key, value in copy.deepcopy(self._saved).items():
            setattr(self, key, value)

    def sync(self) -> None:
        """Make every rank's state rank 0's."""
        from .functions import broadcast_object
        for kept in self._members.values():
            kept.sync()
        for key, value in broadcast_object(self._attributes(), root_rank=0).items():
            setattr(self, key, value)
        self.save()


def _reset() -> None:
    basics.shutdown()
    basics.init()


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Retry func(state, ...) after HorovodInternalError, from the last commit."""
    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        skip_sync = False
        while True:
            if not skip_sync:
                state.sync()
            try:
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = bool(getattr(interrupt, "skip_sync", False))
            _reset()
            state.on_reset()
    return wrapper
