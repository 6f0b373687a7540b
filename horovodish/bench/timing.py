"""Timing that every rank agrees on, and contenders timed in alternating rounds."""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

from mpi4py import MPI

Contender = Callable[[], None]
# Every timing's budget is multiplied by this (--budget-scale): a smoke run of the whole
# bench, as its test makes, needs its code paths, not its figures.
_budget_scale = 1.0


def scale_budgets(factor: float) -> None:
    """Multiply every later timing's budget by factor (1.0: the figures the docs show)."""
    global _budget_scale
    if factor <= 0:
        raise ValueError(f"a budget scale must be positive, not {factor}")
    _budget_scale = factor


def time_per_call(fn: Contender, comm: MPI.Comm, budget: float = 0.6, min_iters: int = 5,
                  max_iters: int = 2000) -> float:
    """Seconds per call: the slowest rank's mean over an adaptive number of iterations."""
    import time
    budget *= _budget_scale
    for _ in range(3):
        fn()
    comm.Barrier()
    start = time.perf_counter()
    fn()
    estimate = max(time.perf_counter() - start, 1e-6)
    iters = int(comm.allreduce(min(max_iters, max(min_iters, int(budget / estimate))), MPI.MIN))
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    elapsed = (time.perf_counter() - start) / iters
    return comm.allreduce(elapsed, MPI.MAX)


def alternating(fns: dict[str, Contender], comm: MPI.Comm, rounds: int = 3,
                budget: float = 0.2,
                around: dict[str, Callable[[], ContextManager]] | None = None
                ) -> dict[str, list[float]]:
    """Seconds per call of each contender in each round; every contender is timed in
    every round, back to back, so that a slow spell of a shared machine (MPICH's own
    allreduce swings several-fold on small VMs: docs/tuning.md) hits both sides of a
    ratio. ``around`` gives a contender a context to be timed in (a timeline, say)."""
    around = around or {}
    times: dict[str, list[float]] = {key: [] for key in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            with around.get(key, contextlib.nullcontext)():
                times[key].append(time_per_call(fn, comm, budget))
    return times


def busbw(nbytes: int, seconds: float, size: int) -> float:
    """Bus bandwidth (NCCL's convention): what each rank's link carries per second."""
    algbw = nbytes / seconds
    return algbw * (2 * (size - 1) / size if size > 1 else 1.0)
