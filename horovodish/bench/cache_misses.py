"""How often real workloads leave the response cache: slow-path cycles per step.

A slow-path cycle is a gather at rank 0 and a broadcast back (docs/scaling.md): cheap on
2 ranks, the cost that grows with the job at thousands. Counted here, per step, on the
job's own ranks through the calls users make:

- ``DistributedOptimizer`` training an MLP (its first steps negotiate every gradient);
- the same model skipping its third layer on odd steps (that gradient then is absent);
- ``allgather`` of a batch whose first dimension differs by rank and changes each step;
- ``alltoall`` with splits that change each step.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

STEPS = 8


def _slow_cycles(counter: str = "slow_cycles") -> Callable[[], int]:
    from ..common.api.process_sets import global_process_set
    controller = global_process_set.runtime.controller
    return lambda: getattr(controller, counter)


def _per_step(step: Callable[[int], None]) -> list[int]:
    slow = _slow_cycles()
    counts = []
    for index in range(STEPS):
        before = slow()
        step(index)
        counts.append(slow() - before)
    return counts


def cache_misses(rank: int, size: int) -> dict[str, Any]:
    """Slow-path cycles in each of STEPS steps, per workload (collective: every rank)."""
    import torch

    from .. import torch as hvd

    torch.manual_seed(0)
    layers = torch.nn.ModuleList([torch.nn.Linear(32, 32) for _ in range(4)])
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(layers.parameters(), lr=0.01),
        named_parameters=[(f"layers.{name}", p) for name, p in layers.named_parameters()])
    data = torch.randn(16, 32)

    def train(skip_on_odd_steps: bool) -> Callable[[int], None]:
        def step(index: int) -> None:
            out = data
            for number, layer in enumerate(layers):
                if not (skip_on_odd_steps and number == 2 and index % 2):
                    out = torch.relu(layer(out))
            optimizer.zero_grad()
            out.sum().backward()
            optimizer.step()
        return step

    def allgather(index: int) -> None:
        rows = 1 + (index * 3 + rank) % 5
        hvd.allgather(torch.full((rows, 4), float(rank)), name="bench.cache.batch")

    def alltoall(index: int) -> None:
        splits = [(index + rank + dest) % 3 for dest in range(size)]
        hvd.alltoall(torch.ones(sum(splits), 2), splits=torch.tensor(splits),
                     name="bench.cache.routed")

    figures = {"steps": STEPS,
               "distributed_optimizer": _per_step(train(False)),
               "skipping_a_layer_on_odd_steps": _per_step(train(True)),
               "allgather_first_dims_change": _per_step(allgather),
               "alltoall_splits_change": _per_step(alltoall)}
    figures["total_after_first_step"] = {
        name: int(np.sum(counts[1:])) for name, counts in figures.items()
        if isinstance(counts, list)}
    return figures


def miss_cost(comm: Any, calls: int = 40, rounds: int = 5) -> dict[str, float]:
    """What one cache miss costs a real job (collective: every rank): a synchronous
    4-byte ``hvd.allreduce`` under a new name each call (each one a slow-path cycle),
    against the same call under one name (a cache hit) and ``MPI_Allreduce`` of the
    same 4 bytes, in alternating rounds; the median per call of each, in us."""
    import time

    import torch

    from .. import torch as hvd

    tensor = torch.ones(1)
    raw_in, raw_out = np.ones(1, np.float32), np.empty(1, np.float32)
    slow = _slow_cycles()
    answered_alone = _slow_cycles("unanimous_cycles")
    with_data = _slow_cycles("speculated_cycles")

    def uncached(round_: int) -> None:
        for call in range(calls):
            hvd.allreduce(tensor, name=f"bench.miss.{round_}.{call}")

    def cached(round_: int) -> None:
        for _ in range(calls):
            hvd.allreduce(tensor, name="bench.miss.cached")

    def raw(round_: int) -> None:
        for _ in range(calls):
            comm.Allreduce(raw_in, raw_out)

    cached(-1)  # the cached name's own first (slow) cycle, not timed
    timings: dict[str, list[float]] = {"uncached": [], "cached": [], "mpi": []}
    misses = alone = data = 0
    for round_ in range(rounds):
        for name, run in (("uncached", uncached), ("cached", cached), ("mpi", raw)):
            comm.Barrier()
            before = (slow(), answered_alone(), with_data())
            start = time.perf_counter()
            run(round_)
            timings[name].append((time.perf_counter() - start) / calls * 1e6)
            if name == "uncached":
                misses += slow() - before[0]
                alone += answered_alone() - before[1]
                data += with_data() - before[2]
    figures = {f"{name}_us": float(np.median(values)) for name, values in timings.items()}
    figures["slow_cycles_per_uncached_call"] = misses / (rounds * calls)
    # Of those, answered by each rank alone (every rank sent the same list), and of
    # these, with their data in the same exchange (negotiation/controller.py).
    figures["unanimous_share"] = alone / max(misses, 1)
    figures["with_data_share"] = data / max(misses, 1)
    return figures
