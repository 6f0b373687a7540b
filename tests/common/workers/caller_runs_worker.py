"""A blocked caller runs cycles itself: results, hand-overs and Ctrl-C, on every rank.

Modes:
  late    rank 1 submits 0.3 s after rank 0 waits: rank 0's negotiation is handed to the
          runtime thread, and the result still arrives.
  sigint  Ctrl-C on rank 0 (a) while its main thread waits on a negotiation it posted:
          held back for at most that wait (2 ms), then the cycle goes to the runtime
          thread and KeyboardInterrupt is raised; a second wait() gets the result;
          (b) in the middle of a cycle its main thread runs: held back until the cycle
          is done, so the ranks stay in step.
  storm   (one rank) SIGINTs every 0-200 us: critical sections stay balanced.
  app_storm  (one rank) the same with an application's own raising SIGINT handler,
          over grouped submits: no name left in flight.
  shared_storm  (two ranks) the storm on rank 0 over names both ranks share: the
          runtime keeps working.
  idle    work submitted after a caller's cycle, waited on only later, still starts
          within about the cycle time.
  joins   (two ranks, one host) idle ranks begin no negotiation of their own, and an
          idle rank joins the ones a peer begins.
  thread_failure  (one rank) a cycle failing on the runtime thread stops the runtime
          before any caller can start another.
Each mode is one check (tests/worker_support.py) of that name, run on every rank, which
checks every result against numpy.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np

from worker_support import check, expect_error, run_checks  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import collectives  # noqa: E402
from horovodish.common.api.process_sets import global_process_set  # noqa: E402
from horovodish.common.messages import ReduceOp  # noqa: E402


def submit(name: str, rank: int, count: int = 1000, waited: bool = False):
    data = np.arange(count, dtype=np.float64) * (rank + 1)
    return collectives.allreduce_async(data, data, name, ReduceOp.SUM, waited=waited)


def expected(size: int, count: int = 1000) -> np.ndarray:
    return np.arange(count, dtype=np.float64) * sum(r + 1 for r in range(size))


def late(rank: int, size: int) -> None:
    """Rank 1 is 0.3 s late each step: every step that rank 0's caller started itself
    must be handed to the runtime thread (rank 0 does not spin for 0.3 s). A step may
    instead find the thread inside an idle negotiation (every 20 ms, holding the driver
    lock while the other ranks' threads catch up): the thread then runs it, and there
    is nothing to hand over."""
    runtime = global_process_set.runtime
    steps = []
    for step in range(4):
        if rank == 1:
            time.sleep(0.3)
        caller_cycles, handovers = runtime.caller_cycles, runtime.handovers
        got = submit(f"late.{step}", rank).wait()
        check(np.array_equal(got, expected(size)), f"late.{step} = {got[:4]}")
        steps.append((runtime.caller_cycles - caller_cycles, runtime.handovers - handovers))
    if rank == 0:
        check(all(handed >= 1 for driven, handed in steps if driven) and
              sum(handed for _, handed in steps) >= 1,
              f"(cycles the caller started, hand-overs) per step: {steps}")
    for step in range(20):  # ranks in step: callers run the cycles themselves
        got = submit(f"steady.{step}", rank).wait()
        check(np.array_equal(got, expected(size)), f"steady.{step}")
    check(runtime.caller_cycles > 0, "no cycle ran on the caller's thread")


def sigint(rank: int, size: int) -> None:
    from mpi4py import MPI

    runtime = global_process_set.runtime
    main = threading.get_ident()

    # (a) Ctrl-C while rank 0's main thread waits on a negotiation it started itself:
    # KeyboardInterrupt within that wait's 2 ms, and the runtime thread finishes it.
    start_cycle = runtime._start_cycle
    armed = False

    def start_then_interrupt(*args, **kwargs):
        nonlocal armed
        steps, pending = start_cycle(*args, **kwargs)
        if armed and threading.get_ident() == main:
            armed = False
            wait = pending.wait
            fired = False

            def interrupted_wait(deadline=None, patience=None):
                nonlocal fired
                if not fired:  # once: the runtime thread waits on it again
                    fired = True
                    os.kill(os.getpid(), signal.SIGINT)  # held back until the hand-over
                return wait(deadline, patience)
            pending.wait = interrupted_wait
        return steps, pending

    runtime._start_cycle = start_then_interrupt
    for attempt in range(5):  # until the main thread (not the runtime thread) drove
        if rank == 1:
            time.sleep(0.5)  # late: rank 0 waits meanwhile
        armed = rank == 0
        handovers = runtime.handovers
        handle = submit(f"waited.{attempt}", rank)
        interrupted = False
        try:
            start = time.perf_counter()
            got = handle.wait()
        except KeyboardInterrupt:
            interrupted = True
            elapsed = time.perf_counter() - start
            check(elapsed < 0.3, f"KeyboardInterrupt came {elapsed:.2f} s late")
            check(runtime.handovers == handovers + 1, "the negotiation was not handed over")
            got = handle.wait()  # the runtime thread finished it
        check(np.array_equal(got, expected(size)), f"waited.{attempt} = {got[:4]}")
        if MPI.COMM_WORLD.allreduce(interrupted, op=MPI.LOR):
            break
    else:
        check(False, "rank 0's main thread never drove a negotiation")
    runtime._start_cycle = start_cycle

    # (b) Ctrl-C in the middle of a cycle that rank 0's main thread runs itself: held
    # back until the cycle is done, so the other ranks are not left in a collective.
    held_back = 0
    execute = runtime.executor.execute

    def interrupted_execute(*args, **kwargs):
        nonlocal held_back
        if threading.get_ident() == main:
            held_back += 1
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)  # the handler has run by now
        return execute(*args, **kwargs)

    if rank == 0:
        runtime.executor.execute = interrupted_execute
    for step in range(10):
        before = held_back
        handle = submit(f"cycle.{step}", rank, count=200_000)
        try:
            got = handle.wait()
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
            check(handle.done(), f"cycle.{step}: interrupted before its cycle finished")
            got = handle.wait()
        check(np.array_equal(got, expected(size, 200_000)), f"cycle.{step} = {got[:4]}")
        check(interrupted == (held_back > before), f"cycle.{step}: interrupted "
              f"{interrupted}, but the main thread ran {held_back - before} cycles")
    runtime.executor.execute = execute
    if rank == 0:
        check(held_back > 0, "rank 0's main thread never ran a cycle itself")
    for step in range(5):  # still in step afterwards
        got = submit(f"after.{step}", rank).wait()
        check(np.array_equal(got, expected(size)), f"after.{step}")
    from horovodish.common.runtime import interrupts
    check(interrupts.depth == 0, f"critical sections unbalanced: {interrupts.depth}")


def storm(rank: int, size: int) -> None:
    """One rank alone: SIGINTs every 0-200 us while the main thread runs cycles. Every
    KeyboardInterrupt must leave the critical sections balanced (a signal handled as a
    section began once left the count at -1, after which Ctrl-C was mishandled)."""
    from horovodish.common.runtime import interrupts

    runtime = global_process_set.runtime
    sys.setswitchinterval(1e-5)  # signals handled at finer points (found the race sooner)
    state = {"attempts": 0, "done": 0, "interrupted": 0, "unbalanced": None, "go": True}
    end = time.perf_counter() + 4.0
    restore = _sigint_in_library_only()
    pesterer = _pester(state)
    while True:
        try:
            if time.perf_counter() > end:
                break
            state["attempts"] += 1  # a name per attempt: one may still be in flight
            data = np.full(8, 2.0)
            name = f"storm.{state['attempts']}"
            got = collectives.allreduce_async(data, data, name, ReduceOp.SUM).wait()
            if not np.array_equal(got, np.full(8, 2.0)):
                state["unbalanced"] = f"{name} = {got}"
            state["done"] += 1
        except KeyboardInterrupt:
            state["interrupted"] += 1
        finally:
            if interrupts.depth != 0 and state["unbalanced"] is None:
                state["unbalanced"] = f"critical count {interrupts.depth}"
    _calm(state, pesterer)
    restore()
    sys.setswitchinterval(0.005)
    # Whatever a Ctrl-C interrupted, nothing is left behind: one rank alone, the runtime
    # thread runs what no caller waits on any more, so no name stays in flight (one
    # registered but never queued did), and no caller is still counted as driving (one
    # left counted kept the thread off queued work for good).
    settle = time.perf_counter() + 2.0
    while (runtime._in_flight or runtime._callers_driving) and time.perf_counter() < settle:
        time.sleep(0.01)
    check(not runtime._in_flight and runtime._callers_driving == 0,
          f"after the storm: {len(runtime._in_flight)} names still in flight "
          f"({sorted(runtime._in_flight)[:3]}), {runtime._callers_driving} callers counted as driving")
    sys.stdout.write(f"storm: {state['done']} ops, {state['interrupted']} interrupts\n")
    check(state["unbalanced"] is None, f"after {state['done']} ops: {state['unbalanced']}")
    check(state["interrupted"] > 0 and state["done"] > 0 and runtime.caller_cycles > 0,
          f"{state['done']} ops, {state['interrupted']} interrupts, "
          f"{runtime.caller_cycles} caller cycles")


def idle(rank: int, size: int) -> None:
    """Work submitted after a caller ran the cycles, that nobody waits on yet, must still
    start within about the cycle time: the idle runtime thread has to hear the submit
    (it once slept on for its 20 ms idle timeout)."""
    from statistics import median

    from mpi4py import MPI

    runtime = global_process_set.runtime
    delays = []
    for trial in range(20):
        time.sleep(0.03)  # both threads idle
        MPI.COMM_WORLD.Barrier()
        submit(f"first.{trial}", rank).wait()  # the caller runs this cycle
        cycles = runtime.cycles
        start = time.perf_counter()
        handle = submit(f"second.{trial}", rank)
        if rank == 0:  # nobody waits here: the runtime thread must run it
            while runtime.cycles == cycles and time.perf_counter() - start < 0.5:
                time.sleep(0.0002)
            delays.append(time.perf_counter() - start)
        got = handle.wait()
        check(np.array_equal(got, expected(size)), f"second.{trial}")
    if rank == 0:
        check(median(delays) < 0.008, f"median {median(delays) * 1e3:.1f} ms before the "
              "runtime thread ran work nobody waited on")


def _pester(state: dict) -> threading.Thread:
    """SIGINT every 0-200 us until state["go"] is False."""
    import random

    started = threading.Event()

    def pester() -> None:
        started.wait()  # not while the main thread is still in start() (threading.py)
        while state["go"]:
            time.sleep(random.uniform(0, 200e-6))
            os.kill(os.getpid(), signal.SIGINT)
    thread = threading.Thread(target=pester, daemon=True)
    thread.start()
    started.set()
    return thread


def _calm(state: dict, pesterer: threading.Thread) -> None:
    """Stop the storm; SIGINT is ignored from here, signals already sent included."""
    state["go"] = False
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (runs any pending one: ignored)
    pesterer.join()


_LIBRARY = os.path.dirname(os.path.dirname(os.path.abspath(collectives.__file__)))


def _in_library(frame) -> bool:
    """Whether a signal handler runs inside horovodish or the threading module (the
    waits it uses), rather than in a test's own loop or in signal.signal itself."""
    path = "" if frame is None else frame.f_code.co_filename
    return path.startswith(_LIBRARY) or path == threading.__file__


def _sigint_in_library_only():
    """Keep the library's SIGINT handler (so the main thread still drives), but drop a
    signal that arrives outside the library: a storm test's loop has to survive a
    KeyboardInterrupt anywhere in the library, and could not survive one in its own
    except clauses. Returns a function that puts the plain handler back."""
    from horovodish.common.runtime import interrupts

    library_handler = interrupts._on_sigint

    def in_library_only(signum, frame):
        if _in_library(frame):
            library_handler(signum, frame)
    interrupts._on_sigint = in_library_only  # safe_to_drive checks for this one
    signal.signal(signal.SIGINT, in_library_only)

    def restore() -> None:
        interrupts._on_sigint = library_handler
        signal.signal(signal.SIGINT, library_handler)
    return restore


def app_storm(rank: int, size: int) -> None:
    """One rank whose application has a SIGINT handler of its own that raises (so the
    main thread does not drive, and nothing of ours holds Ctrl-C back), a storm during
    grouped submits and blocked waits. No name may be left in flight that never runs
    (one raised between a group's registrations and its enqueue was), and no wait may
    break the runtime (a Condition's wait, interrupted between dropping and re-taking
    its lock, made the caller release a lock it did not hold: RuntimeError).
    """
    from horovodish.common.runtime import interrupts

    def own(signum, frame):  # raise in library code only: this loop must stay intact
        if _in_library(frame):
            raise KeyboardInterrupt
    signal.signal(signal.SIGINT, own)
    runtime = global_process_set.runtime
    state = {"go": True, "groups": 0, "interrupted": 0}
    sys.setswitchinterval(1e-5)
    pesterer = _pester(state)
    end = time.perf_counter() + 3.0
    while True:
        try:
            if time.perf_counter() > end:
                break
            state["groups"] += 1
            data = [np.ones(4) for _ in range(8)]
            names = [f"g.{state['groups']}.{i}" for i in range(8)]
            for handle in collectives.grouped_allreduce_async(data, data, names, ReduceOp.SUM):
                handle.wait()
        except KeyboardInterrupt:
            state["interrupted"] += 1
    _calm(state, pesterer)
    sys.setswitchinterval(0.005)
    settle = time.perf_counter() + 3.0
    while runtime._in_flight and time.perf_counter() < settle:
        time.sleep(0.01)
    sys.stdout.write(f"app storm: {state['groups']} groups, {state['interrupted']} interrupts\n")
    check(state["interrupted"] > 0, "no interrupt landed")
    check(not runtime._in_flight and interrupts.depth == 0 and not runtime.stopped,
          f"after the storm: {len(runtime._in_flight)} names in flight "
          f"({sorted(runtime._in_flight)[:3]}), depth {interrupts.depth}, "
          f"stopped {runtime.stopped}")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupts.install()


def shared_storm(rank: int, size: int) -> None:
    """Two ranks over the same names, a Ctrl-C storm on rank 0 only (whose caller runs
    cycles, hands them over and blocks, while rank 1 keeps in step). Afterwards
    everything submitted has run on both ranks, the runtime is up, nothing is left
    counted, and a name used before works again.
    """
    from mpi4py import MPI

    from horovodish.common.runtime import interrupts

    runtime = global_process_set.runtime
    steps = 1500
    ran: set[str] = set()
    execute = runtime.executor.execute

    def recording(group, mine, *args, **kwargs):
        ran.update(response.name for response in group)
        return execute(group, mine, *args, **kwargs)
    runtime.executor.execute = recording

    def submit_step(step: int):
        data = np.full(4, 1.0)
        return collectives.allreduce_async(data, data, f"s.{step}", ReduceOp.SUM)

    def registered(name: str) -> bool:
        with runtime._driver:  # no cycle between taking an entry and running it
            return name in runtime._in_flight or name in ran
    if rank != 0:
        for step in range(steps):
            submit_step(step).wait()
    else:
        state = {"go": True, "interrupted": 0}
        sys.setswitchinterval(1e-5)
        restore = _sigint_in_library_only()
        pesterer = _pester(state)
        step = 0
        while step < steps:
            try:
                handle = submit_step(step)
                step += 1
                handle.wait()
            except KeyboardInterrupt:
                state["interrupted"] += 1
                # A submit interrupted before it returned may or may not have registered.
                if registered(f"s.{step}"):
                    step += 1
        _calm(state, pesterer)
        restore()
        sys.setswitchinterval(0.005)
        sys.stdout.write(f"shared storm: {state['interrupted']} interrupts\n")
        check(state["interrupted"] > 0, "no interrupt landed")
    MPI.COMM_WORLD.Barrier()
    settle = time.perf_counter() + 5.0
    while (runtime._in_flight or runtime._callers_driving) and time.perf_counter() < settle:
        time.sleep(0.01)
    check(not runtime.stopped and not runtime._in_flight and runtime._callers_driving == 0 and
          interrupts.depth == 0,
          f"after the storm: stopped {runtime.stopped}{runtime._stop_reason}, "
          f"{len(runtime._in_flight)} names in flight, {runtime._callers_driving} callers counted "
          f"as driving, depth {interrupts.depth}")
    got = submit_step(0).wait(timeout=10)
    check(np.array_equal(got, np.full(4, float(size))), f"s.0 again = {got}")


def quiet(rank: int, size: int) -> None:
    """A submit-and-wait loop that the caller drives never needs the runtime thread, and
    must not wake it: every wake-up fights the caller for the GIL (a 4 KiB allreduce took
    207 against 137 us when the thread woke every 1 ms). The caller keeps moving the
    thread's alarm on; only the idle check and the odd slow call may wake it."""
    runtime = global_process_set.runtime
    alarm = runtime._alarm
    wakes = 0
    wait = alarm.wait

    def counted_wait():
        nonlocal wakes
        wait()
        wakes += 1
    alarm.wait = counted_wait
    calls = 600
    slow = 0  # calls longer than half the cycle time (1 ms): each may let the alarm go off
    start = time.perf_counter()
    for step in range(calls):
        began = time.perf_counter()
        got = submit("quiet", rank).wait()
        slow += time.perf_counter() - began > 0.0005
        check(np.array_equal(got, expected(size)), f"quiet step {step}")
    elapsed = time.perf_counter() - start
    # Nearly every cycle on the caller: one descheduled for 20 ms (a loaded machine)
    # may see the thread take its work in an idle cycle.
    check(runtime.caller_cycles >= calls - 5, f"{runtime.caller_cycles} caller cycles")
    # One per idle period (20 ms) is the floor: the wake-up that looks in, in case; and
    # a call slower than half a cycle time (a loaded machine) may let the alarm go off,
    # once. Woken at every submit and every 1 ms, as before, it woke ~110 times in 600
    # calls that were all fast.
    allowed = calls // 10 + elapsed / 0.02 + slow + 2
    check(wakes <= allowed, f"the runtime thread woke {wakes} times during {calls} "
          f"caller-driven allreduces in {elapsed:.2f} s, {slow} of them slower than "
          f"0.5 ms (at most {allowed:.0f} expected)")


def waited(rank: int, size: int) -> None:
    """A blocking call (waited=True) sets no timer for the runtime thread: in a loop of
    them the caller drives every cycle and the alarm is armed about once per idle period
    (each arming costs ~8 us in a VM). A caller that cannot drive (caller runs off, as
    while a timeline records) wakes the thread itself: each call then still takes about
    a cycle's time, not the 20 ms until the thread's idle check."""
    from statistics import median

    runtime = global_process_set.runtime
    alarm = runtime._alarm
    arms = 0
    arm = alarm._arm

    def counted_arm(deadline):
        nonlocal arms
        arms += 1
        arm(deadline)
    alarm._arm = counted_arm
    calls = 600
    mine = np.arange(6, dtype=np.float32) + rank  # for the other collectives' forms
    gathered = np.concatenate([np.arange(6, dtype=np.float32) + r for r in range(size)])
    summed = sum(np.arange(6 * size, dtype=np.float32) + r for r in range(size))
    start = time.perf_counter()
    for step in range(calls):
        got = submit("waited", rank, waited=True).wait()
        check(np.array_equal(got, expected(size)), f"waited step {step}")
        if step % 6 == 1:  # the blocking forms of the others say waited too
            data = [np.full(5, float(rank + 1), np.float32) for _ in range(2)]
            for got in [h.wait() for h in collectives.grouped_allreduce_async(
                    data, [None, None], ["waited.g0", "waited.g1"], ReduceOp.SUM,
                    waited=True)]:
                check(np.array_equal(got, np.full(5, size * (size + 1) / 2, np.float32)),
                      f"waited grouped allreduce, step {step}")
            (got,) = [h.wait() for h in collectives.grouped_allgather_async(
                [mine], [None], ["waited.ag"], waited=True)]
            check(np.array_equal(got, gathered), f"waited allgather, step {step}")
            got = collectives.broadcast_async(mine, None, 0, "waited.bc", waited=True).wait()
            check(np.array_equal(got, np.arange(6, dtype=np.float32)),
                  f"waited broadcast, step {step}")
            (got,) = [h.wait() for h in collectives.grouped_reducescatter_async(
                [np.arange(6 * size, dtype=np.float32) + rank], [None], ["waited.rs"],
                ReduceOp.SUM, waited=True)]
            check(np.array_equal(got, summed[6 * rank:6 * rank + 6]),
                  f"waited reducescatter, step {step}")
    elapsed = time.perf_counter() - start
    del alarm._arm
    # Once per half idle period (10 ms) expected; twice that allowed for a loaded machine.
    # Arming one cycle time ahead, as before, armed every 0.5 ms.
    allowed = elapsed / 0.005 + 4
    check(arms <= allowed, f"the alarm was armed {arms} times in {calls} blocking calls "
          f"in {elapsed:.2f} s (at most {allowed:.0f} expected)")
    runtime.caller_runs = False
    try:
        took = []
        for step in range(40):
            begin = time.perf_counter()
            got = submit("waited.thread", rank, waited=True).wait()
            took.append(time.perf_counter() - begin)
            check(np.array_equal(got, expected(size)), f"thread-run step {step}")
    finally:
        runtime.caller_runs = True
    check(median(took) < 0.008, f"median {median(took) * 1e3:.1f} ms a blocking call "
          "that its caller could not drive")


def joins(rank: int, size: int) -> None:
    """Within one host an idle rank begins no negotiation (one begun alone would hold
    the driver lock while it waits, in the way of the next call), and it joins those a
    peer begins: rank 0's allreduce, which rank 1 submits 0.2 s later, is negotiated
    on both in the meantime, and comes out right."""
    from mpi4py import MPI

    runtime = global_process_set.runtime
    check(runtime.controller.transport.peers_started() is not None,
          "the transport cannot tell whether a peer began a negotiation")
    submit("joins.warm", rank).wait()
    MPI.COMM_WORLD.Barrier()
    cycles = runtime.cycles
    time.sleep(0.3)  # every rank idle: 15 idle periods
    idle_cycles = runtime.cycles - cycles
    MPI.COMM_WORLD.Barrier()
    cycles = runtime.cycles
    if rank == 0:
        handle = submit("joins.late", rank)
        time.sleep(0.2)
    else:
        time.sleep(0.2)
        joined = runtime.cycles - cycles  # rank 0's negotiations, which this rank joined
        handle = submit("joins.late", rank)
    got = handle.wait()
    check(np.array_equal(got, expected(size)), f"joins.late = {got[:4]}")
    check(idle_cycles == 0, f"{idle_cycles} negotiations while every rank was idle")
    if rank != 0:
        check(joined >= 3, f"rank {rank} joined {joined} of rank 0's negotiations in 0.2 s")


def thread_failure(rank: int, size: int) -> None:
    """A cycle that fails on the runtime thread stops the runtime before the driver
    lock is free: no caller may start a cycle after one abandoned midway."""
    from horovodish.common.runtime import thread as runtime_module
    from horovodish.common.errors import HorovodInternalError

    runtime = global_process_set.runtime
    finish = runtime._finish_cycle
    armed = True

    def failing_finish(steps):
        nonlocal armed
        if armed and threading.current_thread().name == "horovodish-runtime":
            armed = False
            raise RuntimeError("injected failure")
        return finish(steps)

    log_exception = runtime_module.log.exception

    def slow_log(*args, **kwargs):  # widens the window between the failure and the log
        time.sleep(0.3)
        log_exception(*args, **kwargs)

    runtime._finish_cycle = failing_finish
    runtime_module.log.exception = slow_log
    first = submit("nobody_waits", rank)  # the runtime thread runs it, and fails
    time.sleep(0.1)
    check(runtime.stopped, "the runtime was not stopped when its thread's cycle failed")
    expect_error(lambda: submit("next", rank).wait(), HorovodInternalError,
                 "injected failure", what="a collective after the failure")
    expect_error(lambda: first.wait(timeout=5), HorovodInternalError, "injected failure",
                 what="the failed cycle's tensor")
    time.sleep(0.4)


MODES = {check.__name__: check for check in [late, sigint, storm, idle, quiet, waited, joins,
                                             app_storm, shared_storm, thread_failure]}

if __name__ == "__main__":
    api.init()
    run_checks([MODES[sys.argv[1]]], api.rank(), api.size())
    api.shutdown()
