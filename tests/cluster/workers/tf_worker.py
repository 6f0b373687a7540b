"""TensorFlow and Keras 3 across hosts: DistributedGradientTape's gradients and
model.fit's weights equal one process on the whole batch, on every rank."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovodish.tensorflow as hvd_tf  # noqa: E402
import horovodish.tensorflow.keras as hvd  # noqa: E402

from worker_support import close, run_checks, same_on_every_rank  # noqa: E402

FEATURES, HIDDEN, CLASSES, PER_RANK = 64, 512, 3, 4
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def dataset(size: int, batches: int) -> tuple[np.ndarray, np.ndarray]:
    gen = np.random.default_rng(7)
    x = gen.normal(size=(batches * PER_RANK * size, FEATURES)).astype(np.float32)
    return x, np.abs(x[:, :CLASSES]).argmax(1).astype(np.int32)


def shard(array: np.ndarray, rank: int, size: int) -> np.ndarray:
    """Global batch k holds every rank's batch k, in rank order."""
    return array.reshape(-1, size, PER_RANK, *array.shape[1:])[:, rank].reshape(
        -1, *array.shape[1:])


def make_model() -> keras.Model:
    keras.utils.set_random_seed(1234)
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(HIDDEN, activation="tanh")(inputs)  # 128 KiB of kernel
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(hidden))


def check_tape(rank: int, size: int) -> None:
    x, y = dataset(size, 1)
    model = make_model()
    with tf.GradientTape() as tape:
        whole = LOSS(y, model(x))
    reference = tape.gradient(whole, model.trainable_variables)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb))
        return hvd_tf.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)

    for got, want, v in zip(step(shard(x, rank, size), shard(y, rank, size)), reference,
                            model.trainable_variables):
        close(got, want, f"tape gradient of {v.path}", tol=1e-5)


def check_fit(rank: int, size: int) -> None:
    x, y = dataset(size, 4)
    reference = make_model()
    reference.compile(keras.optimizers.SGD(0.05, momentum=0.9), LOSS)
    reference.fit(x, y, batch_size=PER_RANK * size, epochs=2, shuffle=False, verbose=0)
    model = make_model()
    if rank == size - 1:  # a different start: the broadcast callback must fix it
        model.set_weights([w + 1.0 for w in model.get_weights()])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), LOSS)
    model.fit(shard(x, rank, size), shard(y, rank, size), batch_size=PER_RANK, epochs=2,
              shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    for got, want, v in zip(model.get_weights(), reference.get_weights(), model.weights):
        close(got, want, f"fit weights {v.path}", tol=1e-5)
    same_on_every_rank(np.concatenate([w.ravel() for w in model.get_weights()]), "weights")


if __name__ == "__main__":
    hvd.init()
    run_checks([check_tape, check_fit], hvd.rank(), hvd.size())
