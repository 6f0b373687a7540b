"""Horovod's Keras callbacks, for Keras 3 (whose variables have no ``.ref()``) and for
tf_keras (see keras_flavor.py).

Put MetricAverageCallback before callbacks that read the epoch logs (checkpointing,
early stopping): Keras hands every callback the same logs dict, in list order.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import numpy as np

from ...common import api
from ...common.api.objects import check_same_layout
from ..functions import broadcast_variables
from ..keras_flavor import build_optimizer, keras, optimizer_built, optimizer_variables
from ..mpi_ops import Average, allreduce


def model_state(model: keras.Model) -> list[Any]:
    """The model's variables, then its optimizer's (built ones only), in a fixed order;
    none for a model not built yet (Keras 2 raises on its ``variables`` then)."""
    if not model.built:
        return []
    state = list(model.variables)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and optimizer_built(optimizer):
        state += optimizer_variables(optimizer)
    return state


def broadcast_model_state(model: keras.Model, root_rank: int, defer: bool = False,
                          local_variables: Sequence[Any] = ()) -> bool:
    """Broadcast root_rank's model and optimizer variables; every rank must call it.

    A built model's optimizer is built first (Keras builds it only in the first train
    step): a rank that restored a checkpoint has the optimizer's state while
    a fresh rank has none, and broadcasting the variables each rank happened to have left
    the ranks waiting on different collectives for good. The ranks then agree that all
    are built and that the variables line up (shapes and dtypes), and raise a ValueError
    on every rank, naming the first difference, if not. With ``defer``, a rank still
    unbuilt makes every rank return False (fit builds all by the end of its first
    batch); otherwise that raises too. ``local_variables`` stay as each rank has them
    (every rank must name the same ones)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer_built(optimizer) and model.built:
        build_optimizer(optimizer, model.trainable_variables)
    built = model.built and (optimizer is None or optimizer_built(optimizer))
    local = {id(v) for v in local_variables}
    state = [v for v in model_state(model) if id(v) not in local]
    unbuilt = check_same_layout(state, root_rank, "broadcast of the model's variables",
                                "BroadcastGlobalVariables.layout", ready=built)
    if unbuilt and defer:
        return False
    if unbuilt:
        raise ValueError(f"broadcast of the model's variables: the model or its optimizer is "
                         f"not built on rank(s) {unbuilt}; build the model (call it once, or "
                         "give it an Input) on every rank first.")
    broadcast_variables(state, root_rank)
    return True


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Start every rank from root_rank's weights and optimizer state.

    Broadcasts when training begins, so that no rank takes a step from its own random
    initialization (the optimizer is built first, see broadcast_model_state), or, where
    some rank's model is not built yet (no Input), at the end of the first batch.
    ``local_variables`` (e.g. a PartialDistributedOptimizer's local layers' weights) are
    left as each rank has them.
    """

    def __init__(self, root_rank: int, device: str = "",
                 local_variables: Sequence[Any] | None = None) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.local_variables = list(local_variables or ())
        self.broadcast_done = False

    def _broadcast(self) -> None:
        if not self.broadcast_done:
            self.broadcast_done = broadcast_model_state(self.model, self.root_rank, defer=True,
                                                        local_variables=self.local_variables)

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._broadcast()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._broadcast()


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the epoch's scalar logs over ranks (one fused allreduce), so every rank
    logs, checkpoints and stops early on the same numbers."""

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        averaged = allreduce(values, op=Average, name="MetricAverageCallback").numpy()
        logs.update(zip(keys, averaged.tolist()))


def _learning_rate(optimizer: Any) -> float:
    if callable(getattr(optimizer, "_learning_rate", None)):
        raise ValueError("the learning-rate callbacks need a float learning rate, not a "
                         "LearningRateSchedule or callable")
    return float(np.asarray(optimizer.learning_rate))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """lr = initial_lr * multiplier(epoch) for epochs in [start_epoch, end_epoch).

    ``multiplier`` is a function of the epoch, or a number m meaning
    m ** (epoch - start_epoch): the schedule starts at initial_lr, as in Horovod. With
    ``staircase`` the lr changes at the first batch of each epoch; without, every batch,
    with a fractional epoch. ``momentum_correction`` scales momentum by new_lr / old_lr for
    the batch where the lr changes (Goyal et al.); Keras compiles SGD's float momentum
    into the train step, so it only takes effect for a run_eagerly model or a momentum held
    in a variable (otherwise a warning says it was skipped).
    """

    def __init__(self, initial_lr: float, multiplier: float | Callable[[float], float],
                 start_epoch: int = 0, end_epoch: int | None = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None) -> None:
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.multiplier = multiplier if callable(multiplier) else (
            lambda epoch: multiplier ** (epoch - start_epoch))
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0
        self.restore_momentum: float | None = None
        self._warned = False

    def on_train_begin(self, logs: dict | None = None) -> None:
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError(f"Could not detect the number of steps per epoch; pass "
                                 f"steps_per_epoch to {type(self).__name__}().")

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self.current_epoch < self.start_epoch or (
                self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust(self.current_epoch)
        elif not self.staircase:
            self._adjust(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.restore_momentum is not None:
            self._set_momentum(self.restore_momentum)
            self.restore_momentum = None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs["lr"] = _learning_rate(self.model.optimizer)

    def _adjust(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old_lr = _learning_rate(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new_lr
        momentum = getattr(optimizer, "momentum", None)
        if not self.momentum_correction or momentum is None or old_lr == 0 or new_lr == old_lr:
            return
        if isinstance(momentum, (int, float)) and not self.model.run_eagerly:
            if momentum and not self._warned:
                warnings.warn("momentum_correction skipped: Keras compiles the optimizer's "
                              "float momentum into the train step; pass "
                              "momentum_correction=False to silence this.", stacklevel=2)
                self._warned = True
            return
        self.restore_momentum = float(np.asarray(momentum))
        self._set_momentum(self.restore_momentum * new_lr / old_lr)

    def _set_momentum(self, value: float) -> None:
        optimizer = self.model.optimizer
        if hasattr(optimizer.momentum, "assign"):
            optimizer.momentum.assign(value)
        else:
            optimizer.momentum = value


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the lr from initial_lr / size to initial_lr over warmup_epochs, every batch
    (Goyal et al., "Accurate, Large Minibatch SGD"); initial_lr is the size-scaled lr."""

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0) -> None:
        def multiplier(epoch: float) -> float:
            # Shift by one batch so that the last batch of an epoch ends on a round value.
            epoch += 1.0 / self.steps_per_epoch
            size = api.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)
        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and api.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_learning_rate(self.model.optimizer):g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keep the best model seen so far (save_best_only); only rank 0 writes the file."""

    def __init__(self, filepath: str, monitor: str = "val_loss", verbose: int = 0,
                 mode: str = "auto", save_freq: Any = "epoch",
                 save_weights_only: bool = False) -> None:
        super().__init__(filepath, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)

    def _save_model(self, epoch: int, batch: int | None, logs: dict | None) -> None:
        if api.rank() == 0:
            super()._save_model(epoch, batch, logs)
