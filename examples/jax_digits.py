"""Train an MLP on scikit-learn's handwritten digits in plain JAX + optax on N ranks.

    python examples/jax_digits.py                     # one rank
    horovodishrun -np 2 python examples/jax_digits.py

The single-process loop, with three horovodish lines: ``hvd.init()``, the optax
transformation wrapped in ``hvd.DistributedOptimizer`` (gradients averaged over ranks,
one collective per step), and the initial parameters broadcast from rank 0. Every rank
holds the same deterministic split and trains on its 1/N shard of the training set; the
learning rate scales with N. Rank 0 prints ``test accuracy: 0.9..`` at the end.
"""
from __future__ import annotations

import time

_STARTED = time.perf_counter()  # wall time includes the imports and init

import argparse  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import horovodish.jax as hvd  # noqa: E402


def init_params(key: jax.Array) -> dict:
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (64, 128)) * (2 / 64) ** 0.5, "b1": jnp.zeros(128),
            "w2": jax.random.normal(k2, (128, 10)) * (1 / 128) ** 0.5, "b2": jnp.zeros(10)}


def logits(params: dict, x: jax.Array) -> jax.Array:
    return jax.nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits(params, x), y).mean()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by size")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    hvd.init()
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int32),
        test_size=0.25, random_state=args.seed, stratify=digits.target)
    x_train, y_train = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]

    params = hvd.broadcast_parameters(init_params(jax.random.PRNGKey(args.seed)), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optax.sgd(args.lr * hvd.size(), momentum=0.9))
    state = optimizer.init(params)
    grad = jax.jit(jax.grad(loss))
    # Every rank must run the same number of steps: the shortest shard decides.
    rows = int(hvd.allreduce(jnp.asarray(len(x_train)), op=hvd.Min, name="shard_rows"))
    steps = rows // args.batch_size
    order = np.random.default_rng(args.seed + hvd.rank())
    for epoch in range(args.epochs):
        perm = order.permutation(len(x_train))
        for step in range(steps):
            batch = perm[step * args.batch_size:(step + 1) * args.batch_size]
            grads = grad(params, x_train[batch], y_train[batch])
            updates, state = optimizer.update(grads, state, params)
            params = optax.apply_updates(params, updates)
        if hvd.rank() == 0 and (epoch + 1) % 10 == 0:
            print(f"epoch {epoch + 1}: train loss {float(loss(params, x_train, y_train)):.4f}",
                  flush=True)
    correct = float(jnp.mean(jnp.argmax(logits(params, x_test), -1) == y_test))
    accuracy = float(hvd.allreduce(jnp.asarray(correct), name="test_accuracy"))
    if hvd.rank() == 0:
        print(f"test accuracy: {accuracy:.4f}", flush=True)
        print(f"ranks: {hvd.size()}, wall time: {time.perf_counter() - _STARTED:.1f} s",
              flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
