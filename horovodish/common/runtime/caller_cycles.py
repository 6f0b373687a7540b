"""A caller blocked on a handle runs the runtime's cycles on its own thread.

Mixed into ``Runtime`` (thread.py), whose state it shares: the cycle steps, the driver
lock that keeps a rank's cycles one sequence, and the hand-over slot through which a
caller gives a negotiation a late peer holds up to the runtime thread. Running a cycle
where the caller already is saves the two thread hand-offs of every cycle (a small
allreduce's latency nearly halves: docs/tuning.md).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Generator

from . import interrupts
from ..handles import Handle
from ..negotiation.controller import CycleResult
from ..negotiation.transport import Pending
from ..peer_wait import PeersNotAnswering

log = logging.getLogger("horovodish")

# How long a caller running a cycle itself waits on the other ranks' negotiation before
# handing it to the runtime thread: a burst's ranks are a few hundred us apart.
_CALLER_WAIT = 2e-3

CycleSteps = Generator[Pending, None, CycleResult]


class CallerCycles:
    """The caller-driven half of the runtime's cycles (see the module's docstring)."""

    # Runtime's, read and written here under its lock.
    _lock: threading.Lock
    _driver: threading.Lock
    _alarm: Any
    _queue: list
    _stopped: bool
    _callers_driving: int
    _handed_over: tuple[CycleSteps, Pending] | None
    _caller_cycle_s: float
    caller_runs: bool
    caller_cycles: int
    handovers: int
    controller: Any
    timeline: Any

    def _drive_while_waiting(self, handle: Handle, timeout: float | None) -> None:
        """A caller blocks on handle: run cycles on its thread while the runtime thread
        is not running one. That saves the two thread hand-offs of every cycle (a small
        allreduce's latency nearly halves: docs/tuning.md). When the thread is busy, or a negotiation is not
        done within _CALLER_WAIT (a peer is late), the caller leaves it to the thread
        and blocks as before. On the main thread, Ctrl-C is held back while it drives,
        until the cycle it is in is done or handed over (interrupts.py); with other
        Python signal handlers installed, the main thread leaves the cycles to the
        runtime thread."""
        if not self.caller_runs or self.timeline is not None:
            self.wake_thread()  # (a timeline's file writes would hold up the caller)
            return
        on_main = threading.get_ident() == interrupts.MAIN_THREAD
        if on_main and not interrupts.safe_to_drive():
            self.wake_thread()  # a handler of the application's own could strike mid-cycle
            return
        if on_main:
            # Held back for as long as this caller drives, not per cycle: raised between
            # cycles, a Ctrl-C could land in the bookkeeping around them (a lock's
            # acquire runs signal handlers while it blocks) and leave this caller
            # counted as driving for good, which keeps the thread off queued work.
            # _drive_until stops at the next cycle boundary once one is held back. The
            # depth changes inline (see interrupts.depth).
            interrupts.depth += 1
        try:
            with self._lock:
                self._callers_driving += 1  # the thread stays out of the way meanwhile
            try:
                self._drive_until(handle, timeout, on_main)
            finally:
                with self._lock:
                    self._callers_driving -= 1
                    if self._queue or self.controller.has_pending:
                        # Work left behind (another thread's, or other ranks' late) is
                        # the thread's again, from its cycle time on.
                        self._alarm.set(self._next_due(time.monotonic()))
        finally:
            if on_main:
                interrupts.depth -= 1
                interrupts.raise_held_back()  # a Ctrl-C held back meanwhile goes off here

    def _drive_until(self, handle: Handle, timeout: float | None, on_main: bool) -> None:
        deadline = None if timeout is None else time.perf_counter() + timeout
        while not handle._done and not self._stopped:
            if deadline is not None and time.perf_counter() > deadline:
                return
            if on_main and interrupts.held_back():
                return  # a Ctrl-C waits: no further cycle on this thread
            if not self._driver.acquire(blocking=False):
                self.wake_thread()  # the thread is driving: let it go on at once
                return
            try:
                if self._stopped or not self._caller_cycle():
                    return
            except BaseException as exc:  # fail what is pending, like the thread would
                if not isinstance(exc, PeersNotAnswering):  # (a stall: _fail says it)
                    log.exception("horovodish cycle on a caller's thread failed")
                self._fail(exc)
                if not isinstance(exc, Exception):
                    raise
                return
            finally:
                self._driver.release()

    def _caller_cycle(self) -> bool:
        """One cycle on a caller's thread; False if it was handed to the runtime thread.
        A negotiation handed over earlier and not yet finished comes first: a rank's
        cycles must follow one another."""
        with self._lock:
            handed, self._handed_over = self._handed_over, None
        start = time.monotonic()
        if handed is not None:
            steps, pending = handed
        else:
            steps, pending = self._start_cycle(by_caller=True)
            self.caller_cycles += 1
        # Still inside the critical section: a Ctrl-C meanwhile goes off once this wait
        # (at most _CALLER_WAIT) and the hand-over or the cycle are done. (Leaving the
        # section around the wait raced: a signal handled as enter() began raised
        # before the count went back up, unbalancing it.)
        done = pending.wait(time.monotonic() + _CALLER_WAIT)  # (if it raises, _end)
        if not done:
            self._hand_over(steps, pending)
            self.wake_thread()
            return False
        self._finish_cycle(steps)
        self._caller_cycle_s = time.monotonic() - start
        return True

    def _hand_over(self, steps: CycleSteps, pending: Pending) -> None:
        self.handovers += 1
        with self._lock:
            self._handed_over = (steps, pending)
            self._alarm.wake_by(0.0)
