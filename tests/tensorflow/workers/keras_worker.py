"""DistributedGradientTape and the Keras 3 adapter against one process on the whole batch.

Every rank also runs the single-process reference itself (no collectives), so each
check compares the distributed result with an independent computation on every rank.
Each is a named check (tests/worker_support.py) given the directory that all ranks share.
"""
from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import numpy as np
from checks import F64_TOL, quiet_tensorflow
from worker_support import (check, close, expect_error, run_checks,  # noqa: E402
                            same_on_every_rank)

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovodish.tensorflow as hvd_tf  # noqa: E402
import horovodish.tensorflow.keras as hvd  # noqa: E402
from horovodish.tensorflow.keras.optimizer import _DistributedOptimizerMixin  # noqa: E402

FEATURES, CLASSES, PER_RANK_BATCH = 6, 3, 4


def dataset(size: int, batches: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    gen = np.random.default_rng(seed)
    x = gen.normal(size=(batches * PER_RANK_BATCH * size, FEATURES)).astype(np.float32)
    y = (np.abs(x[:, :CLASSES]).argmax(1)).astype(np.int32)
    return x, y


def shard(array: np.ndarray, rank: int, size: int) -> np.ndarray:
    """Global batch k (PER_RANK_BATCH * size rows) holds every rank's batch k, in rank order."""
    blocks = array.reshape(-1, size, PER_RANK_BATCH, *array.shape[1:])
    return blocks[:, rank].reshape(-1, *array.shape[1:])


def make_model(embedding: bool = False) -> keras.Model:
    keras.utils.set_random_seed(1234)  # the same weights on every rank (and the reference)
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    if embedding:
        ids = keras.ops.cast(keras.ops.abs(inputs[:, :2]) * 3, "int32") % 10
        hidden = hidden + keras.ops.sum(keras.layers.Embedding(10, 16)(ids), axis=1)
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(hidden))


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def flat(weights) -> np.ndarray:
    return np.concatenate([np.asarray(w, np.float64).ravel() for w in weights])


# -- DistributedGradientTape ------------------------------------------------------------------
def distributed_gradient_tape(rank: int, size: int, tmp: Path) -> None:
    x, y = dataset(size, 1)
    model = make_model(embedding=True)
    variables = model.trainable_variables

    def dense(grads):
        return [tf.convert_to_tensor(g).numpy() for g in grads]

    with tf.GradientTape() as tape:
        whole = LOSS(y, model(x))
    reference = dense(tape.gradient(whole, variables))
    xs, ys = tf.constant(shard(x, rank, size)), tf.constant(shard(y, rank, size))
    variants = {
        "default": ({}, 1.0, 1e-6),
        "sparse_as_dense": ({"sparse_as_dense": True}, 1.0, 1e-6),
        "groups=2": ({"groups": 2}, 1.0, 1e-6),
        "groups=lists": ({"groups": [variables[:2]]}, 1.0, 1e-6),
        "predivide": ({"gradient_predivide_factor": 2.0}, 1.0, 1e-6),
        "Sum": ({"op": hvd.Sum}, float(size), 1e-6),
        "fp16": ({"compression": hvd.Compression.fp16}, 1.0, 2e-3),
    }
    for label, (kwargs, factor, tol) in variants.items():
        def step(xb, yb, kwargs=kwargs):
            with tf.GradientTape() as tape:
                loss = LOSS(yb, model(xb))
            tape = hvd_tf.DistributedGradientTape(tape, **kwargs)
            return tape.gradient(loss, variables)
        for mode, fn in (("eager", step), ("tf.function", tf.function(step))):
            got = fn(xs, ys)
            if label == "default":
                check(any(isinstance(g, tf.IndexedSlices) for g in got),
                      "embedding gradient stays IndexedSlices")
            for g, want, v in zip(dense(got), reference, variables):
                close(g, want * factor, f"tape {label} {mode} {v.path}", tol=tol)


# -- model.fit ----------------------------------------------------------------------------------
class Recorder(keras.callbacks.Callback):
    """Copies what it sees: epoch logs (before averaging, if placed first), batch lr."""

    def __init__(self) -> None:
        super().__init__()
        self.epoch_logs: list[dict] = []
        self.batch_lr: list[float] = []
        self.batch_momentum: list[float] = []

    def on_train_batch_begin(self, batch, logs=None):
        self.batch_momentum.append(float(np.asarray(self.model.optimizer.momentum)))

    def on_train_batch_end(self, batch, logs=None):
        self.batch_lr.append(float(np.asarray(self.model.optimizer.learning_rate)))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs or {}))


def fit(rank: int, size: int, tmp: Path) -> None:
    x, y = dataset(size, 6)
    epochs = 3
    reference = make_model()
    reference.compile(keras.optimizers.SGD(0.05, momentum=0.9), LOSS)
    ref_history = reference.fit(x, y, batch_size=PER_RANK_BATCH * size, epochs=epochs,
                                shuffle=False, verbose=0).history

    model = make_model()
    if rank == 1:  # a different start: the broadcast callback must fix it
        model.set_weights([w + 1.0 for w in model.get_weights()])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), LOSS)
    raw = Recorder()
    history = model.fit(shard(x, rank, size), shard(y, rank, size), batch_size=PER_RANK_BATCH,
                        epochs=epochs, shuffle=False, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), raw,
                                   hvd.callbacks.MetricAverageCallback()]).history
    check(isinstance(model.optimizer, _DistributedOptimizerMixin), "optimizer is wrapped")
    same_on_every_rank(flat(model.get_weights()), "weights after fit")
    close(flat(model.get_weights()), flat(reference.get_weights()),
          "fit on shards == one process on the whole batch", tol=1e-5)
    check(history["loss"][-1] < history["loss"][0], f"loss falls: {history['loss']}")
    raw_losses = hvd.allgather_object([logs["loss"] for logs in raw.epoch_logs])
    close(history["loss"], np.mean(raw_losses, 0), "MetricAverageCallback == mean of ranks",
          tol=F64_TOL)
    close(history["loss"], ref_history["loss"], "averaged loss == whole-batch loss", tol=1e-5)
    same_on_every_rank(np.array(history["loss"]), "logged loss")

    # The saved optimizer re-wraps with its state; the file also loads without horovodish.
    path = tmp / "model.keras"
    if rank == 0:
        model.save(path)
    hvd.barrier()
    plain = keras.models.load_model(path)
    check(not isinstance(plain.optimizer, _DistributedOptimizerMixin), "plain load")
    loaded = hvd.load_model(path)
    check(isinstance(loaded.optimizer, _DistributedOptimizerMixin), "load_model re-wraps")
    check(int(np.asarray(loaded.optimizer.iterations))
          == int(np.asarray(model.optimizer.iterations)),
          "load_model keeps optimizer state")
    loaded.fit(shard(x, rank, size), shard(y, rank, size), batch_size=PER_RANK_BATCH, epochs=1,
               shuffle=False, verbose=0)
    same_on_every_rank(flat(loaded.get_weights()), "weights after load_model + fit")

    checkpoint = tmp / f"best.rank{rank}.keras"
    model.fit(shard(x, rank, size), shard(y, rank, size), batch_size=PER_RANK_BATCH, epochs=2,
              verbose=0, callbacks=[hvd.callbacks.BestModelCheckpoint(str(checkpoint),
                                                                      monitor="loss")])
    hvd.barrier()
    written = hvd.allgather_object(checkpoint.exists())
    check(written == [r == 0 for r in range(size)], f"BestModelCheckpoint writers: {written}")

    model.set_weights([w + rank for w in model.get_weights()])
    hvd.broadcast_global_variables(0, model=model)
    same_on_every_rank(flat(model.get_weights()), "broadcast_global_variables")
    expect_error(lambda: hvd.broadcast_global_variables(0), ValueError, "model=",
                 what="broadcast_global_variables without a model")

    expect_error(lambda: hvd.DistributedOptimizer("adam"), TypeError,
                 "not 'adam'; pass e.g. keras.optimizers.Adam",
                 what="DistributedOptimizer of a name")
    expect_error(lambda: hvd.DistributedOptimizer(keras.optimizers.Adam), TypeError,
                 "not the class Adam", what="DistributedOptimizer of a class")

    xla = make_model()
    xla.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), LOSS, jit_compile=True)
    expect_error(lambda: xla.fit(x[:4], y[:4], verbose=0), ValueError, "jit_compile=False",
                 what="jit_compile says what to do")


# -- learning-rate callbacks -----------------------------------------------------------------
def run_lr(callback, steps: int, epochs: int, momentum: float = 0.0,
           run_eagerly: bool = False) -> tuple[list[float], Recorder]:
    x, y = dataset(1, steps)
    model = make_model()
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=momentum)), LOSS,
                  run_eagerly=run_eagerly)
    recorder = Recorder()
    history = model.fit(x, y, batch_size=PER_RANK_BATCH, epochs=epochs, verbose=0,
                        callbacks=[callback, recorder]).history
    return history["lr"], recorder


def lr_callbacks(rank: int, size: int, tmp: Path) -> None:
    steps, epochs, warmup, initial = 4, 4, 3, 0.4

    def warm(epoch: float) -> float:  # Horovod's warmup multiplier, written out
        return initial / size * ((epoch + 1 / steps) * (size - 1) / warmup + 1)
    lrs, recorder = run_lr(hvd.callbacks.LearningRateWarmupCallback(
        initial, warmup_epochs=warmup, momentum_correction=False), steps, epochs)
    want = [warm(e + (steps - 1) / steps) for e in range(warmup)]
    want += [want[-1]] * (epochs - warmup)
    close(lrs, want, "warmup lr per epoch", tol=1e-6)
    close(lrs[warmup - 1], initial, "warmup ends at initial_lr", tol=1e-6)
    batches = [warm(e + b / steps) for e in range(warmup) for b in range(steps)]
    close(recorder.batch_lr[:len(batches)], batches, "warmup lr per batch", tol=1e-6)

    lrs, _ = run_lr(hvd.callbacks.LearningRateScheduleCallback(
        initial, 0.5, start_epoch=1, end_epoch=3, momentum_correction=False), steps, epochs)
    # A constant multiplier counts from start_epoch (Horovod's m ** (epoch - start_epoch)).
    close(lrs, [0.1, initial, initial * 0.5, initial * 0.5],
          "staircase schedule lr per epoch", tol=1e-6)
    lrs, recorder = run_lr(hvd.callbacks.LearningRateScheduleCallback(
        initial, lambda e: 1 / (1 + e), staircase=False, momentum_correction=False), steps, 2)
    batches = [initial / (1 + e + b / steps) for e in range(2) for b in range(steps)]
    close(recorder.batch_lr, batches, "smooth schedule lr per batch", tol=1e-6)

    # Momentum correction: applied for the batch where the lr changes (eager models)...
    _, recorder = run_lr(hvd.callbacks.LearningRateScheduleCallback(
        initial, 0.5, start_epoch=0), steps, 2, momentum=0.9, run_eagerly=True)
    first_epoch_momentum = 0.9 * initial / 0.1  # lr 0.1 -> 0.4 at epoch 0, batch 0
    want = [first_epoch_momentum, 0.9, 0.9, 0.9, 0.9 * 0.5, 0.9, 0.9, 0.9]
    close(recorder.batch_momentum, want, "momentum correction per batch", tol=1e-6)
    # ...and skipped, with a warning, where Keras compiled the float momentum in.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_lr(hvd.callbacks.LearningRateScheduleCallback(initial, 0.5), steps, 1, momentum=0.9)
    check(any("momentum_correction" in str(w.message) for w in caught),
          "compiled momentum: correction skipped with a warning")


# -- backward_passes_per_step ------------------------------------------------------------------
def aggregation(rank: int, size: int, tmp: Path) -> None:
    passes = 3

    def grad(r: int, step: int) -> np.ndarray:
        return np.array([r + 1.0 + step, 10.0 * (r + 1) - step], np.float32)

    for average in (False, True):
        for mode in ("eager", "tf.function"):
            variable = keras.Variable(np.zeros(2, np.float32))
            opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0),
                                           backward_passes_per_step=passes,
                                           average_aggregated_gradients=average)

            def apply(g):
                opt.apply_gradients([(g, variable)])
            apply = apply if mode == "eager" else tf.function(apply)
            want = np.zeros(2)
            for step in range(2 * passes):
                apply(tf.constant(grad(rank, step)))
                if step % passes == passes - 1:
                    window = range(step - passes + 1, step + 1)
                    summed = np.mean([sum(grad(r, s) for s in window) for r in range(size)], 0)
                    want = want - summed / (passes if average else 1)
                label = f"bpps={passes} average={average} {mode} step {step}"
                close(variable.numpy(), want, label, tol=1e-5)
                check(int(np.asarray(opt.iterations)) == step + 1, f"{label}: iterations advance")

    x, y = dataset(size, 4)
    model = make_model()
    model.compile(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01),
                                           backward_passes_per_step=2), LOSS,
                  steps_per_execution=3)  # several steps per graph call: a while loop
    model.fit(shard(x, rank, size), shard(y, rank, size), batch_size=PER_RANK_BATCH, epochs=1,
              verbose=0, shuffle=False)
    same_on_every_rank(flat(model.get_weights()), "weights after fit with bpps=2")


def resume(rank: int, size: int, tmp: Path) -> None:
    """Horovod's resume pattern: rank 0 restores a checkpoint (optimizer state included),
    the other ranks build afresh, and BroadcastGlobalVariablesCallback aligns them. Only
    rank 0's optimizer was built, so the ranks broadcast different variable lists and
    waited on each other for good. Against one process resuming on the whole batch."""
    path = tmp / "model.keras"  # saved by fit
    x, y = dataset(size, 4, seed=11)
    reference = keras.models.load_model(path)
    reference.fit(x, y, batch_size=PER_RANK_BATCH * size, epochs=1, shuffle=False, verbose=0)
    if rank == 0:
        model = hvd.load_model(path)
    else:
        model = make_model()
        model.set_weights([w - 3.0 for w in model.get_weights()])
        model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), LOSS)
    model.fit(shard(x, rank, size), shard(y, rank, size), batch_size=PER_RANK_BATCH, epochs=1,
              shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    close(flat(model.get_weights()), flat(reference.get_weights()),
          "resumed fit == one process resuming on the whole batch", tol=1e-5)
    check(int(np.asarray(model.optimizer.iterations)) ==
          int(np.asarray(reference.optimizer.iterations)), "resumed iterations")
    # Mismatched models: a clear error on every rank, not a hang.
    other = make_model() if rank == 0 else keras.Sequential([keras.Input((FEATURES,)),
                                                             keras.layers.Dense(CLASSES)])
    other.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), LOSS)
    expect_error(lambda: hvd.broadcast_global_variables(0, model=other), ValueError,
                 "first difference", what="mismatched models")


def aggregation_state(rank: int, size: int, tmp: Path) -> None:
    """backward_passes_per_step's local sums are no optimizer variables: the broadcast
    callback overwrote a rank's partial sums with the root's (the first update off by
    0.1 here), a saved optimizer had 3 variables too many and loaded without its state,
    and under mixed precision iterations advanced only on applied steps."""
    x, y = dataset(size, 4, seed=5)
    reference = make_model()
    reference.compile(keras.optimizers.SGD(0.1), LOSS)
    reference.fit(x, y, batch_size=2 * PER_RANK_BATCH * size, epochs=1, shuffle=False, verbose=0)
    model = make_model()
    if rank == 1:
        model.set_weights([w + 1.0 for w in model.get_weights()])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2,
                                           average_aggregated_gradients=True), LOSS)
    model.fit(shard(x, rank, size), shard(y, rank, size), batch_size=PER_RANK_BATCH, epochs=1,
              shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    close(flat(model.get_weights()), flat(reference.get_weights()),
          "bpps=2 with the broadcast callback == one process on double batches", tol=1e-5)

    adam = make_model()
    adam.compile(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), backward_passes_per_step=2),
                 LOSS)
    adam.fit(shard(x, rank, size), shard(y, rank, size), batch_size=PER_RANK_BATCH, epochs=1,
             shuffle=False, verbose=0)
    path = tmp / f"adam.rank{rank}.keras"
    adam.save(path)
    for load in (keras.models.load_model, hvd.load_model):
        loaded = load(path)
        check(int(np.asarray(loaded.optimizer.iterations)) == 4,
              f"{load.__module__}.load_model: iterations "
              f"{int(np.asarray(loaded.optimizer.iterations))} of 4")
        close(flat(loaded.optimizer.variables[2:]), flat(adam.optimizer.variables[2:]),
              f"{load.__module__}.load_model: Adam's moments", tol=F64_TOL)

    # Horovod's old name for groups (an int) is accepted and splits the submission.
    grouped = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), num_groups=2)
    weights = [keras.Variable(np.zeros(2, np.float32)) for _ in range(3)]
    grouped.apply_gradients([(tf.constant([rank + 1.0, 1.0]) * (i + 1), w)
                             for i, w in enumerate(weights)])
    check(grouped._hvd_reduction.groups == 2, "num_groups became groups")
    mean = np.mean([r + 1.0 for r in range(size)])
    for i, w in enumerate(weights):
        close(w.numpy(), -(i + 1) * np.array([mean, 1.0]), f"num_groups=2: variable {i}",
              tol=F64_TOL)

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        variable = keras.Variable(np.zeros(2, np.float32))
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2)
        for step in range(4):
            opt.apply_gradients([(tf.constant([1.0, 2.0]), variable)])
        check(int(np.asarray(opt.iterations)) == 4,
              f"mixed_float16: iterations {int(np.asarray(opt.iterations))} after 4 passes")
        scale = float(np.asarray(opt.dynamic_scale))  # the gradients count as scaled
        close(variable.numpy() * scale, [-4.0, -8.0], "mixed_float16: two applied sums",
              tol=F64_TOL)
    finally:
        keras.config.set_dtype_policy(previous)


def value_collectives(rank: int, size: int, tmp: Path) -> None:
    got = hvd.allreduce(np.array([rank, 1.0]), name="keras.value")
    close(got.numpy(), [np.mean(range(size)), 1.0], "keras allreduce(value, name)", tol=F64_TOL)
    close(hvd.allgather(np.array([rank])).numpy(), np.arange(size), "keras allgather", tol=F64_TOL)
    close(hvd.broadcast(np.array([rank]), 0).numpy(), [0], "keras broadcast", tol=F64_TOL)


if __name__ == "__main__":
    quiet_tensorflow()
    hvd.init()
    with tempfile.TemporaryDirectory() as local:
        # One directory for every rank (the checkpoint check looks at who wrote; resume
        # loads what fit saved).
        run_checks([distributed_gradient_tape, fit, resume, aggregation_state, lr_callbacks,
                    aggregation, value_collectives], hvd.rank(), hvd.size(),
                   Path(hvd.broadcast_object(local, root_rank=0)))
        hvd.barrier()  # rank 0's directory outlives the others' use of it
    import elastic_checks  # hvd.elastic's, in this job: TensorFlow's import costs seconds
    run_checks(elastic_checks.CHECKS, hvd.rank(), hvd.size())
