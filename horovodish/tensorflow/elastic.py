"""Elastic training for TensorFlow 2 and Keras 3: Horovod's ``horovod.tensorflow.elastic``.

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        while state.epoch < epochs:
            while state.batch < steps_per_epoch:     # state.batch: batches done
                train_step(*batch_at(state.epoch, state.batch))
                state.batch += 1
                if state.batch % 10 == 0:
                    state.commit()
            state.epoch, state.batch = state.epoch + 1, 0
            state.commit()

    train(state)

When a collective fails, ``run`` restores the last commit, re-initializes horovodish,
syncs the state from rank 0 and calls the function again (see horovodish.common.elastic).
Inside ``tf.function`` the failure reaches Python as a ``tf.errors.OpError`` whose
message carries ``HorovodInternalError:``; ``run`` recovers from that too.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from ..common import elastic
from ..common.elastic import ObjectState, State
from ..common.errors import HorovodInternalError
from ..common.api.objects import check_same_layout
from .functions import broadcast_variables

__all__ = ["State", "TensorFlowKerasState", "TensorFlowState", "run"]

# ops.py re-raises the core's error inside the numpy_function; TensorFlow keeps only its
# "Type: message" line, inside a longer text.
_GRAPH_FAILURE = re.compile(r"^HorovodInternalError: ", re.MULTILINE)


def _is_failure(exc: BaseException) -> bool:
    if isinstance(exc, HorovodInternalError):
        return True
    return isinstance(exc, tf.errors.OpError) and bool(_GRAPH_FAILURE.search(exc.message or ""))


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Retry func(state, ...) from the last commit after a failed collective, eager or
    inside tf.function (model.fit's train step included)."""
    return elastic.run(func, is_failure=_is_failure)


def _values(variables: Sequence[Any]) -> list[np.ndarray]:
    """Copies, so later assignments to the variables leave the commit alone. Through
    ``numpy()``: TensorFlow's variables implement ``__array__`` without numpy 2's copy
    argument, which numpy warns about on every commit."""
    return [np.array(v.numpy() if hasattr(v, "numpy") else v, copy=True) for v in variables]


def _assign(variables: Sequence[Any], values: Sequence[np.ndarray], what: str) -> None:
    if [tuple(v.shape) for v in variables] != [a.shape for a in values]:
        raise ValueError(f"restore of {what}: the commit holds {len(values)} variables, there "
                         f"are now {len(variables)} (or their shapes differ). Build the model "
                         "(give it an Input or call it once) before creating the state, so "
                         "that every commit holds the same variables.")
    for variable, value in zip(variables, values):
        variable.assign(value)


def _broadcast(variables: Sequence[Any], what: str, root: int = 0) -> None:
    """broadcast_variables from root, once the ranks agree that the variables line up."""
    check_same_layout(variables, root, f"sync of the {what}", f"elastic.sync.{what}")
    broadcast_variables(variables, root_rank=root)


class _VariablesState(ObjectState):
    """Variables kept in place, their values copied on save and assigned back on restore
    (and written with the commit); subclasses say which variables."""

    _what = "the variables"  # for restore's error message

    def __init__(self, **kwargs: Any) -> None:
        self._values: list[np.ndarray] = []
        super().__init__(**kwargs)
        self.save()

    def _variables(self) -> list[Any]:
        raise NotImplementedError

    def save(self) -> None:
        self._values = _values(self._variables())
        super().save()

    def restore(self) -> None:
        _assign(self._variables(), self._values, self._what)
        super().restore()

    def _payload(self) -> Any:
        return {**super()._payload(), "values": self._values}

    def _load_payload(self, payload: Any) -> None:
        super()._load_payload(payload)
        self._values = payload["values"]


class TensorFlowState(_VariablesState):
    """tf.Variables (and keras.Variables), kept in place: their values are copied on
    save, assigned back on restore, broadcast from rank 0 on sync. Other keywords are
    plain picklable attributes, as in TorchState. ``session`` is accepted and ignored
    (TensorFlow 2 runs eagerly)."""

    _what = "TensorFlowState's variables"

    def __init__(self, variables: Sequence[Any] | None = None, session: Any = None,
                 **kwargs: Any) -> None:
        self.variables = list(variables or [])
        super().__init__(**kwargs)

    def _variables(self) -> list[Any]:
        return self.variables

    def _sync_from(self, root: int) -> None:
        """Make every rank's state root's (and that the restore point)."""
        if self.variables:
            _broadcast(self.variables, "variables", root)
        super()._sync_from(root)


def _build_optimizer(model: Any, optimizer: Any) -> None:
    """Keras builds an optimizer in its first step. Build it now: a commit taken before
    that step then holds the optimizer's initial state for a restore to go back to."""
    from .keras_flavor import build_optimizer, optimizer_built
    if optimizer is not None and not optimizer_built(optimizer) and model.built:
        build_optimizer(optimizer, model.trainable_variables)


class TensorFlowKerasState(_VariablesState):
    """A Keras model's variables and its optimizer's (``optimizer`` defaults to the
    model's own; pass it for a custom loop whose optimizer is not compiled into the
    model), plus plain picklable attributes. The model must be built (an Input, or
    called once) by the time the state syncs; the optimizer is built for it.
    ``backend`` is accepted and ignored (one Keras 3 backend here)."""

    _what = "the Keras model and optimizer"

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None,
                 **kwargs: Any) -> None:
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer",
                                                                         None)
        super().__init__(**kwargs)

    def _separate_optimizer(self) -> bool:
        return (self.optimizer is not None
                and self.optimizer is not getattr(self.model, "optimizer", None))

    def _variables(self) -> list[Any]:
        from .keras.callbacks import model_state
        _build_optimizer(self.model, self.optimizer)
        variables = model_state(self.model)
        from .keras_flavor import optimizer_built, optimizer_variables
        if self._separate_optimizer() and optimizer_built(self.optimizer):
            variables += optimizer_variables(self.optimizer)
        return variables

    def _sync_from(self, root: int) -> None:
        """Make every rank's state root's (and that the restore point)."""
        from .keras.callbacks import broadcast_model_state
        broadcast_model_state(self.model, root_rank=root)  # checks the ranks line up first
        if self._separate_optimizer():
            _build_optimizer(self.model, self.optimizer)
            from .keras_flavor import optimizer_variables
            _broadcast(optimizer_variables(self.optimizer), "optimizer", root)
        super()._sync_from(root)
