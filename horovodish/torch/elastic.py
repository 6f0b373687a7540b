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
from typing import Any

import torch

from ..common.elastic import ObjectState, State, run
from .elastic_sampler import ElasticSampler

__all__ = ["ElasticSampler", "State", "TorchState", "run"]


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


class TorchState(ObjectState):
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
        self.save()

    def save(self) -> None:
        for kept in self._members.values():
            kept.save()
        super().save()

    def restore(self) -> None:
        for kept in self._members.values():
            kept.restore()
        super().restore()

    def sync(self) -> None:
        """Make every rank's state rank 0's (and that the restore point)."""
        for kept in self._members.values():
            kept.sync()
        super().sync()
