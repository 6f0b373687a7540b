"""The Keras adapter under tf_keras (Keras 2: TF_USE_LEGACY_KERAS=1, as Horovod's Keras
scripts need) against one process on the whole batch.

``tf.keras`` is tf_keras here, and every optimizer, model and callback comes from it, as
in a Horovod script. Every rank also runs the single-process reference itself (plain
tf_keras, no collectives), so each check compares the distributed result with an
independent computation on every rank. Then the elastic checks (elastic_checks.py) run
under tf_keras too.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
from checks import quiet_tensorflow
from worker_support import check, close, expect_error, run_checks, same_on_every_rank

import tensorflow as tf  # noqa: E402

import horovodish.tensorflow.keras as hvd  # noqa: E402
from horovodish.tensorflow import keras_flavor  # noqa: E402

FEATURES, CLASSES, PER_RANK = 6, 3, 4
TOL = 1e-5


def dataset(size: int, batches: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    gen = np.random.default_rng(seed)
    x = gen.normal(size=(batches * PER_RANK * size, FEATURES)).astype(np.float32)
    y = (np.abs(x[:, :CLASSES]).argmax(1)).astype(np.int32)
    return x, y


def shard(array: np.ndarray, rank: int, size: int, per: int = PER_RANK) -> np.ndarray:
    """Global batch k (per * size rows) holds every rank's batch k, in rank order."""
    blocks = array.reshape(-1, size, per, *array.shape[1:])
    return blocks[:, rank].reshape(-1, *array.shape[1:])


def make_model(seed: int, embedding: bool = False) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(seed)
    inputs = tf.keras.Input((FEATURES,))
    hidden = tf.keras.layers.Dense(16, activation="relu")(inputs)
    if embedding:  # rows 0..9 of a table, picked by the first two features
        ids = tf.keras.layers.Lambda(
            lambda x: tf.cast(tf.abs(x[:, :2]) * 3, tf.int32) % 10)(inputs)
        embedded = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(10, 8)(ids))
        hidden = tf.keras.layers.Add()([hidden, embedded])
    return tf.keras.Model(inputs, tf.keras.layers.Dense(CLASSES)(hidden))


def loss() -> tf.keras.losses.Loss:
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def reference_fit(make_optimizer, x, y, size: int, epochs: int, per: int = PER_RANK,
                  embedding: bool = False) -> tuple[tf.keras.Model, list[float]]:
    """Plain tf_keras from rank 0's start on the global batches."""
    reference = make_model(100, embedding)
    reference.compile(make_optimizer(), loss())
    history = reference.fit(x, y, batch_size=per * size, shuffle=False, epochs=epochs,
                            verbose=0)
    return reference, history.history["loss"]


def distributed_fit(make_optimizer, x, y, rank: int, size: int, epochs: int,
                    per: int = PER_RANK, embedding: bool = False, **options
                    ) -> tuple[tf.keras.Model, list[float]]:
    """Ranks start from different weights: the broadcast callback must make them rank 0's."""
    model = make_model(100 + rank, embedding)
    model.compile(hvd.DistributedOptimizer(make_optimizer(), **options), loss(),
                  experimental_run_tf_function=False)  # as Horovod's Keras 2 examples do
    history = model.fit(shard(x, rank, size, per), shard(y, rank, size, per),
                        batch_size=per, shuffle=False, epochs=epochs, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback()])
    return model, history.history["loss"]


def same_weights(model: tf.keras.Model, reference: tf.keras.Model, what: str) -> None:
    same_on_every_rank(np.concatenate([w.ravel() for w in model.get_weights()]), what)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        close(got, want, what, tol=TOL)


# -- checks ------------------------------------------------------------------------------------
def keras_is_tf_keras(rank: int, size: int, tmp: Path) -> None:
    check(keras_flavor.KERAS_2 and tf.keras.__name__.startswith("tf_keras"),
          f"tf.keras is {tf.keras.__name__}, horovodish serves {keras_flavor.NAME}")


def fit_matches_one_process(rank: int, size: int, tmp: Path) -> None:
    """model.fit with Keras 2's optimizer and with OptimizerV2 (tf.keras.optimizers.legacy):
    the weights and the averaged epoch losses of plain Keras on the global batches."""
    x, y = dataset(size, 5)
    for name, make in (("SGD", lambda: tf.keras.optimizers.SGD(0.05, momentum=0.9)),
                       ("legacy Adam", lambda: tf.keras.optimizers.legacy.Adam(0.01))):
        reference, want = reference_fit(make, x, y, size, epochs=2)
        model, got = distributed_fit(make, x, y, rank, size, epochs=2)
        same_weights(model, reference, f"fit with {name}")
        close(got, want, f"MetricAverageCallback's epoch losses with {name}", tol=TOL)


def get_gradients_path(rank: int, size: int, tmp: Path) -> None:
    """OptimizerV2.get_gradients (what Keras 2's graph-mode get_updates calls) returns
    reduced gradients, and the apply_gradients after it does not reduce them again."""
    x, y = dataset(size, 3)
    model, reference = make_model(100), make_model(100)
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(0.1))
    plain = tf.keras.optimizers.legacy.SGD(0.1)

    @tf.function
    def step(xb, yb):
        grads = opt.get_gradients(loss()(yb, model(xb)), model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    mine_x, mine_y = shard(x, rank, size), shard(y, rank, size)
    for k in range(3):
        rows = slice(k * PER_RANK, (k + 1) * PER_RANK)
        step(mine_x[rows], mine_y[rows])
        whole = slice(k * PER_RANK * size, (k + 1) * PER_RANK * size)
        with tf.GradientTape() as tape:
            value = loss()(y[whole], reference(x[whole]))
        plain.apply_gradients(zip(tape.gradient(value, reference.trainable_variables),
                                  reference.trainable_variables))
    same_weights(model, reference, "get_gradients then apply_gradients")


def aggregation(rank: int, size: int, tmp: Path) -> None:
    """backward_passes_per_step=2 with average_aggregated_gradients: one update per two
    batches from their mean gradient, which is plain SGD on batches twice as large;
    iterations still count every batch."""
    x, y = dataset(size, 8)
    for name, make in (("SGD", lambda: tf.keras.optimizers.SGD(0.1)),
                       ("legacy SGD", lambda: tf.keras.optimizers.legacy.SGD(0.1))):
        # The reference's global batch k is the ranks' batches 2k and 2k+1.
        pairs = x.reshape(-1, 2, size, PER_RANK, FEATURES).transpose(0, 2, 1, 3, 4)
        labels = y.reshape(-1, 2, size, PER_RANK).transpose(0, 2, 1, 3)
        reference, _ = reference_fit(make, pairs.reshape(-1, FEATURES), labels.reshape(-1),
                                     size, epochs=1, per=2 * PER_RANK)
        model, _ = distributed_fit(make, x, y, rank, size, epochs=1,
                                   backward_passes_per_step=2,
                                   average_aggregated_gradients=True)
        same_weights(model, reference, f"backward_passes_per_step=2 with {name}")
        check(int(model.optimizer.iterations.numpy()) == 8,
              f"{name}: iterations {int(model.optimizer.iterations.numpy())}, want 8")


def sparse_as_dense(rank: int, size: int, tmp: Path) -> None:
    """An Embedding's IndexedSlices gradient, gathered as it is or reduced as dense."""
    x, y = dataset(size, 4)
    make = lambda: tf.keras.optimizers.SGD(0.1)  # noqa: E731
    reference, _ = reference_fit(make, x, y, size, epochs=1, embedding=True)
    for dense in (False, True):
        model, _ = distributed_fit(make, x, y, rank, size, epochs=1, embedding=True,
                                   sparse_as_dense=dense)
        same_weights(model, reference, f"embedding with sparse_as_dense={dense}")


def lr_callbacks(rank: int, size: int, tmp: Path) -> None:
    """Warmup ramps to initial_lr over its epochs; the schedule multiplies from start_epoch."""
    x, y = dataset(size, 4)
    steps, base = 4, 0.01 * size
    for callback, want in (
            (hvd.callbacks.LearningRateWarmupCallback(base, warmup_epochs=2,
                                                      steps_per_epoch=steps,
                                                      momentum_correction=False),
             [base / size * (1 + (size - 1) / 2), base, base]),
            (hvd.callbacks.LearningRateScheduleCallback(base, multiplier=0.5, start_epoch=1,
                                                        momentum_correction=False),
             [base, base, base * 0.5])):
        model = make_model(100)
        model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(base)), loss())
        history = model.fit(shard(x, rank, size), shard(y, rank, size), batch_size=PER_RANK,
                            shuffle=False, epochs=3, verbose=0, callbacks=[callback])
        close(history.history["lr"], want, f"{type(callback).__name__} lr per epoch",
              tol=1e-6)


class Scale(tf.keras.layers.Layer):
    """A layer Keras knows only through custom_objects."""

    def build(self, shape):
        self.factor = self.add_weight(name="factor", shape=(), initializer="ones")

    def call(self, inputs):
        return inputs * self.factor


def load_model(rank: int, size: int, tmp: Path) -> None:
    """hvd.load_model with custom objects gives a DistributedOptimizer with the saved
    state: one more distributed step equals plain Keras's step on the global batch from
    the same saved model."""
    x, y = dataset(size, 2)
    path = tmp / "keras2.h5"
    if rank == 0:
        tf.keras.utils.set_random_seed(3)
        inputs = tf.keras.Input((FEATURES,))
        saved = tf.keras.Model(inputs, tf.keras.layers.Dense(CLASSES)(Scale()(inputs)))
        saved.compile(tf.keras.optimizers.Adam(0.01), loss())
        saved.fit(x, y, batch_size=PER_RANK * size, epochs=1, verbose=0)
        saved.save(path)
    hvd.barrier()
    model = hvd.load_model(str(path), custom_objects={"Scale": Scale})
    reference = tf.keras.models.load_model(path, custom_objects={"Scale": Scale})
    check(isinstance(model.optimizer, hvd.distributed_class(type(reference.optimizer))),
          f"loaded optimizer is a {type(model.optimizer).__mro__}")
    check(int(model.optimizer.iterations.numpy()) == 2, "the saved optimizer state is kept")
    model.fit(shard(x, rank, size)[:PER_RANK], shard(y, rank, size)[:PER_RANK],
              batch_size=PER_RANK, epochs=1, verbose=0)
    reference.fit(x[:PER_RANK * size], y[:PER_RANK * size], batch_size=PER_RANK * size,
                  epochs=1, verbose=0)
    same_weights(model, reference, "a step after load_model")
    hvd.barrier()


def sync_batch_norm(rank: int, size: int, tmp: Path) -> None:
    """SyncBatchNormalization on each rank's shard: tf_keras' BatchNormalization on the
    whole batch (outputs of this rank's rows, and the moving statistics)."""
    gen = np.random.default_rng(4)
    x = (gen.normal(size=(size * 8, 5)) * 3 + 2).astype(np.float32)
    layer, whole = hvd.SyncBatchNormalization(momentum=0.5), \
        tf.keras.layers.BatchNormalization(momentum=0.5)
    mine = shard(x, rank, size, per=8)
    got = layer(mine, training=True).numpy()
    want = whole(x, training=True).numpy()
    close(got, shard(want, rank, size, per=8), "SyncBatchNormalization outputs", tol=1e-4)
    close(layer.moving_mean.numpy(), whole.moving_mean.numpy(), "moving mean", tol=1e-5)
    close(layer.moving_variance.numpy(), whole.moving_variance.numpy(), "moving variance",
          tol=1e-4)


def refuses_a_keras3_optimizer(rank: int, size: int, tmp: Path) -> None:
    import keras  # Keras 3, beside tf_keras
    expect_error(lambda: hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), TypeError,
                 "Keras 3", what="a Keras 3 optimizer under tf_keras")


CHECKS = [keras_is_tf_keras, fit_matches_one_process, get_gradients_path, aggregation,
          sparse_as_dense, lr_callbacks, load_model, sync_batch_norm,
          refuses_a_keras3_optimizer]

if __name__ == "__main__":
    assert os.environ.get("TF_USE_LEGACY_KERAS") == "1", "run with TF_USE_LEGACY_KERAS=1"
    quiet_tensorflow()
    hvd.init()
    with tempfile.TemporaryDirectory() as local:
        run_checks(CHECKS, hvd.rank(), hvd.size(),
                   Path(hvd.broadcast_object(local, root_rank=0)))
        hvd.barrier()
    import elastic_checks  # under tf_keras too, in this job
    run_checks(elastic_checks.CHECKS, hvd.rank(), hvd.size())
