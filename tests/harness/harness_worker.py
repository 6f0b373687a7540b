"""A worker for the harness's own test: rank 1 fails one check, then the rest still run."""
from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from worker_support import check, close, expect_error, run_checks, same_on_every_rank  # noqa: E402


def agrees(rank: int, size: int) -> None:
    same_on_every_rank(np.arange(4), "a range")
    expect_error(lambda: int("x"), ValueError, "invalid literal", what="int('x')")


def differs_on_rank_1(rank: int, size: int) -> None:
    close(np.array([1.0, 2.0]), np.array([1.0, 2.0 + rank]), "second value")
    check(True, "this one holds")


def raises_on_rank_0(rank: int, size: int) -> None:
    if rank == 0:
        raise RuntimeError("boom")


def last(rank: int, size: int) -> None:
    check(MPI.COMM_WORLD.allreduce(1) == size, "allreduce of ones")


if __name__ == "__main__":
    which = sys.argv[1]
    checks = [agrees, last] if which == "pass" else [agrees, differs_on_rank_1,
                                                     raises_on_rank_0, last]
    run_checks(checks, MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
