"""Adasum allreduce against its formula computed independently in numpy."""
from __future__ import annotations

import sys

import numpy as np

from horovodish.common import api
from horovodish.common.api import collectives
from horovodish.common.messages import ReduceOp


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


def main() -> None:
    api.init()
    rank, size = api.rank(), api.size()
    if size & (size - 1):
        try:
            collectives.allreduce_async(np.ones(3), np.ones(3), "bad", ReduceOp.ADASUM)
        except ValueError as exc:
            assert "power-of-two" in str(exc)
            sys.stdout.write(f"OK rank {rank}\n")
            return
        raise AssertionError("Adasum on a non-power-of-two world must raise")
    for dtype, tol in [(np.float64, 1e-12), (np.float32, 1e-5)]:
        g = grads(rank, 50, 1).astype(dtype)
        got = collectives.allreduce_async(g, np.empty_like(g), f"ada.{dtype.__name__}",
                                          ReduceOp.ADASUM).wait()
        assert np.allclose(got, reference(size, 50, 1), rtol=tol, atol=tol), (got, dtype)
    # grouped: the formula applies per tensor, not over the fused buffer
    tensors = [grads(rank, n, seed) for seed, n in [(2, 7), (3, 13), (4, 1)]]
    handles = collectives.grouped_allreduce_async(
        tensors, [np.empty_like(t) for t in tensors], ["g.a", "g.b", "g.c"], ReduceOp.ADASUM)
    for (seed, n), handle in zip([(2, 7), (3, 13), (4, 1)], handles):
        assert np.allclose(handle.wait(), reference(size, n, seed), atol=1e-12)
    # parallel gradients average; orthogonal ones add
    same = collectives.allreduce_async(np.ones(4), np.empty(4), "parallel", ReduceOp.ADASUM).wait()
    assert np.allclose(same, np.ones(4))
    if size == 2:
        basis = np.eye(2)[rank]
        got = collectives.allreduce_async(basis, np.empty(2), "orthogonal", ReduceOp.ADASUM).wait()
        assert np.allclose(got, [1.0, 1.0])
    try:
        collectives.allreduce_async(np.ones(2, np.int32), np.ones(2, np.int32), "int",
                                    ReduceOp.ADASUM)
        raise AssertionError("Adasum on integers must raise")
    except TypeError as exc:
        assert "floating" in str(exc)
    sys.stdout.write(f"OK rank {rank}\n")


if __name__ == "__main__":
    main()
