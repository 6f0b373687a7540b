"""A JAX elastic job under ``horovodishrun --min-np``: JaxState, hvd.elastic.run and
DistributedOptimizer (SGD with momentum) on softmax regression over the digits, in
float64 (x64 on).

    elastic_job_worker.py LOG_DIR VICTIM

In the first generation rank VICTIM SIGKILLs itself after batch 12 of epoch 0 (commits
every 5 batches, so batches 11 and 12 are rolled back). Each step is a global batch of
GLOBAL samples in a fixed order per epoch, each rank taking an equal share, so the
schedule does not depend on the number of ranks: the test replays it in numpy. Logs to
LOG_DIR/g<generation>-r0.jsonl (rank 0): ``resume``, ``step`` and ``commit`` (epoch,
batch, commit number); the first generation's rank 0 writes initial.npz, the last's
final.npz.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from worker_support import check, run_checks, same_on_every_rank  # noqa: E402

import horovodish.jax as hvd  # noqa: E402
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


def initial_params() -> dict:
    gen = np.random.default_rng(3)
    return {"w": gen.normal(scale=0.1, size=(64, 10)), "b": np.zeros(10)}


def loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    logits = x @ params["w"] + params["b"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def main() -> None:
    log_dir, victim = Path(sys.argv[1]), int(sys.argv[2])
    hvd.init()
    rank, size, generation = hvd.rank(), hvd.size(), launcher_link.generation()
    log_file = open(log_dir / f"g{generation}-r{rank}.jsonl", "a", buffering=1)

    def log(**record) -> None:
        if rank == 0:
            log_file.write(json.dumps({"generation": generation, **record}) + "\n")

    x, y = digits()
    steps = steps_per_epoch(len(x))
    if generation == 1 and rank == 0:
        np.savez(log_dir / "initial.npz", **initial_params())
    # Every rank starts elsewhere; the first sync gives them rank 0's (or the commit's).
    params = jax.tree_util.tree_map(lambda p: jnp.asarray(p + rank), initial_params())
    optimizer = hvd.DistributedOptimizer(optax.sgd(LR, momentum=MOMENTUM))
    state = hvd.elastic.JaxState(params=params, opt_state=optimizer.init(params),
                                 epoch=0, batch=0)
    grad = jax.jit(jax.grad(loss))

    @hvd.elastic.run
    def train(state: hvd.elastic.JaxState) -> None:
        log(kind="resume", epoch=state.epoch, batch=state.batch, seq=state._commit_seq,
            size=size)
        while state.epoch < EPOCHS:
            while state.batch < steps:
                share = np.array_split(global_batch(state.epoch, state.batch, len(x)),
                                       size)[rank]
                grads = grad(state.params, jnp.asarray(x[share]), jnp.asarray(y[share]))
                updates, state.opt_state = optimizer.update(grads, state.opt_state,
                                                            state.params)
                state.params = optax.apply_updates(state.params, updates)
                state.batch += 1
                log(kind="step", epoch=state.epoch, batch=state.batch)
                if state.batch % COMMIT_EVERY == 0:
                    state.commit()
                    log(kind="commit", epoch=state.epoch, batch=state.batch,
                        seq=state._commit_seq)
                if generation == 1 and rank == victim and \
                        (state.epoch, state.batch) == (0, 12):
                    os.kill(os.getpid(), signal.SIGKILL)
            state.epoch, state.batch = state.epoch + 1, 0
            state.commit()
            log(kind="commit", epoch=state.epoch, batch=state.batch, seq=state._commit_seq)

    train(state)
    if rank == 0:
        np.savez(log_dir / "final.npz", **jax.tree_util.tree_map(np.asarray, state.params))

    def same_model_everywhere(rank: int, size: int) -> None:
        for key, value in state.params.items():
            check(value.dtype == jnp.float64, f"{key}: {value.dtype}, not float64")
            same_on_every_rank(np.asarray(value), key)

    run_checks([same_model_everywhere], rank, size)


if __name__ == "__main__":
    main()
