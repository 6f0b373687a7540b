"""Elastic ``model.fit``: Horovod's ``horovod.tensorflow.keras.elastic``.

    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=10)]  # last

    @hvd.elastic.run
    def train(state):
        model.fit(dataset_from(state.epoch, state.batch), steps_per_epoch=steps,
                  epochs=epochs - state.epoch, callbacks=callbacks)

    train(state)

CommitStateCallback goes after the other two, so that a commit holds the epoch and
batch that it follows. The callbacks count batches, never samples: which samples a
resumed epoch sees is the input's business (a repeated, shuffled dataset, or one that
starts where the commit left off, as above).
"""
from __future__ import annotations

from ...common.elastic import State
from ..elastic import TensorFlowKerasState, run
from ..keras_flavor import keras

__all__ = ["CommitStateCallback", "KerasState", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run"]

KerasState = TensorFlowKerasState


class CommitStateCallback(keras.callbacks.Callback):
    """Commit ``state`` after every ``batches_per_commit`` batches since the last commit,
    and at the end of every epoch. The count starts afresh when fit begins (a retry
    included) and after each epoch's commit, so every rank commits at the same batches.

    An epoch's last batch is committed by the epoch's commit alone: a failure in between
    (validation, MetricAverageCallback) then goes back to a commit that the rest of the
    epoch can follow, rather than to a finished epoch that is not yet counted."""

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        if batches_per_commit < 1:
            raise ValueError(f"batches_per_commit must be >= 1, got {batches_per_commit}")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.batches_remaining -= 1
        steps = (self.params or {}).get("steps")
        if self.model.stop_training or (steps and batch + 1 >= steps):
            return  # the epoch ends here: on_epoch_end commits
        if self.batches_remaining <= 0:
            self._commit()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._commit()

    def _commit(self) -> None:
        self.state.commit()
        self.batches_remaining = self.batches_per_commit


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep ``state.batch`` = the number of batches finished in the current epoch (0 again
    at its end), and make the first epoch after a restore only as long as what remains of
    it (fit's steps per epoch minus ``state.batch``).

    Keras cannot shorten one epoch, so this callback sets ``model.stop_training`` after
    the epoch's last remaining batch and clears it again in ``on_epoch_end``: list it
    before callbacks that stop training at the end of an epoch (EarlyStopping), so that
    their stop stands."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self._resumed = 0       # batches of fit's first epoch done before this fit began
        self._done_before = 0   # the same, for the epoch running now
        self._stopped = False

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._resumed = int(self.state.batch)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._done_before, self._resumed = self._resumed, 0

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        # batch is the last step of the call (steps_per_execution may run several)
        self.state.batch = self._done_before + batch + 1
        steps = (self.params or {}).get("steps")
        if self._done_before and steps and self.state.batch >= steps:
            self.model.stop_training = self._stopped = True

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.batch = 0
        if self._stopped:
            self.model.stop_training = self._stopped = False


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep ``state.epoch`` = the number of epochs finished, across retries.

    fit numbers its epochs from ``initial_epoch``: both Horovod's pattern
    (``fit(epochs=total - state.epoch)``, numbering from 0) and Keras's
    (``fit(initial_epoch=state.epoch, epochs=total)``) count on from ``state.epoch``."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self._offset: int | None = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._offset = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self._offset is None:
            self._offset = int(self.state.epoch) - epoch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.epoch = self._offset + epoch + 1
