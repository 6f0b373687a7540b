"""Train a Keras 3 MLP with model.fit on scikit-learn's handwritten digits, on N ranks.

    python examples/keras_digits.py                     # one rank
    horovodishrun -np 2 python examples/keras_digits.py # or: mpirun -np 2 python ...

Every rank holds the same deterministic train/test split and fits on its 1/N shard of
the training set. The learning rate scales with N (so does the effective batch) and
warms up over the first epochs; initial weights come from rank 0; epoch metrics are
averaged over ranks. Rank 0 prints progress and, at the end, ``test accuracy: 0.9..``
(about 0.97 on 1 and on 2 ranks).
"""
from __future__ import annotations

import time

_STARTED = time.perf_counter()  # wall time includes the imports and init

import argparse  # noqa: E402
import os  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import horovodish.tensorflow.keras as hvd  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by size")
    parser.add_argument("--warmup-epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args()


def load(seed: int) -> tuple[np.ndarray, ...]:
    """Same split on every rank; this rank's shard of the training set, cut to the
    shortest shard's length so every rank runs the same number of steps."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25,
                                                        random_state=seed, stratify=digits.target)
    rows = len(x_train) // hvd.size()
    mine = slice(hvd.rank(), None, hvd.size())
    return x_train[mine][:rows], y_train[mine][:rows], x_test, y_test


def main() -> None:
    args = parse_args()
    hvd.init()
    threads = max(1, (os.cpu_count() or 1) // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)  # ranks share the cores
    keras.utils.set_random_seed(args.seed + hvd.rank())  # rank 0's weights win the broadcast
    x_train, y_train, x_test, y_test = load(args.seed)

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10)])
    lr = args.lr * hvd.size()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9))
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),  # before anything that reads the epoch logs
        hvd.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=args.warmup_epochs,
                                                 momentum_correction=False),
    ]
    if hvd.rank() == 0:
        callbacks.append(keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: print(
            f"epoch {epoch + 1:3d}: train loss {logs['loss']:.4f}, accuracy "
            f"{logs['accuracy']:.4f}, lr {logs['lr']:.3f}", flush=True)
            if (epoch + 1) % 5 == 0 else None))
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
              callbacks=callbacks, verbose=0)

    # Each rank scores its share of the test set; summed counts weigh shares by size.
    mine = slice(hvd.rank(), None, hvd.size())
    predicted = model.predict(x_test[mine], verbose=0).argmax(1)
    counts = hvd.allreduce(np.array([(predicted == y_test[mine]).sum(), len(predicted)],
                                    np.float64), name="test_counts", op=hvd.Sum).numpy()
    if hvd.rank() == 0:
        print(f"ranks: {hvd.size()}, wall time: {time.perf_counter() - _STARTED:.1f} s",
              flush=True)
        print(f"test accuracy: {counts[0] / counts[1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
