"""Functions that Ray's and Spark's workers run (importable there: tests/ is on the
PYTHONPATH every test process and its children get), and the references a driver
checks their results against: numpy on every rank's inputs, or one process on the
whole batch."""
from __future__ import annotations

import runpy
import socket
import sys
from pathlib import Path

import numpy as np

FEATURES, PER_RANK, STEPS, LR = 8, 4, 3, 0.1
ELASTIC_WORKER = Path(__file__).parent / "torch" / "workers" / "elastic_digits_worker.py"


def contribution(rank: int, count: int = 11) -> np.ndarray:
    return np.random.default_rng(100 + rank).integers(-5, 6, count).astype(np.float32)


def collectives() -> dict:
    """This rank's place and the torch collectives' results (hvd.init() inside)."""
    import torch

    import horovodish.torch as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    mine = torch.from_numpy(contribution(rank))
    return {"rank": rank, "size": size, "host": socket.gethostname(),
            "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
            "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
            "allreduce": hvd.allreduce(mine, op=hvd.Sum).numpy(),
            "allgather": hvd.allgather(torch.full((rank + 1, 2), float(rank))).numpy(),
            "broadcast": hvd.broadcast(mine, root_rank=size - 1).numpy()}


def collective_problems(results: list[dict]) -> list[str]:
    """What differs from numpy in every rank's ``collectives()`` (results in rank order)."""
    size = len(results)
    want_sum = sum(contribution(r) for r in range(size))
    want_gather = np.concatenate([np.full((r + 1, 2), float(r)) for r in range(size)])
    problems = []
    for rank, got in enumerate(results):
        if (got["rank"], got["size"]) != (rank, size):
            problems.append(f"rank {rank}: says it is rank {got['rank']} of {got['size']}")
        if not np.array_equal(got["allreduce"], want_sum):
            problems.append(f"rank {rank}: allreduce {got['allreduce']}, want {want_sum}")
        if not np.array_equal(got["allgather"], want_gather):
            problems.append(f"rank {rank}: allgather {got['allgather'].tolist()}")
        if not np.array_equal(got["broadcast"], contribution(size - 1)):
            problems.append(f"rank {rank}: broadcast {got['broadcast']}")
    return problems


def batch(step: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7 + step)
    x = rng.standard_normal((PER_RANK * size, FEATURES))
    return x, x @ np.arange(1.0, FEATURES + 1) + 0.5


def initial_weights() -> np.ndarray:
    return np.linspace(-1.0, 1.0, FEATURES)


def reference_weights(size: int) -> np.ndarray:
    """SGD on the mean squared error of the whole batch, in one process."""
    w = initial_weights()
    for step in range(STEPS):
        x, y = batch(step, size)
        w = w - LR * 2.0 / len(x) * x.T @ (x @ w - y)
    return w


def torch_training() -> np.ndarray:
    """DistributedOptimizer on this rank's part of each batch; the final weights."""
    import torch

    import horovodish.torch as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    weights = torch.nn.Parameter(torch.from_numpy(initial_weights()))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD([weights], lr=LR),
                                         named_parameters=[("w", weights)])
    for step in range(STEPS):
        x, y = (torch.from_numpy(a[rank * PER_RANK:(rank + 1) * PER_RANK])
                for a in batch(step, size))
        optimizer.zero_grad()
        ((x @ weights - y) ** 2).mean().backward()
        optimizer.step()
    return weights.detach().numpy()


def collectives_and_training() -> tuple[dict, np.ndarray]:
    return collectives(), torch_training()


def tensorflow_training() -> np.ndarray:
    """DistributedGradientTape on this rank's part of each batch; the final weights."""
    import tensorflow as tf

    import horovodish.tensorflow as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    weights = tf.Variable(initial_weights())
    for step in range(STEPS):
        x, y = (tf.constant(a[rank * PER_RANK:(rank + 1) * PER_RANK])
                for a in batch(step, size))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.linalg.matvec(x, weights) - y) ** 2)
        tape = hvd.DistributedGradientTape(tape)
        weights.assign_sub(LR * tape.gradient(loss, weights))
    return weights.numpy()


def raise_on(rank_to_fail: int) -> int:
    import horovodish.torch as hvd
    hvd.init()
    if hvd.rank() == rank_to_fail:
        raise ValueError(f"rank {rank_to_fail} failed on purpose")
    hvd.barrier()
    return hvd.rank()


def elastic_digits(log_dir: str, *flags: str) -> str:
    """tests/torch/workers/elastic_digits_worker.py as a function, with its flags
    (``--kill 1 12``: rank 1 SIGKILLs itself after step 12 of the first generation);
    the tests read its logs."""
    sys.argv = [str(ELASTIC_WORKER), log_dir, *flags]
    runpy.run_path(str(ELASTIC_WORKER), run_name="__main__")
    return "done"


def horovod_style() -> tuple[int, int, list[float]]:
    """A function as a Horovod script writes it (``import horovod.torch``: the compat
    alias must be on the ranks' PYTHONPATH)."""
    import torch

    import horovod.torch as hvd
    hvd.init()
    return hvd.rank(), hvd.size(), hvd.allreduce(torch.ones(2) * (hvd.rank() + 1),
                                                 op=hvd.Sum).tolist()


def gpu_slot_training() -> tuple[str | None, tuple, np.ndarray]:
    """A worker of a job that asked for GPUs (logical ones, on a CPU machine): the
    device it was given, a Horovod-style collective and the training run."""
    import os
    return os.environ.get("CUDA_VISIBLE_DEVICES"), horovod_style(), torch_training()
