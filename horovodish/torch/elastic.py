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


class TorchState(State):
    """Model, optimizer and any picklable attributes (epoch, batch, ...)."""

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        self.model = model
        self.optimizer = optimizer
        super().__init__(**kwargs)
        self._saved: dict[str, Any] = {}
        self.save()

    def _attributes(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self._known}

    def save(self) -> None:
        self._saved = {
            "model": copy.deepcopy(self.model.state_dict()) if self.model is not None else None,
            "optimizer": copy.deepcopy(self.optimizer.state_dict())
            if self.optimizer is not None else None,
            "attributes": copy.deepcopy(self._attributes()),
        }

    def restore(self) -> None:
        if self.model is not None:
            self.model.load_state_dict(self._saved["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(self._saved["optimizer"])
        for key, value in copy.deepcopy(self._saved["attributes"]).items():
            setattr(self, key, value)

    def sync(self) -> None:
        """Make every rank's state rank 0's."""
        from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
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
