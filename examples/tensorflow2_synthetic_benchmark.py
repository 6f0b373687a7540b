"""Synthetic training throughput, as Horovod's tensorflow2_synthetic_benchmark.py reports it.

    horovodishrun -np 2 python examples/tensorflow2_synthetic_benchmark.py --model mlp

Random data, a Keras model defined here (no download): ``resnet``, a small residual CNN
on 32x32x3 images, or ``mlp``, 784-1024-1024-1024-10. One training step is a tf.function
with DistributedGradientTape (``--eager`` runs it eagerly). Prints img/sec per rank and
in total.
"""
from __future__ import annotations

import argparse
import os
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovodish.tensorflow as hvd  # noqa: E402

layers = keras.layers


def block(x: tf.Tensor, channels: int, stride: int = 1) -> tf.Tensor:
    y = layers.Conv2D(channels, 3, stride, "same", use_bias=False)(x)
    y = layers.ReLU()(layers.BatchNormalization()(y))
    y = layers.BatchNormalization()(layers.Conv2D(channels, 3, 1, "same", use_bias=False)(y))
    if stride != 1 or x.shape[-1] != channels:
        x = layers.BatchNormalization()(layers.Conv2D(channels, 1, stride, use_bias=False)(x))
    return layers.ReLU()(y + x)


def resnet(classes: int = 10) -> keras.Model:
    inputs = keras.Input((32, 32, 3))
    x = layers.ReLU()(layers.BatchNormalization()(
        layers.Conv2D(32, 3, 1, "same", use_bias=False)(inputs)))
    for channels, stride in ((32, 1), (64, 2), (64, 1), (128, 2), (128, 1)):
        x = block(x, channels, stride)
    outputs = layers.Dense(classes)(layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, outputs)


def mlp(classes: int = 10) -> keras.Model:
    return keras.Sequential([keras.Input((784,)), layers.Dense(1024, activation="relu"),
                             layers.Dense(1024, activation="relu"),
                             layers.Dense(1024, activation="relu"), layers.Dense(classes)])


MODELS = {"resnet": (resnet, (32, 32, 3)), "mlp": (mlp, (784,))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--num-warmup-batches", type=int, default=10)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--fp16-allreduce", action="store_true",
                        help="send gradients as float16")
    parser.add_argument("--eager", action="store_true", help="no tf.function")
    parser.add_argument("--threads", type=int, default=0,
                        help="TensorFlow threads per rank (default: cores / ranks per host)")
    args = parser.parse_args()

    hvd.init()
    threads = args.threads or max(1, (os.cpu_count() or 1) // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    keras.utils.set_random_seed(hvd.rank())  # rank 0's weights win the first broadcast
    build, shape = MODELS[args.model]
    model = build()
    optimizer = keras.optimizers.SGD(0.01 * hvd.size())
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    data = tf.random.uniform((args.batch_size, *shape))
    target = tf.random.uniform((args.batch_size,), maxval=10, dtype=tf.int64)

    def step(first_batch: bool) -> None:
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        if first_batch:  # the optimizer has its variables now: start everyone alike
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables, root_rank=0)

    benchmark_step = step if args.eager else tf.function(step)

    def log(text: str) -> None:
        if hvd.rank() == 0:
            print(text, flush=True)

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of CPUs: {hvd.size()} ranks x {threads} threads")
    benchmark_step(first_batch=True)
    log("Running warmup...")
    timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)
    log("Running benchmark...")
    img_secs = []
    for i in range(args.num_iters):
        elapsed = timeit.timeit(lambda: benchmark_step(first_batch=False),
                                number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / elapsed
        log(f"Iter #{i}: {img_sec:.1f} img/sec per CPU")
        img_secs.append(img_sec)
    mean, conf = float(np.mean(img_secs)), float(1.96 * np.std(img_secs))
    log(f"Img/sec per CPU: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")


if __name__ == "__main__":
    main()
