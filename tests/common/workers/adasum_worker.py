"""Adasum allreduce against its formula computed independently in numpy."""
from __future__ import annotations


import numpy as np

from worker_support import close, expect_error, run_checks  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import collectives  # noqa: E402
from horovodish.common.messages import ReduceOp  # noqa: E402


def formula(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    dot = a @ b
    return (1 - dot / (2 * (a @ a))) * a + (1 - dot / (2 * (b @ b))) * b


def grads(rank: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed * 100 + rank).standard_normal(n)


def reference(size: int, n: int, seed: int) -> np.ndarray:
    level = [grads(r, n, seed) for r in range(size)]
    while len(level) > 1:
        level = [formula(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def rejects_a_non_power_of_two_world(rank: int, size: int) -> None:
    expect_error(lambda: collectives.allreduce_async(np.ones(3), np.ones(3), "bad",
                                                     ReduceOp.ADASUM),
                 ValueError, "power-of-two", what="Adasum on a non-power-of-two world")


def float_dtypes(rank: int, size: int) -> None:
    for dtype, tol in [(np.float64, 1e-12), (np.float32, 1e-5)]:
        g = grads(rank, 50, 1).astype(dtype)
        got = collectives.allreduce_async(g, np.empty_like(g), f"ada.{dtype.__name__}",
                                          ReduceOp.ADASUM).wait()
        close(got, reference(size, 50, 1), dtype.__name__, tol)


def grouped_per_tensor(rank: int, size: int) -> None:
    """The formula applies per tensor, not over the fused buffer."""
    tensors = [grads(rank, n, seed) for seed, n in [(2, 7), (3, 13), (4, 1)]]
    handles = collectives.grouped_allreduce_async(
        tensors, [np.empty_like(t) for t in tensors], ["g.a", "g.b", "g.c"], ReduceOp.ADASUM)
    for (seed, n), handle in zip([(2, 7), (3, 13), (4, 1)], handles):
        close(handle.wait(), reference(size, n, seed), f"grouped tensor of {n}", 1e-5,
              atol=1e-12)


def parallel_average_orthogonal_add(rank: int, size: int) -> None:
    same = collectives.allreduce_async(np.ones(4), np.empty(4), "parallel", ReduceOp.ADASUM).wait()
    close(same, np.ones(4), "parallel gradients", 1e-5, atol=1e-8)
    if size == 2:
        basis = np.eye(2)[rank]
        got = collectives.allreduce_async(basis, np.empty(2), "orthogonal", ReduceOp.ADASUM).wait()
        close(got, [1.0, 1.0], "orthogonal gradients", 1e-5, atol=1e-8)


def rejects_integers(rank: int, size: int) -> None:
    expect_error(lambda: collectives.allreduce_async(np.ones(2, np.int32), np.ones(2, np.int32),
                                                     "int", ReduceOp.ADASUM),
                 TypeError, "floating", what="Adasum on integers")


POWER_OF_TWO_CHECKS = [float_dtypes, grouped_per_tensor, parallel_average_orthogonal_add,
                       rejects_integers]
OTHER_CHECKS = [rejects_a_non_power_of_two_world]

if __name__ == "__main__":
    api.init()
    run_checks(OTHER_CHECKS if api.size() & (api.size() - 1) else POWER_OF_TWO_CHECKS,
               api.rank(), api.size())
