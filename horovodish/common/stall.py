"""Stall inspector: names the tensors some ranks submitted and others did not.

Runs on the coordinator, which sees every uncached request. (Ranks send a request that
has waited on the cache fast path for half the check time to the coordinator, so cached
tensors are covered too.)
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Mapping, Sequence

from .messages import RequestType

log = logging.getLogger("horovodish")

# The op prefixes of Horovod's torch names ("allreduce.loss", "grouped_allgather.x_1of2").
_OPS = frozenset(prefix + kind.opname for kind in RequestType for prefix in ("", "grouped_"))


def _op_and_base(name: str) -> tuple[str, str] | None:
    """("allreduce", "loss") for "allreduce.loss"; None for a name without an op prefix."""
    op, dot, base = name.partition(".")
    return (op, base) if dot and op in _OPS else None


class StallInspector:
    def __init__(self, size: int, check_time: float, shutdown_time: float,
                 clock: Callable[[], float] = time.monotonic,
                 world_ranks: Sequence[int] | None = None) -> None:
        self.size = size
        # The report names world ranks: inside a process set, set rank i is world_ranks[i].
        self.world_ranks = list(world_ranks) if world_ranks is not None else list(range(size))
        self.check_time = check_time
        self.shutdown_time = shutdown_time
        self.clock = clock
        self._first_seen: dict[str, float] = {}
        self._last_warning = 0.0
        self.last_report: str = ""
        if 0 < shutdown_time < check_time:
            # A stall is only known once it is check_time old (cached tensors reach the
            # coordinator after half of it): say so rather than stretch it silently.
            log.warning("the stall shutdown time (%g s) is shorter than the stall check "
                        "time (%g s): a stalled job shuts down when the stall is first "
                        "reported, after %g s", shutdown_time, check_time, check_time)

    def seen(self, name: str) -> None:
        self._first_seen.setdefault(name, self.clock())

    def done(self, name: str) -> None:
        self._first_seen.pop(name, None)

    def check(self, waiting: Mapping[str, set[int]], joined: set[int]) -> bool:
        """Log stalled tensors (at most once per check period); True means shut down."""
        if not waiting:
            return False
        now = self.clock()
        # Ages first, by name: the ranks of a name are built only for the stalled ones.
        stalled = {name: waiting[name] for name in waiting
                   if now - self._first_seen.get(name, now) >= self.check_time}
        if not stalled:
            return False
        if now - self._last_warning >= self.check_time:
            self._last_warning = now
            self.last_report = self.report(stalled, joined)
            log.warning("%s", self.last_report)
        if self.shutdown_time > 0:
            oldest = min(self._first_seen.get(name, now) for name in stalled)
            if now - oldest >= self.shutdown_time:
                self.last_report = self.report(stalled, joined)
                return True
        return False

    def report(self, stalled: Mapping[str, set[int]], joined: set[int]) -> str:
        missing: dict[int, list[str]] = {}
        for name, ready in stalled.items():
            for rank in range(self.size):
                if rank not in ready and rank not in joined:
                    missing.setdefault(rank, []).append(name)
        lines = [
            f"Stall: some ranks submitted tensors more than {self.check_time:g} s ago that "
            "other ranks have not submitted. Check that every rank calls the same "
            "collectives with the same names:"
        ]
        for rank in sorted(missing):
            lines.append(f"  rank {self.world_ranks[rank]} has not submitted: "
                         f"{', '.join(sorted(missing[rank]))}")
        lines += self._different_ops(stalled)
        return "\n".join(lines)

    def _different_ops(self, stalled: Mapping[str, set[int]]) -> list[str]:
        """A line for each name that waits under different ops on different ranks
        (torch names a tensor "<op>.<name>", as Horovod does, so an allreduce on one
        rank and an allgather on another under one name never meet): the likely cause."""
        by_base: dict[str, dict[str, set[int]]] = {}
        for name, ready in stalled.items():
            parsed = _op_and_base(name)
            if parsed is not None:
                by_base.setdefault(parsed[1], {})[parsed[0]] = ready
        lines = []
        for base, ops in sorted(by_base.items()):
            if len(ops) < 2:
                continue
            parts = "; ".join(
                f"{op} on rank{'s' if len(ready) > 1 else ''} "
                f"{', '.join(str(self.world_ranks[r]) for r in sorted(ready))}"
                for op, ready in sorted(ops.items()))
            lines.append(f"  '{base}' waits as different collectives ({parts}): every rank "
                         "must call the same collective under a name.")
        return lines
