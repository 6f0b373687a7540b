"""The runtime thread: one per process, started by init().

Each cycle it drains the submit queue, negotiates (controller.py), plans fusion
(fusion.py) and executes (executor.py). Pacing:
  * with work pending, cycles are at most one cycle time apart, and a caller blocking in
    synchronize() starts the next one at once (nothing more is coming from it);
  * with nothing pending it still takes part in negotiation every _IDLE_WAIT, so that
    a peer with work this rank will never submit (a stall), a shutdown or a stall
    report still gets through; a submit wakes it at once, which is what serves peers
    in normal operation. Idle cycles cost the training thread: in a 22 ms training
    step, backing off from 1 ms (four idle cycles a step) cost 5-15% of the step rate
    against one cycle every 20 ms (docs/tuning.md).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from .controller import Controller
from .entry import Entry
from .errors import HorovodInternalError
from .executor import Executor
from .fusion import FusionPlanner
from .handles import Completions
from .autotune import Autotuner
from .messages import RequestType
from .timeline import Timeline

log = logging.getLogger("horovodish")

_IDLE_WAIT = 0.02
_BUSY_POLL = 1e-3  # longest sleep between polls of a negotiation while work is pending
_IDLE_POLL = 5e-3  # ... and while idle


class Runtime:
    def __init__(self, controller: Controller, executor: Executor, fusion_threshold: int,
                 cycle_time_ms: float, stall_message: Callable[[], str] | None = None) -> None:
        self.controller = controller
        self.executor = executor
        self.fusion_threshold = fusion_threshold
        self.cycle_time = cycle_time_ms / 1000.0
        self.rank = controller.rank
        self._stall_message = stall_message
        self._lock = threading.Lock()  # taken directly on submit: a Condition's with costs more
        self._cv = threading.Condition(self._lock)
        self.completions = Completions(self.kick)
        self._queue: list[Entry] = []
        self._kicked = False
        self._idle_waiting = False
        self._shutdown_requested = False
        self._stopped = False
        self._stop_reason = ""
        self._in_flight: dict[str, Entry] = {}
        self._planner = FusionPlanner()
        self.cycles = 0
        self.timeline: Timeline | None = None
        self.autotuner: Autotuner | None = None  # rank 0 only
        self._thread = threading.Thread(target=self._run, name="horovodish-runtime", daemon=True)
        self._thread.start()

    # -- called from user threads ------------------------------------------------------
    def submit(self, entries: list[Entry]) -> None:
        """Enqueue entries atomically (a group negotiates in one cycle)."""
        with self._lock:
            if self._stopped:
                raise HorovodInternalError(
                    f"horovodish has been shut down{self._stop_reason}; cannot run "
                    f"{entries[0].request.type.opname} of '{entries[0].request.name}'.")
            in_flight = self._in_flight
            if len(entries) == 1:  # the common case, without building sets
                clash = entries[0].request.name in in_flight
            else:
                names = [e.request.name for e in entries]
                clash = len(set(names)) != len(names) or not in_flight.keys().isdisjoint(names)
            if clash:
                names = [e.request.name for e in entries]
                name = next(n for i, n in enumerate(names) if n in in_flight or n in names[:i])
                raise ValueError(
                    f"a collective on tensor name '{name}' is already in flight; names must "
                    "be unique among outstanding operations (pass a different name=).")
            for entry in entries:
                in_flight[entry.request.name] = entry
            self._queue.extend(entries)
            if self._idle_waiting:
                self._wake()

    def submit_one(self, entry: Entry) -> None:
        """submit([entry]), minus the group bookkeeping."""
        name = entry.request.name
        with self._lock:
            refused = self._stopped or name in self._in_flight
            if not refused:
                self._in_flight[name] = entry
                self._queue.append(entry)
                if self._idle_waiting:
                    self._wake()
        if refused:
            self.submit([entry])  # raises the error that says why

    def _wake(self) -> None:
        """Wake the idle thread (the lock is held). Once is enough: the woken thread
        needs the GIL, which the submitting thread keeps for the rest of its burst, so
        the flag would stay set and every further submit would pay a notify (0.2 us
        of a 1.35 us submit)."""
        self._idle_waiting = False
        self._cv.notify()

    def kick(self) -> None:
        """A caller is blocked on a handle: run the next cycle without waiting."""
        with self._cv:
            self._kicked = True
            self._cv.notify()

    def shutdown(self, timeout: float = 30.0) -> None:
        with self._cv:
            self._shutdown_requested = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def start_timeline(self, path: str, mark_cycles: bool = False) -> None:
        """Record a timeline from now on (rank 0 writes; other ranks ignore it)."""
        if self.rank != 0:
            return
        old, self.timeline = self.timeline, Timeline(path, mark_cycles)
        if old is not None:
            old.close()

    def stop_timeline(self) -> None:
        old, self.timeline = self.timeline, None
        if old is not None:
            old.close()

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def finished(self) -> bool:
        """The thread has exited: nothing uses its communicator any more."""
        return not self._thread.is_alive()

    # -- the thread --------------------------------------------------------------------
    def _run(self) -> None:
        reason = ""
        try:
            self._loop()
            reason = self._stop_reason
        except BaseException as exc:  # never die silently: fail what is pending
            log.exception("horovodish runtime thread failed")
            reason = f" after an internal error: {exc}"
        finally:
            if self.timeline is not None:
                self.timeline.close()
            with self._cv:
                self._stopped = True
                self._stop_reason = reason
                pending = list(self._in_flight.values()) + self._queue
                self._in_flight.clear()
                self._queue.clear()
            for entry in pending:
                entry.finish(error=HorovodInternalError(
                    f"horovodish was shut down{reason} while {entry.request.type.opname} of "
                    f"'{entry.request.name}' was in flight."))
            self.completions.notify()

    def _loop(self) -> None:
        last_start = 0.0
        while True:
            new_entries, shutdown = self._wait_for_work(last_start, _IDLE_WAIT)
            busy = bool(new_entries) or self.controller.has_pending
            transport = self.controller.transport
            if hasattr(transport, "max_sleep"):
                transport.max_sleep = _BUSY_POLL if busy else _IDLE_POLL
            last_start = time.perf_counter()
            timeline = self.timeline
            self.controller.timeline = self.executor.timeline = timeline
            if timeline is not None:
                timeline.cycle()
            result = self.controller.cycle([e.request for e in new_entries], shutdown)
            self.cycles += 1
            if result.responses:
                ready_at = time.perf_counter() * 1e6
                if timeline is not None:
                    for response in result.responses:
                        timeline.negotiate_end(response.name)
                groups = self._planner.plan(result.responses, self.fusion_threshold)
                with self._cv:  # this rank's entry per response (None: a joined rank's)
                    pop = self._in_flight.pop
                    entries = [[pop(r.name, None) for r in group] for group in groups]
                notify = self.completions.notify
                for group, mine in zip(groups, entries):
                    self.executor.execute(group, mine, ready_at)
                    notify()
            # (Finished entries have dropped their tensors, so holding this cycle's lists
            # until the next cycle keeps no caller's memory alive.)
            if timeline is not None:
                timeline.flush()
            if result.params is not None:
                self.fusion_threshold = result.params.fusion_threshold
                self.cycle_time = result.params.cycle_time_ms / 1000.0
            if self.autotuner is not None:
                reduced = sum(r.nbytes for r in result.responses
                              if r.type == RequestType.ALLREDUCE and r.error is None)
                choice = self.autotuner.record(reduced)
                if choice is not None:
                    self.controller.params_to_send = choice
            if result.shutdown:
                if result.stalled:
                    detail = self._stall_message() if self._stall_message else ""
                    self._stop_reason = (" by the stall inspector (some ranks never submitted "
                                         "a tensor the others did)" + (f": {detail}" if detail else ""))
                    self._end_job_after_grace()
                else:
                    if not shutdown:
                        ranks = ", ".join(map(str, result.shutdown_ranks)) or "?"
                        self._stop_reason = (f" because rank {ranks} shut down (its script "
                                             "ended, failed, or called shutdown())")
                    # Every rank's runtime ends in this same cycle: collective clean-up
                    # (the shared-memory window) is safe now.
                    self.executor.close()
                return

    def _end_job_after_grace(self, grace: float = 5.0) -> None:
        """A stall shutdown ends the job: pending handles fail now (so scripts can report
        and exit); a rank still running after the grace period is aborted, so no rank
        that never calls another collective can keep the job alive."""
        log.error("shutting down: %s", self._stop_reason.strip())

        def abort() -> None:
            from mpi4py import MPI
            log.error("aborting the job %g s after the stall shutdown", grace)
            MPI.COMM_WORLD.Abort(1)
        timer = threading.Timer(grace, abort)
        timer.daemon = True
        timer.start()

    def _wait_for_work(self, last_start: float, idle_wait: float) -> tuple[list[Entry], bool]:
        with self._cv:
            if not self._queue and not self.controller.has_pending:
                # Idle: wake on submit, or after idle_wait to take part in negotiation.
                self._idle_waiting = True
                self._cv.wait_for(lambda: self._queue or self._shutdown_requested, idle_wait)
                self._idle_waiting = False
                if self._queue:
                    last_start = time.perf_counter()  # batch from the first submit on
            deadline = last_start + self.cycle_time
            while not (self._kicked or self._shutdown_requested):
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                self._cv.wait(remaining)
            self._kicked = False
            entries, self._queue = self._queue, []
            return entries, self._shutdown_requested
