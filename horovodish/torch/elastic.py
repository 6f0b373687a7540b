"""Elastic-ready state: commit / restore / sync, and the retrying ``run`` decorator.

Horovod's API, so training scripts written for it run unchanged:

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(state)

When a collective fails (``HorovodInternalError``: a mismatched peer, a stall), ``run``
restores the last commit, re-initializes horovodish, syncs the state from rank 0 and
calls the function again. Under ``horovodishrun --min-np ...`` each commit is also
written to disk on every host, and a job restarted after a lost rank or host (or for new
hosts) resumes from the newest one (horovodish.common.elastic, docs/elastic.md).
"""
from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from ..common import api
from ..common.api import collectives
from ..common.messages import ReduceOp
from ..common.elastic import ObjectState, State, run
from .elastic_sampler import ElasticSampler

__all__ = ["ElasticSampler", "State", "TorchState", "run"]


class _Array:
    """A tensor on its way to or from disk: numpy, so pickle writes its bytes out of
    band (elastic_store); dtypes numpy lacks (bfloat16) travel as raw bits."""

    def __init__(self, tensor: torch.Tensor) -> None:
        tensor = tensor.detach().cpu()
        self.dtype = str(tensor.dtype)
        self.device = str(tensor.device)
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.view(torch.int16)
        self.array = tensor.numpy()

    def tensor(self) -> torch.Tensor:
        tensor = torch.from_numpy(np.asarray(self.array))
        if self.dtype == "torch.bfloat16":
            tensor = tensor.view(torch.bfloat16)
        return tensor


def _to_disk(value: Any) -> Any:
    """Tensors anywhere in dicts, lists and tuples become _Array."""
    if isinstance(value, torch.Tensor):
        return _Array(value)
    if isinstance(value, dict):
        return type(value)((key, _to_disk(item)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_to_disk(item) for item in value)
    return value


def _from_disk(value: Any) -> Any:
    if isinstance(value, _Array):
        return value.tensor()
    if isinstance(value, dict):
        return type(value)((key, _from_disk(item)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_from_disk(item) for item in value)
    return value


def _refresh(saved: Any, current: Any) -> Any:
    """A copy of current, reusing saved's tensors where the layout is the same (copied
    into, not allocated: a commit of a large model is then one memcpy, with no page
    faults of fresh memory)."""
    if isinstance(current, torch.Tensor):
        if isinstance(saved, torch.Tensor) and saved.shape == current.shape and \
                saved.dtype == current.dtype and saved.device == current.device:
            with torch.no_grad():
                return saved.copy_(current)
        return current.detach().clone()
    if isinstance(current, dict):
        old = saved if isinstance(saved, dict) else {}
        return type(current)((key, _refresh(old.get(key), value))
                             for key, value in current.items())
    if isinstance(current, (list, tuple)) and type(current) in (list, tuple):
        old = saved if isinstance(saved, (list, tuple)) and len(saved) == len(current) \
            else [None] * len(current)
        return type(current)(_refresh(o, value) for o, value in zip(old, current))
    if type(current) in (set, frozenset) and {type(item) for item in current} <= _ATOMS:
        # An ElasticSampler's processed indices: tens of thousands of ints, which
        # deepcopy copied one by one (9 ms for 30,000, most of a commit's save).
        return type(current)(current)
    return copy.deepcopy(current)


_ATOMS = {int, float, str, bytes, bool, type(None)}  # immutable: shared, not copied


class _Member:
    """A member kept in place (the user's own object): saved and restored through its
    state_dict, synced from the root. Restores load a copy of the saved state: torch's
    Optimizer.load_state_dict keeps the tensors it is given, which later steps update."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self._saved: Any = None
        self.save()

    def save(self) -> None:
        self._saved = _refresh(self._saved, self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self, root: int) -> None:
        from .functions import broadcast_object
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=root))


class _Model(_Member):
    def restore(self) -> None:  # load_state_dict copies into the model's own tensors
        self.value.load_state_dict(self._saved)

    def sync(self, root: int) -> None:
        from .functions import broadcast_parameters
        broadcast_parameters(self.value.state_dict(), root_rank=root)


class _Optimizer(_Member):
    def sync(self, root: int) -> None:
        from .functions import broadcast_optimizer_state
        broadcast_optimizer_state(self.value, root_rank=root)


class _Sampler(_Member):
    """Every rank processed different samples, and a commit on disk is written by one
    rank per host: so a save takes the union of every rank's processed indices, and
    every rank holds all of them. What travels is a bitmap of the indices recorded since
    the last save (one byte per sample, a MAX allreduce): its size never changes, so
    every commit after the first takes the negotiation's fast path."""

    def save(self) -> None:
        sampler = self.value
        recorded = sampler.take_recorded()
        if api.is_initialized() and api.size() > 1:
            bitmap = np.zeros(len(sampler.dataset), dtype=np.uint8)
            bitmap[recorded] = 1
            collectives.allreduce_async(bitmap, bitmap, "elastic.sampler.processed",
                                        ReduceOp.MAX).wait()
            sampler.processed_indices.update(np.flatnonzero(bitmap).tolist())
        if type(sampler).state_dict is ElasticSampler.state_dict:
            # Its state_dict is a fresh dict and set already: refreshing would copy the
            # set of processed indices (tens of thousands) a second time.
            self._saved = sampler.state_dict()
        else:
            super().save()

    def sync(self, root: int) -> None:
        from .functions import allgather_object, broadcast_object
        state = self.value.state_dict()
        for theirs in allgather_object(state["processed_indices"]):
            state["processed_indices"] |= theirs
        self.value.load_state_dict(broadcast_object(state, root_rank=root))


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

    def _sync_from(self, root: int) -> None:
        """Make every rank's state root's (and that the restore point)."""
        for kept in self._members.values():
            kept.sync(root)
        super()._sync_from(root)

    def _payload(self) -> Any:
        return {**super()._payload(),
                "members": {key: _to_disk(kept._saved) for key, kept in self._members.items()}}

    def _load_payload(self, payload: Any) -> None:
        super()._load_payload(payload)
        for key, saved in payload["members"].items():
            if key not in self._members:
                raise ValueError(f"the commit on disk holds {key!r}, which this TorchState "
                                 f"does not have (it has {sorted(self._members)})")
            self._members[key]._saved = _from_disk(saved)
