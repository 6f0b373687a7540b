"""A worker for the harness's own test. pass: every check passes; fail: rank 1 fails one
check and rank 0 raises in another, then the rest still run; hang: rank 0 raises while
the others wait for it in an allreduce, which only ending the job frees."""
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


def raises_while_the_others_reduce(rank: int, size: int) -> None:
    if rank == 0:
        raise RuntimeError("deliberate failure while the others reduce")
    MPI.COMM_WORLD.allreduce(1)  # waits for rank 0 for ever


def last(rank: int, size: int) -> None:
    check(MPI.COMM_WORLD.allreduce(1) == size, "allreduce of ones")


if __name__ == "__main__":
    checks = {"pass": [agrees, last],
              "fail": [agrees, differs_on_rank_1, raises_on_rank_0, last],
              "hang": [agrees, raises_while_the_others_reduce, last]}[sys.argv[1]]
    run_checks(checks, MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
