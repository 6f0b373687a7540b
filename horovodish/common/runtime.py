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

A caller that blocks on a handle runs the cycles itself while the thread is not running
one (``_help``): the thread stays for work nobody waits on yet, idle negotiation, and
negotiations a caller stopped waiting on. Either way a cycle runs under one lock, so the
cycles of a rank stay one sequence, as the other ranks' collectives need.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Generator

from . import interrupts
from .controller import Controller, CycleResult, Pending, finish_cycle
from .entry import Entry
from .errors import HorovodInternalError
from .executor import Executor
from .fusion import FusionPlanner
from .handles import Completions, Handle
from .autotune import Autotuner
from .messages import RequestType
from .timeline import Timeline

log = logging.getLogger("horovodish")

_IDLE_WAIT = 0.02
_BUSY_POLL = 1e-3  # longest sleep between polls of a negotiation while work is pending
_IDLE_POLL = 5e-3  # ... and while idle
# How long a caller running a cycle itself waits on the other ranks' negotiation before
# handing it to the runtime thread: a burst's ranks are a few hundred us apart.
_CALLER_WAIT = 2e-3
_RECHECK = 1e-3  # see _wait_for_work

CycleSteps = Generator[Pending, None, CycleResult]


class Runtime:
    def __init__(self, controller: Controller, executor: Executor, fusion_threshold: int,
                 cycle_time_ms: float, stall_message: Callable[[], str] | None = None,
                 caller_runs: bool = True) -> None:
        self.controller = controller
        self.executor = executor
        self.fusion_threshold = fusion_threshold
        self.cycle_time = cycle_time_ms / 1000.0
        self.rank = controller.rank
        self._stall_message = stall_message
        # Always entered directly (`with self._lock`): cheaper than the Condition's with,
        # and a C-level with cannot be torn by a Ctrl-C, leaving the lock held.
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self.completions = Completions(self._help)
        self.caller_runs = caller_runs
        self._driver = threading.Lock()  # held by whichever thread runs a cycle
        self._handed_over: tuple[CycleSteps, Pending] | None = None  # for the thread to finish
        self._last_cycle = 0.0  # when the last cycle ended, on either thread
        self._cycle_shutdown = False  # whether this rank asked to shut down in this cycle
        self._helping = 0  # callers running cycles now (see _help)
        self.caller_cycles = 0  # cycles run on callers' threads
        self.handovers = 0  # ... whose negotiation the runtime thread finished
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
        with self._lock:
            self._kicked = True
            self._cv.notify()

    def shutdown(self, timeout: float = 30.0) -> None:
        with self._lock:
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

    # -- cycles, on whichever thread drives --------------------------------------------
    def _start_cycle(self) -> tuple[CycleSteps, Pending]:
        """Take the queue and post its negotiation (the driver lock is held)."""
        with self._lock:
            entries, self._queue = self._queue, []
            shutdown = self._cycle_shutdown = self._shutdown_requested
        transport = self.controller.transport
        if hasattr(transport, "max_sleep"):
            busy = bool(entries) or self.controller.has_pending
            transport.max_sleep = _BUSY_POLL if busy else _IDLE_POLL
        timeline = self.timeline
        self.controller.timeline = self.executor.timeline = timeline
        if timeline is not None:
            timeline.cycle()
        steps = self.controller.cycle_steps([e.request for e in entries], shutdown)
        return steps, next(steps)

    def _finish_cycle(self, steps: CycleSteps) -> None:
        """The rest of a cycle whose negotiation is done: execute what every rank agreed
        on (the driver lock is held). A negotiated shutdown ends the runtime here."""
        result = finish_cycle(steps)
        self.cycles += 1
        timeline = self.timeline
        if result.responses:
            ready_at = time.perf_counter() * 1e6
            if timeline is not None:
                for response in result.responses:
                    timeline.negotiate_end(response.name)
            groups = self._planner.plan(result.responses, self.fusion_threshold)
            with self._lock:  # this rank's entry per response (None: a joined rank's)
                pop = self._in_flight.pop
                entries = [[pop(r.name, None) for r in group] for group in groups]
            notify = self.completions.notify
            for group, mine in zip(groups, entries):
                self.executor.execute(group, mine, ready_at)
                notify()
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
        self._last_cycle = time.perf_counter()
        if result.shutdown:
            if result.stalled:
                detail = self._stall_message() if self._stall_message else ""
                self._stop_reason = (" by the stall inspector (some ranks never submitted "
                                     "a tensor the others did)" + (f": {detail}" if detail else ""))
                self._end_job_after_grace()
            else:
                if not self._cycle_shutdown:  # another rank's shutdown, not ours
                    ranks = ", ".join(map(str, result.shutdown_ranks)) or "?"
                    self._stop_reason = (f" because rank {ranks} shut down (its script "
                                         "ended, failed, or called shutdown())")
                # Every rank's runtime ends in this same cycle: collective clean-up
                # (the shared-memory window) is safe now.
                self.executor.close()
            self._end(self._stop_reason)

    def _end(self, reason: str) -> None:
        """Stop for good: fail what is pending, wake the thread and every waiter. Once."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._stop_reason = reason
            pending = list(self._in_flight.values()) + self._queue
            self._in_flight.clear()
            self._queue.clear()
            self._handed_over = None
            self._cv.notify_all()
        if self.timeline is not None:
            self.timeline.close()
        for entry in pending:
            entry.finish(error=HorovodInternalError(
                f"horovodish was shut down{reason} while {entry.request.type.opname} of "
                f"'{entry.request.name}' was in flight."))
        self.completions.notify()

    # -- a blocked caller drives -------------------------------------------------------
    def _help(self, handle: Handle, timeout: float | None) -> None:
        """A caller blocks on handle: run cycles on its thread while the runtime thread
        is not running one. That saves the two thread hand-offs of every cycle (a 4 KiB
        allreduce: 59 against 34 us). When the thread is busy, or a negotiation is not
        done within _CALLER_WAIT (a peer is late), the caller leaves it to the thread
        and blocks as before. On the main thread, Ctrl-C is held back until the cycle
        is done or handed over (interrupts.py); with other Python signal handlers
        installed, the main thread leaves the cycles to the runtime thread."""
        if not self.caller_runs or self.timeline is not None:
            self.kick()  # (a timeline's file writes would hold up the caller)
            return
        on_main = threading.get_ident() == interrupts.MAIN_THREAD
        if on_main and not interrupts.safe_to_drive():
            self.kick()  # a handler of the application's own could strike mid-cycle
            return
        with self._lock:
            self._helping += 1  # the thread stays out of the way meanwhile
        try:
            self._drive_until(handle, timeout, on_main)
        finally:
            with self._lock:
                self._helping -= 1
                if self._queue or self.controller.has_pending:  # left for the thread
                    self._cv.notify()

    def _drive_until(self, handle: Handle, timeout: float | None, on_main: bool) -> None:
        deadline = None if timeout is None else time.perf_counter() + timeout
        while not handle._done and not self._stopped:
            if deadline is not None and time.perf_counter() > deadline:
                return
            if on_main:
                interrupts.enter()
            try:
                if not self._driver.acquire(blocking=False):
                    self.kick()  # the thread is driving: let it go on at once
                    return
                try:
                    if self._stopped or not self._caller_cycle():
                        return
                except BaseException as exc:  # fail what is pending, like the thread would
                    log.exception("horovodish cycle on a caller's thread failed")
                    self._end(f" after an internal error: {exc!r}")
                    if not isinstance(exc, Exception):
                        raise
                    return
                finally:
                    self._driver.release()
            finally:
                if on_main:
                    interrupts.leave()  # a Ctrl-C held back during the cycle goes off here

    def _caller_cycle(self) -> bool:
        """One cycle on a caller's thread; False if it was handed to the runtime thread.
        A negotiation handed over earlier and not yet finished comes first: a rank's
        cycles must follow one another."""
        with self._lock:
            handed, self._handed_over = self._handed_over, None
        if handed is not None:
            steps, pending = handed
        else:
            steps, pending = self._start_cycle()
            self.caller_cycles += 1
        # Still inside the critical section: a Ctrl-C meanwhile goes off once this wait
        # (at most _CALLER_WAIT) and the hand-over or the cycle are done. (Leaving the
        # section around the wait raced: a signal handled as enter() began raised
        # before the count went back up, unbalancing it.)
        done = pending.wait(time.perf_counter() + _CALLER_WAIT)  # (if it raises, _end)
        if not done:
            self._hand_over(steps, pending)
            self.kick()
            return False
        self._finish_cycle(steps)
        return True

    def _hand_over(self, steps: CycleSteps, pending: Pending) -> None:
        self.handovers += 1
        with self._lock:
            self._handed_over = (steps, pending)
            self._cv.notify()

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
            self._end(reason)

    def _loop(self) -> None:
        last_start = 0.0
        while not self._stopped:
            last_start = self._wait_for_work(last_start, _IDLE_WAIT)
            with self._driver:
                if self._stopped:
                    return
                with self._lock:
                    handed, self._handed_over = self._handed_over, None
                try:
                    if handed is not None:  # a caller stopped waiting on this negotiation
                        steps, pending = handed
                    elif self._shutdown_requested or not self._helping and (
                            self._queue or self.controller.has_pending or
                            time.perf_counter() - self._last_cycle >= _IDLE_WAIT):
                        last_start = time.perf_counter()
                        steps, pending = self._start_cycle()
                    else:
                        continue  # a caller runs the cycles, or ran them meanwhile
                    pending.wait()
                    self._finish_cycle(steps)
                except BaseException as exc:
                    # Stopped before the lock goes: no caller may start a cycle after
                    # one abandoned midway.
                    self._end(f" after an internal error: {exc}")
                    raise

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

    def _needed(self) -> bool:
        """Whether the thread has a cycle to run now (the lock is held). Work a helping
        caller will take is not the thread's."""
        if self._stopped or self._shutdown_requested or self._kicked or \
                self._handed_over is not None:
            return True
        return not self._helping and bool(self._queue or self.controller.has_pending)

    def _wait_for_work(self, last_start: float, idle_wait: float) -> float:
        """Until there is a cycle to run; returns when the batch started (its first
        submit), from which the cycle time counts."""
        with self._lock:
            if not self._needed():
                # Idle, or a caller runs the cycles: wake on submit, kick or hand-over,
                # or after idle_wait to take part in negotiation. Woken for work that a
                # caller then took, look again after a cycle time before asking to be
                # woken again: re-armed at once, every submit of a submit-and-wait loop
                # would wake this thread to fight the caller for the GIL (a 4 KiB
                # allreduce: 108 against 70 us), and never re-armed, work submitted
                # later but waited on only later would sit out the idle timeout.
                end = time.perf_counter() + idle_wait
                armed = True
                while not self._needed():
                    remaining = end - time.perf_counter()
                    if remaining <= 0:
                        break
                    if armed:
                        self._idle_waiting = True
                        armed = not self._cv.wait(remaining)  # notified: not armed now
                    else:
                        armed = not self._cv.wait(min(remaining, _RECHECK))
                self._idle_waiting = False
                if self._queue:
                    last_start = time.perf_counter()  # batch from the first submit on
            deadline = last_start + self.cycle_time
            while not (self._kicked or self._shutdown_requested or self._stopped or
                       self._handed_over is not None):
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                self._cv.wait(remaining)
            self._kicked = False
            return last_start
