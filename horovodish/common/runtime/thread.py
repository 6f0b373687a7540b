"""The runtime thread: one per process, started by init().

Each cycle it drains the submit queue, negotiates (controller.py), plans fusion
(fusion.py) and executes (executor.py). Pacing:
  * work nobody waits on starts one cycle time after the first submit of its batch,
    and while requests wait on other ranks, cycles are one cycle time apart; a caller
    blocking in synchronize() starts the next one at once (nothing more is coming from
    it);
  * with nothing pending it still takes part in negotiation every _IDLE_WAIT, so that
    a peer with work this rank will never submit (a stall), a shutdown or a stall
    report still gets through. Idle cycles cost the training thread: backing off from 1 ms
    (several idle cycles a step) cost a training loop a measurable share of its step
    rate against one cycle every 20 ms (docs/tuning.md).
  * where the transport can tell that a peer has begun a negotiation (shared memory on
    one host: ``Transport.peers_started``), an idle rank joins the negotiations others
    begin and begins none itself. An idle cycle begun alone holds the driver lock while
    it waits for the peers, so a caller arriving meanwhile had to hand its work to the
    thread, and a peer's call met that empty cycle first: a synchronous 4 KiB allreduce
    after 10 ms without calls took 3-6x as long as one right after another (2 ranks).

The thread sleeps on an alarm (alarm.py) set to when it next has a cycle to run
(``_next_due``), not on a Condition: a submit only sets the time, so a caller that takes
the work first never has the thread wake up to fight it for the GIL.

A caller that blocks on a handle runs the cycles itself while the thread is not running
one (caller_cycles.py): the thread stays for work nobody waits on yet, idle negotiation,
and negotiations a caller stopped waiting on. Either way a cycle runs under one lock, so
the cycles of a rank stay one sequence, as the other ranks' collectives need. A cycle
that fails midway ends the runtime and the job (fault_policy.py).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from .alarm import make_alarm
from .caller_cycles import CallerCycles, CycleSteps
from .fault_policy import FaultPolicy
from ..negotiation.controller import Controller, finish_cycle
from ..negotiation.eager_plan import EagerPlan, EagerPredictor, plan_eager
from ..negotiation.transport import Pending
from ..entry import Entry
from ..errors import HorovodInternalError
from ..execution.executor import Executor
from ..execution.fusion import FusionPlanner
from ..handles import Completions
from ..autotune import Autotuner
from ..messages import RequestType
from ..timeline import Timeline
from ..peer_wait import Patience, PeersNotAnswering, wait_patiently

log = logging.getLogger("horovodish")

_IDLE_WAIT = 0.02
_BUSY_POLL = 1e-3  # longest sleep between polls of a negotiation while work is pending
_IDLE_POLL = 5e-3  # ... and while idle


class Runtime(CallerCycles, FaultPolicy):
    def __init__(self, controller: Controller, executor: Executor, fusion_threshold: int,
                 cycle_time_ms: float, stall_message: Callable[[], str] | None = None,
                 caller_runs: bool = True, eager: EagerPredictor | None = None,
                 patience: Patience | None = None) -> None:
        """patience: how long a negotiation waits for a rank that takes no part in it
        before a warning, and before the job ends (peer_wait.py); None: for ever,
        silently."""
        self.controller = controller
        self.executor = executor
        self.fusion_threshold = fusion_threshold
        self.cycle_time = cycle_time_ms / 1000.0
        self.rank = controller.rank
        self._stall_message = stall_message
        self._patience = patience
        # A C-level with cannot be torn by a Ctrl-C, leaving the lock held (a Condition's
        # Python-level __enter__ can). It guards the queue and the thread's alarm.
        self._lock = threading.Lock()
        self._alarm = make_alarm()  # when the thread must look next (see _next_due)
        self.completions = Completions(self._drive_while_waiting)
        self.caller_runs = caller_runs
        self._driver = threading.Lock()  # held by whichever thread runs a cycle
        self._handed_over: tuple[CycleSteps, Pending] | None = None  # for the thread to finish
        # time.monotonic() (the alarm's clock) of: the last cycle's start and end, on
        # either thread, and the first submit since the queue was last taken
        self._last_start = self._last_cycle = self._batch_start = 0.0
        self._last_look = 0.0  # ... and of the last idle look that found no peer begun
        self._batch_waited = False  # the batch's first submit will be waited on at once
        self._cycle_shutdown = False  # whether this rank asked to shut down in this cycle
        self._callers_driving = 0  # callers running cycles now (see _drive_while_waiting)
        self.caller_cycles = 0  # cycles run on callers' threads
        self._caller_cycle_s = 0.0  # how long the last one took
        self.handovers = 0  # ... whose negotiation the runtime thread finished
        self._queue: list[Entry] = []
        self._wake_requested = False
        self._shutdown_requested = False
        self._stopped = False
        self.failed = False  # stopped by an internal error (see _fail)
        # World ranks whose shutdown stopped this runtime: their processes are ending, so
        # an elastic retry in these processes would wait for them for ever.
        self.ranks_left: tuple[int, ...] = ()
        self._stop_reason = ""
        self._in_flight: dict[str, Entry] = {}
        self._planner = FusionPlanner()
        # Small steady allreduces riding on the negotiation (negotiation/eager_plan.py): the
        # plan for each next cycle, from what every rank agreed on.
        self.eager = eager
        if eager is not None:
            controller.fill_eager = self._fill_eager
            controller.speculate = self._speculate
        self.cycles = 0
        self.timeline: Timeline | None = None
        self.autotuner: Autotuner | None = None  # rank 0 only
        self._thread = threading.Thread(target=self._run, name="horovodish-runtime", daemon=True)
        self._thread.start()

    # -- called from user threads ------------------------------------------------------
    def submit(self, entries: list[Entry], waited: bool = False) -> None:
        """Enqueue entries atomically (a group negotiates in one cycle). waited: as for
        submit_one, the caller waits on them at once."""
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
            new = {entry.request.name: entry for entry in entries}  # nothing registered yet
            first = not self._queue
            # Registered means queued: no call and no loop between the two (in-place |
            # and + run in C), so no signal handler can raise in between, whichever it
            # is; one raised there left names in flight that never ran.
            in_flight |= new
            self._queue += entries
            if first:
                self._batch_started(waited)
            elif self._batch_waited and not waited:
                self._batch_unwaited()

    def submit_one(self, entry: Entry, name: str, waited: bool = False) -> None:
        """submit([entry]) for entry.request.name == name, minus the group bookkeeping.

        waited: the caller waits on the entry at once (a blocking call), so it runs the
        cycle itself, or wakes the thread when it cannot (``_drive_while_waiting``):
        the thread's alarm need not be armed for it (``_batch_started``)."""
        with self._lock:
            refused = self._stopped or name in self._in_flight
            if not refused:
                first = not self._queue
                # No call between these two, so no Ctrl-C either (Python raises it at
                # calls and loops): registered means queued.
                self._in_flight[name] = entry
                self._queue.append(entry)
                if first:
                    self._batch_started(waited)
                elif self._batch_waited and not waited:
                    self._batch_unwaited()
        if refused:
            self.submit([entry])  # raises the error that says why

    def _batch_started(self, waited: bool = False) -> None:
        """The first submit into an empty queue (the lock is held): unless a caller takes
        the work first, the thread runs it one cycle time from now. Once per batch: the
        rest of a burst pays nothing here. A batch its caller waits on at once arms
        nothing: arming a timer that soon costs about 8 us in a VM (it reprograms the
        host's timer; one due seconds away, 3 us), a quarter of a small allreduce."""
        now = self._batch_start = time.monotonic()
        self._batch_waited = waited
        if not waited:
            self._alarm.wake_by(now + self.cycle_time)

    def _batch_unwaited(self) -> None:
        """Work nobody waits on yet joined a batch that its first caller will drive (the
        lock is held): the thread runs it by the cycle time, should that caller not."""
        self._batch_waited = False
        self._alarm.wake_by(self._batch_start + self.cycle_time)

    def _move_alarm(self, now: float) -> None:
        """A caller took the work (the lock is held): the thread would wake inside this
        cycle to find nothing to do, and fight the caller for the GIL. Arming a timer
        is not free in a VM (it reprograms the host's; docs/tuning.md), so:

        * in a submit-and-wait loop (short cycles, each batch submitted right after the
          last cycle) the alarm stays one cycle time ahead, moved only when about to go
          off: once every half cycle time, not twice a call, and the next submit finds
          it early enough and arms nothing;
        * in a loop of blocking calls (the batch was waited on at submit) no submit arms
          it, so it moves to the idle time, and only when about to go off;
        * otherwise (a long cycle, or compute between cycles) it would go off inside
          the cycle or the gap after it: it moves to the idle time, and the next batch's
          first submit arms it again (``_batch_started``). Predicting where the next
          batch starts instead saved nothing measurable (bursts vary too much).
        """
        cycle_time, deadline = self.cycle_time, self._alarm.deadline
        if self._batch_waited:  # the next batch will likely be waited on too: arms nothing
            if deadline < now + _IDLE_WAIT / 2:
                self._alarm.set(now + _IDLE_WAIT)
        elif self._caller_cycle_s < cycle_time / 4 and \
                self._batch_start - self._last_cycle < cycle_time / 4:
            if deadline < now + cycle_time / 2:
                self._alarm.set(now + cycle_time)
        elif deadline < now + _IDLE_WAIT / 2:
            self._alarm.set(now + _IDLE_WAIT)

    def wake_thread(self) -> None:
        """A caller is blocked on a handle: run the next cycle without waiting."""
        with self._lock:
            self._wake_requested = True
            self._alarm.wake_by(0.0)

    def shutdown(self, timeout: float = 30.0) -> None:
        with self._lock:
            self._shutdown_requested = True
            self._alarm.wake_by(0.0)
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
    def _start_cycle(self, by_caller: bool = False) -> tuple[CycleSteps, Pending]:
        """Take the queue and post its negotiation (the driver lock is held).

        A caller that takes the work moves the thread's alarm out of its way (see
        ``_move_alarm``)."""
        with self._lock:
            entries, self._queue = self._queue, []
            shutdown = self._cycle_shutdown = self._shutdown_requested
            now = self._last_start = time.monotonic()
            if by_caller and not (self._wake_requested or self._handed_over is not None or shutdown):
                self._move_alarm(now)
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
        groups: list = []
        if result.responses:
            ready_at = time.perf_counter() * 1e6
            if timeline is not None:
                for response in result.responses:
                    timeline.negotiate_end(response.name)
            rows, plan = result.gathered, result.plan or self.controller.eager
            groups = plan.groups if rows is not None else \
                self._planner.plan(result.responses, self.fusion_threshold)
            with self._lock:  # this rank's entry per response (None: a joined rank's)
                pop = self._in_flight.pop
                entries = [[pop(r.name, None) for r in group] for group in groups]
            notify, executor = self.completions.notify, self.executor
            if rows is not None and plan.split:  # the data came; reduced by slices
                executor.execute_split(plan, entries, rows, result.meet)
                notify()
            elif rows is not None:  # the data came with the negotiation
                for index, mine in enumerate(entries):
                    executor.execute_gathered(plan, index, mine, rows)
                    notify()
            else:
                for group, mine in zip(groups, entries):
                    executor.execute(group, mine, ready_at)
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
        if self.eager is not None:  # after the new parameters: the plan follows them
            self.controller.eager = self.eager.after_cycle(
                result.responses, result.cached_bits, result.eager_missed,
                groups if result.gathered is not None or not result.responses
                else self._planner.plan(result.responses, self.fusion_threshold))
        self._last_cycle = time.monotonic()
        if result.shutdown:
            if result.stalled:
                detail = self._stall_message() if self._stall_message else ""
                self._stop_reason = (" by the stall inspector (some ranks never submitted "
                                     "a tensor the others did)" + (f": {detail}" if detail else ""))
                self._end_job_after_grace()
            else:
                if not self._cycle_shutdown:  # another rank's shutdown, not ours
                    world_ranks = self.controller.world_ranks
                    self.ranks_left = tuple(world_ranks[r] for r in result.shutdown_ranks)
                    ranks = ", ".join(map(str, self.ranks_left)) or "?"
                    self._stop_reason = (f" because rank {ranks} shut down (its script "
                                         "ended, failed, or called shutdown())")
                # Every rank's runtime ends in this same cycle: collective clean-up
                # (the shared-memory windows) is safe now.
                self.executor.close()
                release = getattr(self.controller.transport, "release_shared", None)
                if release is not None:
                    release()
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
            self._alarm.wake_by(0.0)
        if self.timeline is not None:
            self.timeline.close()
        for entry in pending:
            entry.finish(error=HorovodInternalError(
                f"horovodish was shut down{reason} while {entry.request.type.opname} of "
                f"'{entry.request.name}' was in flight."))
        self.completions.notify()

    def set_eager_limit(self, limit: int, split_limit: int = 0) -> None:
        """New eager limits (eager_plan.plan_eager), forgetting what was learnt (the bench's
        A/B). Every rank calls it at the same point with nothing in flight anywhere.
        Under the driver lock: a cycle that a caller handed to the thread may still be
        finishing (its handles done, its prediction not yet updated), and every rank's
        prediction must see the same cycles before the change."""
        if self.eager is not None:
            with self._driver:
                self.eager.set_limit(limit, split_limit)

    def _speculate(self, responses: list) -> EagerPlan | None:
        """The controller's hook: the eager plan fresh responses would ride along by, if
        every rank brings the same ones (grouped as this cycle would group them)."""
        eager = self.eager
        assert eager is not None
        return plan_eager(self._planner.plan(responses, self.fusion_threshold), 0,
                          eager.size, eager.limit)

    def _fill_eager(self, plan: EagerPlan, region: Any) -> bool:
        """The controller's hook: this rank's tensors for an eager plan into its region."""
        return self.executor.pack_eager(plan, region, self._in_flight.get)

    # -- the thread --------------------------------------------------------------------
    def _run(self) -> None:
        reason = ""
        try:
            self._loop()
            reason = self._stop_reason
        except BaseException as exc:  # never die silently: fail what is pending
            log.exception("horovodish runtime thread failed")
            self._fail(exc)
        finally:
            self._end(reason)
            with self._lock:  # (every other use of the alarm is under the lock too)
                self._alarm.close()
            # No caller is in a cycle once the driver is free, and none starts one once
            # stopped. (A caller stuck in a collective with a dead peer: leave it be.)
            if self._driver.acquire(timeout=5.0):
                try:
                    self.controller.transport.close()
                finally:
                    self._driver.release()

    def _loop(self) -> None:
        while not self._stopped:
            self._sleep_until_due()
            with self._driver:
                if self._stopped:
                    return
                with self._lock:
                    handed, self._handed_over = self._handed_over, None
                    # Looked at again under the driver: a caller may have run it meanwhile.
                    due = handed is None and self._next_due(time.monotonic()) <= 0.0
                    idle = due and not (self._queue or self._wake_requested or
                                        self._shutdown_requested or self.controller.has_pending)
                    self._wake_requested = False
                try:
                    if handed is not None:  # a caller stopped waiting on this negotiation
                        steps, pending = handed
                    elif idle and self.controller.transport.peers_started() is False:
                        self._last_look = time.monotonic()  # nobody began one: look again later
                        if self.timeline is not None:  # (idle cycles wrote its file's tail)
                            self.timeline.flush()
                        continue
                    elif due:
                        steps, pending = self._start_cycle()
                    else:
                        continue
                    self._wait_for_peers(pending)
                    self._finish_cycle(steps)
                except BaseException as exc:
                    # Stopped before the lock goes: no caller may start a cycle after
                    # one abandoned midway.
                    self._fail(exc)
                    if isinstance(exc, PeersNotAnswering):
                        return
                    raise

    def _wait_for_peers(self, pending: Pending) -> None:
        """The other ranks' part of a negotiation, with patience (peer_wait.py): a peer
        frozen inside a collective (an NCCL kernel waiting on it, say) leaves the next
        negotiation waiting for it too."""
        if self._patience is None:
            pending.wait()
            return
        world = self.controller.world_ranks

        def missing() -> list[tuple[int, int]] | None:
            ranks = pending.missing()
            return None if ranks is None else [(world[r], pid) for r, pid in ranks]
        wait_patiently(lambda: pending.wait(patience=min(1.0, self._patience.warn_after)),
                       self._patience, self.rank, missing, "negotiation")

    def _next_due(self, now: float) -> float:
        """When the thread next has a cycle to run, in time.monotonic(); 0.0 if it has
        one now (the lock is held). While a caller drives, the work is the caller's:
        it hands back what it leaves (``_drive_while_waiting``), so the thread only looks in once per
        idle period, in case."""
        if self._stopped or self._shutdown_requested or self._wake_requested or \
                self._handed_over is not None:
            return 0.0
        if self._callers_driving:
            return now + _IDLE_WAIT
        # Take part in negotiation while idle (or look whether a peer has begun one).
        due = max(self._last_cycle, self._last_look) + _IDLE_WAIT
        if self._queue:
            due = min(due, self._batch_start + self.cycle_time)
        if self.controller.has_pending:  # requests waiting on other ranks
            due = min(due, self._last_start + self.cycle_time)
        return 0.0 if due <= now else due

    def _sleep_until_due(self) -> None:
        """Sleep on the alarm until the thread has a cycle to run. The alarm is set
        under the lock from the state it guards, so whatever changes that state after
        this sets it also moves it (submit, wake_thread, hand-over, shutdown)."""
        while True:
            with self._lock:
                due = self._next_due(time.monotonic())
                if due == 0.0:
                    return
                self._alarm.set(due)
            self._alarm.wait()
