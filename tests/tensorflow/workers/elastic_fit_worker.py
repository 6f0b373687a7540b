"""model.fit under the elastic launcher: KerasState and Horovod's three callbacks,
softmax regression on the digits (float64, SGD with momentum).

    elastic_fit_worker.py LOG_DIR VICTIM

In the first generation rank VICTIM SIGKILLs itself after batch 12 of epoch 0 (commits
every 5 batches, so batches 11 and 12 are rolled back). The input is the global batch
schedule (a fixed order per epoch, batches of GLOBAL samples), each rank taking its
share of each global batch, so the schedule does not depend on the number of ranks: the
test replays it in numpy. Logs to LOG_DIR/g<generation>-r0.jsonl (rank 0): ``resume``
(where fit starts), ``step`` and ``commit`` (epoch, batch); the last generation's rank
0 writes final.npz, the first's initial.npz.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

import numpy as np

from worker_support import run_checks, same_on_every_rank  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402

import horovodish.tensorflow.keras as hvd  # noqa: E402
from horovodish.common.runtime import launcher_link  # noqa: E402

GLOBAL, EPOCHS, COMMIT_EVERY, LR, MOMENTUM = 48, 2, 5, 0.1, 0.9


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits from its data file (no scikit-learn import)."""
    package = importlib.util.find_spec("sklearn").submodule_search_locations[0]
    table = np.loadtxt(Path(package) / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    return table[:, :-1] / 16.0, table[:, -1].astype(np.int64)


def global_batch(epoch: int, batch: int, samples: int) -> np.ndarray:
    order = np.random.default_rng(1000 + epoch).permutation(samples)
    return order[batch * GLOBAL:(batch + 1) * GLOBAL]


def steps_per_epoch(samples: int) -> int:
    return samples // GLOBAL


class Logger(keras.callbacks.Callback):
    """Logs each finished batch and each commit (listed after CommitStateCallback), and
    kills the victim in the first generation."""

    def __init__(self, state, log, victim: int) -> None:
        super().__init__()
        self.state, self.log, self.victim = state, log, victim
        self.seq = state._commit_seq
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self.epoch = self.state.epoch

    def on_train_batch_end(self, batch, logs=None) -> None:
        # UpdateBatchStateCallback has counted it; an epoch's last batch resets it to 0
        # only in on_epoch_end.
        self.log(kind="step", epoch=self.epoch, batch=self.state.batch)
        self._commits()
        if launcher_link.generation() == 1 and hvd.rank() == self.victim and \
                (self.state.epoch, self.state.batch) == (0, 12):
            os.kill(os.getpid(), signal.SIGKILL)

    def on_epoch_end(self, epoch, logs=None) -> None:
        self._commits()

    def _commits(self) -> None:
        if self.state._commit_seq != self.seq:
            self.seq = self.state._commit_seq
            self.log(kind="commit", epoch=self.state.epoch, batch=self.state.batch,
                     seq=self.seq)


def main() -> None:
    log_dir, victim = Path(sys.argv[1]), int(sys.argv[2])
    keras.config.set_floatx("float64")
    hvd.init()
    rank, size, generation = hvd.rank(), hvd.size(), launcher_link.generation()
    log_file = open(log_dir / f"g{generation}-r{rank}.jsonl", "a", buffering=1)

    def log(**record) -> None:
        if rank == 0:
            log_file.write(json.dumps({"generation": generation, **record}) + "\n")

    x, y = digits()
    steps = steps_per_epoch(len(x))
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=MOMENTUM)),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    if generation == 1 and rank == 0:
        np.savez(log_dir / "initial.npz", *model.get_weights())
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=COMMIT_EVERY),
                 Logger(state, log, victim)]

    def my_batches(epoch: int, batch: int):
        """This rank's share of each global batch, from (epoch, batch) on."""
        while epoch < EPOCHS:
            for b in range(batch, steps):
                share = np.array_split(global_batch(epoch, b, len(x)), size)[rank]
                yield x[share], y[share]
            epoch, batch = epoch + 1, 0

    @hvd.elastic.run
    def train(state) -> None:
        log(kind="resume", epoch=state.epoch, batch=state.batch, seq=state._commit_seq,
            size=size)
        model.fit(my_batches(state.epoch, state.batch), steps_per_epoch=steps,
                  epochs=EPOCHS - state.epoch, callbacks=callbacks, verbose=0)

    train(state)
    if rank == 0:
        np.savez(log_dir / "final.npz", *model.get_weights())

    def same_model_everywhere(rank: int, size: int) -> None:
        for i, weight in enumerate(model.get_weights()):
            same_on_every_rank(weight, f"weight {i}")

    run_checks([same_model_everywhere], rank, size)


if __name__ == "__main__":
    main()
