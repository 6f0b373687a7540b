"""hvd.elastic for TensorFlow and Keras on real ranks, against one-process references.

Every rank also computes the reference itself (numpy, or plain Keras without
horovodish), so each check compares the elastic result with an independent computation.
A failure is a deliberate mismatch (rank-dependent shapes under one name), which raises
on every rank, as a lost peer would. Each part is a named check (tests/worker_support.py),
in CHECKS; keras_worker.py runs them after its own, in the same job (TensorFlow's import
costs seconds per rank), last because a retry re-initializes horovodish; keras2_worker.py
runs them under tf_keras (the Keras of the process: horovodish.tensorflow.keras_flavor).
"""
from __future__ import annotations

import warnings

import numpy as np
from worker_support import check, close, same_on_every_rank  # noqa: E402

import tensorflow as tf  # noqa: E402

import horovodish.tensorflow as hvd_tf  # noqa: E402
import horovodish.tensorflow.keras as hvd  # noqa: E402
from horovodish.tensorflow.keras_flavor import keras, optimizer_variables  # noqa: E402

LR, MU = 0.1, 0.9


def same_arrays_on_every_rank(arrays: list, what: str) -> None:
    """Every array the same on every rank: how many and their shapes, then the values."""
    arrays = [np.asarray(a) for a in arrays]
    same_on_every_rank(np.array(repr([a.shape for a in arrays])), f"{what}: shapes")
    same_on_every_rank(np.concatenate([a.astype(np.float64).ravel() for a in arrays]), what)


# -- (a) TensorFlowState + run, failing inside tf.function --------------------------------------
def tensorflow_state(rank: int, size: int) -> None:
    """Linear regression with heavy-ball momentum in tf.Variables, one tf.function step
    with DistributedGradientTape. The first attempt fails inside the graph after step 5's
    update was applied (commits after every second step): the retry must start at step 4
    with step 4's variables and kwargs, and the run must end where numpy does."""
    steps, fail_at, features, per_rank = 7, 5, 3, 4
    gen = np.random.default_rng(11)
    x = gen.normal(size=(steps, size * per_rank, features))
    y = gen.normal(size=(steps, size * per_rank))
    mine = slice(rank * per_rank, (rank + 1) * per_rank)

    # Ranks start different: run's first sync must give every rank rank 0's start.
    w = tf.Variable(np.full(features, 0.5 * (rank + 1)))
    b = tf.Variable(float(rank), dtype=tf.float64)
    vw, vb = tf.Variable(np.zeros(features)), tf.Variable(0.0, dtype=tf.float64)
    state = hvd_tf.elastic.TensorFlowState([w, b, vw, vb], step=0, losses=[])

    # Local round trip: restore returns variables and kwargs (a list, mutated) to the commit.
    w.assign_add(np.ones(features))
    state.step = 2
    state.losses.append(1.0)
    with warnings.catch_warnings():  # numpy 2 warned about TensorFlow's __array__ here
        warnings.simplefilter("error", DeprecationWarning)
        state.commit()
    committed = (w.numpy().copy(), b.numpy())
    w.assign(np.zeros(features))
    b.assign(-7.0)
    state.step = 9
    state.losses.append(2.0)
    state.restore()
    close(w.numpy(), committed[0], "restore: w", tol=0)
    check(b.numpy() == committed[1], "restore: b")
    check(state.step == 2 and state.losses == [1.0], f"restore: kwargs {state.step} "
          f"{state.losses}")
    state.step, state.losses = 0, []
    w.assign(np.full(features, 0.5 * (rank + 1)))
    b.assign(float(rank))
    state.commit()

    @tf.function
    def train_step(xs: tf.Tensor, ys: tf.Tensor, poison: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.linalg.matvec(xs, w) + b - ys) ** 2)
        gw, gb = hvd_tf.DistributedGradientTape(tape).gradient(loss, [w, b])
        vw.assign(MU * vw + gw)
        vb.assign(MU * vb + gb)
        w.assign_sub(LR * vw)
        b.assign_sub(LR * vb)
        hvd_tf.allreduce(poison, name="elastic.poison")  # after the update: it must be undone
        return loss

    attempts = []

    @hvd_tf.elastic.run
    def train(state: hvd_tf.elastic.TensorFlowState) -> int:
        attempts.append((state.step, len(state.losses)))
        same_arrays_on_every_rank([w.numpy(), b.numpy(), vw.numpy(), vb.numpy()],
                                  "variables after sync")
        while state.step < steps:
            failing = len(attempts) == 1 and state.step == fail_at
            poison = tf.zeros(1 + (rank if failing else 0), tf.float64)
            loss = train_step(tf.constant(x[state.step, mine]), tf.constant(y[state.step, mine]),
                              poison)
            state.step += 1
            state.losses.append(float(loss))
            if state.step % 2 == 0:
                state.commit()
        return state.step

    check(train(state) == steps, "train's result")
    check(attempts == [(0, 0), (4, 4)], f"attempts (step, losses) {attempts}: the retry "
          "must start at the last commit")

    # numpy, one process, rank 0's start, the global batch.
    rw, rb = np.full(features, 0.5), 0.0
    rvw, rvb = np.zeros(features), 0.0
    losses = []  # (rank 0's, this rank's) loss per step
    for s in range(steps):
        err = x[s] @ rw + rb - y[s]
        losses.append((float(np.mean(err[:per_rank] ** 2)), float(np.mean(err[mine] ** 2))))
        gw, gb = 2 * x[s].T @ err / len(err), 2 * err.mean()
        rvw, rvb = MU * rvw + gw, MU * rvb + gb
        rw, rb = rw - LR * rvw, rb - LR * rvb
    for got, want, name in ((w, rw, "w"), (b, rb, "b"), (vw, rvw, "vw"), (vb, rvb, "vb")):
        close(got.numpy(), want, f"TensorFlowState run: {name} against numpy", tol=1e-10)
    # The retry's sync gave every rank rank 0's committed list; later entries are its own.
    want = [ours if s >= 4 else first for s, (first, ours) in enumerate(losses)]
    close(state.losses, want, "TensorFlowState run: losses", tol=1e-10)


# -- (b) model.fit with KerasState and the callbacks ---------------------------------------------
FEATURES, CLASSES, PER_RANK, STEPS, EPOCHS = 4, 3, 4, 6, 3
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(hidden))


class Recorder(keras.callbacks.Callback):
    """Where each attempt starts, how many batches each of its epochs runs, and two
    failures: in the first attempt after the fourth batch of epoch 1 (commits every
    second batch, counted afresh after each epoch's commit), before batch 4 is
    committed; in the second at the end of epoch 1, after its last batch and before the
    epoch's commit (as a failed MetricAverageCallback would)."""

    def __init__(self, state, rank: int) -> None:
        super().__init__()
        self.state, self.rank = state, rank
        self.starts, self.epochs = [], []

    def on_train_begin(self, logs=None) -> None:
        self.starts.append((self.state.epoch, self.state.batch))
        self.epochs.append([])

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self.epochs[-1].append(0)

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.epochs[-1][-1] += 1
        if len(self.starts) == 1 and (self.state.epoch, self.state.batch) == (1, 4):
            self._fail()

    def on_epoch_end(self, epoch, logs=None) -> None:
        if len(self.starts) == 2:
            self._fail()

    def _fail(self) -> None:
        hvd.allreduce(np.ones(2 + self.rank), name="elastic.fit_failure")


def keras_fit(rank: int, size: int) -> None:
    gen = np.random.default_rng(5)
    total = EPOCHS * STEPS
    x = gen.normal(size=(total, size, PER_RANK, FEATURES)).astype(np.float32)
    y = gen.integers(0, CLASSES, size=(total, size, PER_RANK)).astype(np.int32)

    reference = make_model(100)  # rank 0's start
    reference.compile(keras.optimizers.Adam(0.01), LOSS, jit_compile=False)
    reference.fit(x.reshape(-1, FEATURES), y.reshape(-1), batch_size=size * PER_RANK,
                  shuffle=False, epochs=1, verbose=0)

    model = make_model(100 + rank)  # ranks start different
    model.compile(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), LOSS, jit_compile=False)
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    recorder = Recorder(state, rank)
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state), recorder,
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=2)]

    @hvd.elastic.run
    def train(state) -> None:
        # The input starts where the commit left off; the callbacks keep the count.
        start = state.epoch * STEPS + state.batch
        data = tf.data.Dataset.from_tensor_slices((x[:, rank].reshape(-1, FEATURES),
                                                   y[:, rank].reshape(-1)))
        model.fit(data.batch(PER_RANK).skip(start), steps_per_epoch=STEPS,
                  epochs=EPOCHS - state.epoch, callbacks=callbacks, shuffle=False,
                  verbose=0)

    train(state)
    check(recorder.starts == [(0, 0), (1, 2), (1, 4)], f"attempts start at "
          f"{recorder.starts}: the retries must resume at epoch 1, batches 2 and 4")
    check(recorder.epochs == [[STEPS, 4], [STEPS - 2], [STEPS - 4, STEPS]],
          f"batches per epoch {recorder.epochs}: a resumed epoch runs what remained of it")
    check((state.epoch, state.batch) == (EPOCHS, 0), f"final state {state.epoch, state.batch}")
    check(int(model.optimizer.iterations.numpy()) == total,
          f"optimizer steps {int(model.optimizer.iterations.numpy())}, want {total}")
    weights = [np.asarray(v) for v in model.weights]
    same_arrays_on_every_rank(weights, "fit weights")
    for got, want in zip(weights, reference.get_weights()):
        close(got, want, "KerasState fit against plain Keras on the global batches", tol=1e-5)


def epoch_numbering(rank: int, size: int) -> None:
    """Horovod's fit(epochs=total - state.epoch) numbers from 0, Keras's
    fit(initial_epoch=state.epoch) from state.epoch: state.epoch counts on either way."""
    state = hvd_tf.elastic.TensorFlowState(epoch=2)
    callback = hvd.elastic.UpdateEpochStateCallback(state)
    for first in (0, 2):
        state.epoch = 2
        callback.on_train_begin()
        for epoch in (first, first + 1):
            callback.on_epoch_begin(epoch)
            callback.on_epoch_end(epoch)
        check(state.epoch == 4, f"fit from epoch {first}: state.epoch {state.epoch}, want 4")


# -- (c) sync --------------------------------------------------------------------------------------
def sync(rank: int, size: int) -> None:
    """Rank 1 diverges in variables, optimizer slots and kwargs; sync() gives every rank
    rank 0's, and makes them the restore point."""
    w = tf.Variable(np.arange(3.0) + 10 * rank)
    state = hvd_tf.elastic.TensorFlowState([w], epoch=rank, meta={"rank": rank})
    state.sync()
    close(w.numpy(), np.arange(3.0), "sync: variable is rank 0's", tol=0)
    check(state.epoch == 0 and state.meta == {"rank": 0}, f"sync: kwargs {state.epoch} "
          f"{state.meta}")
    w.assign(np.ones(3))
    state.epoch = 5
    state.restore()
    close(w.numpy(), np.arange(3.0), "restore after sync: rank 0's variable", tol=0)
    check(state.epoch == 0, "restore after sync: rank 0's kwargs")

    # A commit taken before the optimizer's first step (Keras builds it there): a
    # restore after that step gives back the model and a fresh optimizer's state.
    model = make_model(300)
    optimizer = keras.optimizers.Adam(0.05)
    fresh = hvd_tf.elastic.TensorFlowKerasState(model, optimizer)
    start = [np.asarray(v) for v in model.weights]
    optimizer.apply_gradients([(tf.ones_like(v), v) for v in model.trainable_variables])
    fresh.restore()
    unused = keras.optimizers.Adam(0.05)
    unused.build(model.trainable_variables)
    for got, want in zip(model.weights + optimizer_variables(optimizer),
                         start + optimizer_variables(unused)):
        close(np.asarray(got), np.asarray(want), "restore to before the first step", tol=0)

    # A custom loop's optimizer, not compiled into the model; only rank 1's has taken a
    # step (its slots and iterations differ from rank 0's fresh ones).
    model = make_model(200 + rank)
    optimizer = keras.optimizers.Adam(0.05)
    if rank == 1:
        optimizer.apply_gradients([(tf.ones_like(v), v) for v in model.trainable_variables])
    keras_state = hvd_tf.elastic.TensorFlowKerasState(model, optimizer, batch=7 * rank)
    keras_state.sync()
    check(keras_state.batch == 0, f"sync: keras kwargs {keras_state.batch}")
    reference = make_model(200)
    for got, want in zip(model.weights, reference.weights):
        close(np.asarray(got), np.asarray(want), "sync: model is rank 0's", tol=0)
    check(int(optimizer.iterations.numpy()) == 0, "sync: optimizer iterations are rank 0's")
    same_arrays_on_every_rank([np.asarray(v) for v in optimizer_variables(optimizer)],
                              "sync: optimizer")


CHECKS = [sync, epoch_numbering, tensorflow_state, keras_fit]
