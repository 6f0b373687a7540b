"""Waiting for peers with patience: a rank that takes no part in a meeting at all.

A rank stopped by SIGSTOP, frozen or starved of CPU runs no cycle, so the stall
inspector, which reads what cycles report, never hears of it, and mpirun's SIGTERM does
not end a stopped process. The ranks waiting for it (in negotiation's exchange, or in a
shared-memory backend's barrier) name it after the stall check time and, with a stall
shutdown time, end the job: the runtime catches ``PeersNotAnswering``, kills the named
ranks of its own host and ends the job as a stall shutdown does (runtime/thread.py).
"""
from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Callable, Sequence

log = logging.getLogger("horovodish")


@dataclass(frozen=True)
class Patience:
    """warn_after: seconds before a warning names the ranks waited for (the stall check
    time); end_after: seconds before the job ends (the stall shutdown time; 0: never)."""
    warn_after: float
    end_after: float


class PeersNotAnswering(Exception):
    """A meeting waited past the stall shutdown time for ranks that never came."""

    def __init__(self, message: str, pids: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.pids = list(pids)

    def end_local_ranks(self) -> None:
        """SIGKILL those ranks (on this host): a stopped process ignores the SIGTERM with
        which mpirun ends a job's ranks, and the job would wait for it for good."""
        for pid in self.pids:
            log.error("ending pid %d, a rank that does not answer", pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass  # gone already


def not_answering(ranks: Sequence[int] | None, where: str, waited: float) -> str:
    who = (f"rank {', '.join(map(str, ranks))}" if ranks
           else "a rank (the exchange cannot tell which)")
    return (f"{who} has taken no part in {where} for {waited:.0f} s: stopped, frozen or "
            "starved of CPU (a rank that only computes still takes part)")


def wait_patiently(done: Callable[[], bool], patience: Patience, rank: int,
                   missing: Callable[[], list[tuple[int, int]] | None], where: str) -> None:
    """Call done() (a wait of at most a second or so, False if not done yet) until it
    says True; warn after patience.warn_after seconds, naming missing() (pairs of the
    world rank and its process id on this host), and raise PeersNotAnswering after
    patience.end_after (when above 0)."""
    start, warned = time.monotonic(), False
    while not done():
        waited = time.monotonic() - start
        if not warned and waited >= patience.warn_after:
            warned = True
            names = missing()
            log.warning("[rank %d] %s", rank, not_answering(
                [r for r, _ in names] if names else None, where, waited))
        if patience.end_after > 0 and waited >= max(patience.end_after, patience.warn_after):
            names = missing()
            raise PeersNotAnswering(
                not_answering([r for r, _ in names] if names else None, where, waited),
                [pid for _, pid in names or ()])
