"""Keras model.fit speed: horovodish's DistributedOptimizer against TensorFlow's
MultiWorkerMirroredStrategy (MWMS), in one job.

    horovodishrun -np 2 python examples/keras_mwms_compare.py

    horovodishrun -np 2 python examples/keras_mwms_compare.py --model many

Every rank is also one MWMS worker (TF_CONFIG on 127.0.0.1, ports picked by rank 0), so
both contenders run in the same processes, in alternating rounds, and neither gets a
quieter machine. Same model (``--model mlp``: MLP 784-1024-1024-1024-10; ``--model
many``: 40 blocks of Dense(64) + LayerNormalization + tanh and a Dense(10) head, 162
variables of at most 16 KiB, where a reducer's cost per variable shows), same data
(random, fixed seed), 64 rows per rank (MWMS: per replica) per step, plain SGD, the same
initial weights. Both average gradients over the same global batch each step, so their
weights must end equal up to rounding; the last line says how far apart they are. Prints
steps/s of each (median over rounds, timed from batch-end callbacks, tracing excluded)
and the ratio; with ``--model many`` also plain Keras on this rank's rows alone (no
communication) and the time each contender adds over it per variable.

(This comparison is an example rather than a row of ``python -m horovodish.bench``:
MWMS must be created before TensorFlow runs any op in the process.)

Keras 3.15's model.fit does not run under MWMS as shipped; two small patches below make
it (see ``patch_keras_for_mwms``).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovodish.tensorflow.keras as hvd  # noqa: E402  (imports TensorFlow, runs no op)

BATCH = 64


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_mwms():
    """MWMS must exist before TensorFlow runs any op; its cluster is our ranks."""
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(  # ranks share the cores
        max(1, (os.cpu_count() or 1) // hvd.local_size()))
    ports = hvd.broadcast_object([free_port() for _ in range(hvd.size())]
                                 if hvd.rank() == 0 else None, root_rank=0)
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
        "task": {"type": "worker", "index": hvd.rank()}})
    return tf.distribute.MultiWorkerMirroredStrategy()


def patch_keras_for_mwms(model) -> None:
    """Keras 3.15 + MWMS: (1) fit's symbolic build reduces a PerReplica batch outside
    strategy.run and fails, so build the model here and skip it; (2) the step's logs are
    reduced with strategy.reduce("MEAN", scalar, axis=0), which fails for scalars; a
    mean over replicas is axis=None."""
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None
    if getattr(trainer.reduce_per_replica, "patched", False):
        return
    original = trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and trainer._collective_all_reduce_multi_worker(strategy):
            return tf.nest.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return original(values, strategy, reduction)
    reduce_per_replica.patched = True
    trainer.reduce_per_replica = reduce_per_replica


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="per round and contender")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds (tracing)")
    parser.add_argument("--model", choices=["mlp", "many"], default="mlp",
                        help="mlp: 784-1024x3-10; many: 162 small variables")
    parser.add_argument("--blocks", type=int, default=40,
                        help="blocks of the many-variable model (4 variables each)")
    args = parser.parse_args()

    hvd.init()
    strategy = start_mwms()
    import keras
    import numpy as np
    import tensorflow as tf
    rank, size = hvd.rank(), hvd.size()
    gen = np.random.default_rng(0)
    features = 784 if args.model == "mlp" else 64
    x = gen.normal(size=(args.steps * BATCH * size, features)).astype(np.float32)
    y = gen.integers(0, 10, len(x)).astype(np.int32)
    # Global batch k is rows [k*B*size, (k+1)*B*size) for both; here, rank r's part of it.
    x_mine = x.reshape(args.steps, size, BATCH, features)[:, rank].reshape(-1, features)
    y_mine = y.reshape(args.steps, size, BATCH)[:, rank].reshape(-1)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def mlp() -> keras.Model:
        keras.utils.set_random_seed(0)
        if args.model == "many":
            blocks = [layer for _ in range(args.blocks) for layer in (
                keras.layers.Dense(64), keras.layers.LayerNormalization(),
                keras.layers.Activation("tanh"))]
            return keras.Sequential([keras.Input((64,)), *blocks, keras.layers.Dense(10)])
        return keras.Sequential([keras.Input((784,)), keras.layers.Dense(1024, activation="relu"),
                                 keras.layers.Dense(1024, activation="relu"),
                                 keras.layers.Dense(1024, activation="relu"),
                                 keras.layers.Dense(10)])

    initial = mlp().get_weights()
    ours = mlp()
    ours.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss)
    with strategy.scope():
        theirs = mlp()
        theirs.compile(keras.optimizers.SGD(0.01), loss)
        theirs._symbolic_build(data_batch=(tf.constant(x[:BATCH]), tf.constant(y[:BATCH])))
    patch_keras_for_mwms(theirs)
    plain = None
    if args.model == "many":
        plain = mlp()
        plain.compile(keras.optimizers.SGD(0.01), loss)
    # MWMS shards each global batch of B*size rows between the workers itself.
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH * size)

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            stamps.append(time.perf_counter())

    def steps_per_second(fit) -> float:
        stamps.clear()
        fit()
        skip = min(2, args.steps - 2)  # the first steps carry iterator start-up
        return (len(stamps) - 1 - skip) / (stamps[-1] - stamps[skip])

    stamps: list[float] = []
    rates: dict[str, list[float]] = {"horovodish": [], "mwms": [], "plain": []}
    for round_ in range(args.warmup + args.rounds):
        ours_rate = steps_per_second(lambda: ours.fit(x_mine, y_mine, batch_size=BATCH, epochs=1,
                                                      shuffle=False, verbose=0,
                                                      callbacks=[Clock()]))
        theirs_rate = steps_per_second(lambda: theirs.fit(dataset, epochs=1, verbose=0,
                                                          callbacks=[Clock()]))
        plain_rate = plain and steps_per_second(lambda: plain.fit(
            x_mine, y_mine, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
            callbacks=[Clock()]))
        if round_ >= args.warmup:
            rates["horovodish"].append(ours_rate)
            rates["mwms"].append(theirs_rate)
            rates["plain"].append(plain_rate)

    def largest_difference(a: list, b: list) -> float:
        return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b))
    difference = largest_difference(ours.get_weights(), theirs.get_weights())
    moved = largest_difference(ours.get_weights(), initial)
    if rank == 0:
        ours_rate = statistics.median(rates["horovodish"])
        theirs_rate = statistics.median(rates["mwms"])
        threads = tf.config.threading.get_intra_op_parallelism_threads()
        model = "MLP 784-1024x3-10" if args.model == "mlp" else \
            f"{len(ours.trainable_variables)} variables ({args.blocks} x Dense(64) + " \
            "LayerNormalization)"
        print(f"{size} ranks x {threads} threads, {model}, batch {BATCH} per rank, "
              f"{args.steps} steps x {args.rounds} rounds", flush=True)
        print(f"horovodish DistributedOptimizer: {ours_rate:.2f} steps/s", flush=True)
        print(f"MultiWorkerMirroredStrategy:     {theirs_rate:.2f} steps/s", flush=True)
        print(f"ratio horovodish / MWMS: {ours_rate / theirs_rate:.2f}x; largest weight "
              f"difference between the two models: {difference:.2e} (largest change "
              f"from the initial weights: {moved:.2e})", flush=True)
        if plain is not None:
            variables = len(plain.trainable_variables)
            plain_rate = statistics.median(rates["plain"])
            print(f"plain Keras, no communication:   {plain_rate:.2f} steps/s", flush=True)
            added = {name: [(1 / r - 1 / p) / variables * 1e6 for r, p in
                            zip(rates[name], rates["plain"])] for name in ("horovodish", "mwms")}
            for name, values in added.items():
                print(f"time {name} adds per variable: {statistics.median(values):.1f} us "
                      f"({min(values):.1f} to {max(values):.1f} over rounds)", flush=True)


if __name__ == "__main__":
    main()
