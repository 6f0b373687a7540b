"""Jobs in which one rank misbehaves on purpose, on the core API; the test reads how the
job ends. Scenarios (the first argument names one):

- killed: rank 1 SIGKILLs itself in a training-like loop;
- raises: rank 1 raises there;
- raises_before_init: rank 1 raises before init() while the others wait in it;
- stalls: rank 1 never submits 'lonely_tensor';
- freezes: rank 1 stops itself (SIGSTOP) in a training-like loop;
- freezes_mid_collective: rank 1 stops itself while large allreduces run;
- stalls_in_set: world rank 2 never submits 'lonely_tensor' on the set [0, 2];
- raises_before_add: rank 1 raises while rank 0 registers a process set;
- internal_error: rank 0's runtime fails inside a cycle, after the negotiation that sent
  rank 1 into the data allreduce; rank 0's script then ends with the error;
- internal_error_caught: the same, but rank 0 catches the error and keeps running;
- init_after_the_others_left: every rank but 0 shuts down and exits; rank 0's init()
  must then return at once (Horovod's test classes call init() for every test, and one
  rank may finish the suite first) and its next collective raise, naming the ranks
  that left.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np

from worker_support import close, run_scenario  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import add_process_set, collectives, process_state  # noqa: E402
from horovodish.common.errors import HorovodInternalError  # noqa: E402
from horovodish.common.messages import ReduceOp  # noqa: E402


def allreduce(value: float, name: str) -> np.ndarray:
    data = np.full(8, value, dtype=np.float32)
    return collectives.allreduce_async(data, data, name, ReduceOp.SUM).wait()


def _train_until_rank_1_fails(kill: bool) -> None:
    """Steps of checked sums; at step 20 rank 1 is killed or raises."""
    api.init(process_sets="dynamic")
    rank, size = api.rank(), api.size()
    for step in range(10_000):
        if step == 20 and rank == 1:
            if kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("deliberate failure on rank 1")
        got = allreduce(float(rank), "grad")
        if not close(got, np.full(8, sum(range(size))), f"sum at step {step}"):
            return  # reported as a failed scenario
        time.sleep(0.005)


def killed(rank: int, size: int) -> None:
    _train_until_rank_1_fails(kill=True)


def raises(rank: int, size: int) -> None:
    _train_until_rank_1_fails(kill=False)


def raises_before_init(rank: int, size: int) -> None:
    if rank == 1:
        raise FileNotFoundError("deliberate failure before init on rank 1")
    api.init(process_sets="dynamic")


def raises_before_add(rank: int, size: int) -> None:
    api.init(process_sets="dynamic")
    allreduce(1.0, "warm")
    if rank == 1:
        time.sleep(0.5)
        raise RuntimeError("deliberate failure on rank 1 before add_process_set")
    add_process_set([0])  # agreed through the runtime: fails, not a hang in MPI


def stalls(rank: int, size: int) -> None:
    api.init(process_sets="dynamic")
    if rank == 1:
        time.sleep(120)  # never submits; the job must still end
    else:
        allreduce(1.0, "lonely_tensor")


def freezes(rank: int, size: int) -> None:
    """Rank 1 stops itself (SIGSTOP) between two steps: it runs no cycle at all."""
    api.init(process_sets="dynamic")
    for step in range(10_000):
        if step == 20 and rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        allreduce(float(rank), "grad")
        time.sleep(0.005)


def freezes_mid_collective(rank: int, size: int) -> None:
    """Rank 1 stops itself (SIGSTOP) from another thread while large allreduces run
    through shared memory: inside a collective's barrier, or between two."""
    api.init(process_sets="dynamic")
    data = np.ones(512 << 10, dtype=np.float32)  # 2 MiB: a shared-memory allreduce
    if rank == 1:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGSTOP)).start()
    for step in range(10_000):
        collectives.allreduce_async(data, data, "big", ReduceOp.AVERAGE).wait()


def stalls_in_set(rank: int, size: int) -> None:
    api.init(process_sets="dynamic")
    evens = add_process_set([0, 2])
    if rank == 0:
        data = np.ones(8, dtype=np.float32)
        collectives.allreduce_async(data, data, "lonely_tensor", ReduceOp.SUM,
                                    process_set=evens).wait()
    elif rank == 2:
        time.sleep(120)  # never submits; the report must name world rank 2


def _fail_a_cycle_on_rank_0(rank: int, caught: bool) -> None:
    api.init(process_sets="dynamic")
    allreduce(1.0, "before")
    if rank == 0:
        runtime = api.state().runtime

        def failing_finish(steps):
            raise RuntimeError("injected runtime failure")
        runtime._finish_cycle = failing_finish
    try:
        allreduce(1.0, "after")
    except Exception as exc:
        sys.stdout.write(f"rank {rank} got: {exc}\n")
        if caught:
            time.sleep(120)  # the job must still end, without this rank's help
        raise


def internal_error(rank: int, size: int) -> None:
    _fail_a_cycle_on_rank_0(rank, caught=False)


def internal_error_caught(rank: int, size: int) -> None:
    _fail_a_cycle_on_rank_0(rank, caught=True)


def init_after_the_others_left(rank: int, size: int) -> None:
    api.init()
    data = np.full(4, float(rank + 1), np.float32)
    total = collectives.allreduce_async(data, data, "before", ReduceOp.SUM).wait()
    if not close(total[0], size * (size + 1) / 2, "the sum before the others leave"):
        return  # reported as a failed scenario
    if rank != 0:
        api.shutdown()
        sys.exit(0)
    deadline = time.monotonic() + 20
    while not process_state.current().runtime.stopped and time.monotonic() < deadline:
        time.sleep(0.01)
    print(f"RUNTIME STOPPED {process_state.current().runtime.stopped}", flush=True)
    start = time.monotonic()
    api.init()
    print(f"INIT RETURNED after {time.monotonic() - start:.2f} s", flush=True)
    try:
        collectives.allreduce_async(data, data, "after", ReduceOp.SUM).wait()
        print("COLLECTIVE DID NOT RAISE", flush=True)
    except HorovodInternalError as exc:
        print(f"COLLECTIVE RAISED: {exc}", flush=True)
    api.shutdown()


if __name__ == "__main__":
    run_scenario([killed, raises, raises_before_init, raises_before_add, stalls, freezes,
                  freezes_mid_collective, stalls_in_set, internal_error, internal_error_caught,
                  init_after_the_others_left])
