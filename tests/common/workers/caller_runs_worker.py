"""A blocked caller runs cycles itself: results, hand-overs and Ctrl-C, on every rank.

Modes:
  late    rank 1 submits 0.3 s after rank 0 waits: rank 0's negotiation is handed to the
          runtime thread, and the result still arrives.
  sigint  Ctrl-C on rank 0 (a) while its main thread waits on a negotiation it posted:
          KeyboardInterrupt at once, the runtime thread finishes the cycle, a second
          wait() gets the result; (b) in the middle of a cycle its main thread runs:
          held back until the cycle is done, so the ranks stay in step.
Every rank checks every result against numpy and prints "rank R ok".
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np

from horovodish.common import basics, collectives
from horovodish.common.messages import ReduceOp
from horovodish.common.process_sets import global_process_set


def submit(name: str, rank: int, count: int = 1000):
    data = np.arange(count, dtype=np.float64) * (rank + 1)
    return collectives.allreduce_async(data, data, name, ReduceOp.SUM)


def expected(size: int, count: int = 1000) -> np.ndarray:
    return np.arange(count, dtype=np.float64) * sum(r + 1 for r in range(size))


def check(cond: bool, what: str) -> None:
    if not cond:
        sys.stdout.write(f"FAILED rank {basics.rank()}: {what}\n")
        sys.exit(1)


def late(rank: int, size: int) -> None:
    runtime = global_process_set.runtime
    for step in range(3):
        if rank == 1:
            time.sleep(0.3)
        got = submit(f"late.{step}", rank).wait()
        check(np.array_equal(got, expected(size)), f"late.{step} = {got[:4]}")
    if rank == 0:
        check(runtime.handovers >= 3, f"{runtime.handovers} hand-overs, expected >= 3")
    for step in range(20):  # ranks in step: callers run the cycles themselves
        got = submit(f"steady.{step}", rank).wait()
        check(np.array_equal(got, expected(size)), f"steady.{step}")
    check(runtime.caller_cycles > 0, "no cycle ran on the caller's thread")


def sigint(rank: int, size: int) -> None:
    from mpi4py import MPI

    runtime = global_process_set.runtime
    main = threading.get_ident()

    # (a) Ctrl-C while rank 0's main thread waits on a negotiation it started itself:
    # KeyboardInterrupt at once, and the runtime thread finishes that negotiation.
    start_cycle = runtime._start_cycle
    armed = False

    def start_then_interrupt():
        nonlocal armed
        steps, pending = start_cycle()
        if armed and threading.get_ident() == main:
            armed = False
            wait = pending.wait
            fired = False

            def interrupted_wait(deadline=None):
                nonlocal fired
                if not fired:  # once: the runtime thread waits on it again
                    fired = True
                    os.kill(os.getpid(), signal.SIGINT)  # handled before the next line
                return wait(deadline)
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
    from horovodish.common import interrupts
    check(interrupts._critical == 0, f"critical sections unbalanced: {interrupts._critical}")


def main(mode: str) -> None:
    basics.init()
    rank, size = basics.rank(), basics.size()
    {"late": late, "sigint": sigint}[mode](rank, size)
    basics.shutdown()
    sys.stdout.write(f"rank {rank} ok\n")


if __name__ == "__main__":
    main(sys.argv[1])
