"""What an initialized, idle runtime costs a compute-bound loop."""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from ..common import api


def _compute_loop(seconds: float) -> float:
    """A single-threaded, GIL-holding loop; returns iterations per second."""
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        total = 0
        for i in range(2000):
            total += i * i
        count += 1
    return count / (time.perf_counter() - start)


def _thread_cpu_seconds(native_id: int) -> float:
    """CPU time of one thread of this process (Linux schedstat, nanoseconds)."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat") as handle:
            return int(handle.read().split()[0]) / 1e9
    except OSError:
        return float("nan")


def idle_cost(comm: MPI.Comm, rounds: int = 16, seconds: float = 0.15) -> dict:
    """Two figures: the runtime thread's own CPU time as a share of the loop's wall time
    (precise), and the loop's speed with against without the idle runtime. The second
    is mostly the machine's noise, so each round also times the loop twice with the
    runtime off: the spread of those two against each other is the noise floor that a
    slowdown has to stand out from. Rounds rotate the order of the three loops.
    Leaves the runtime initialized."""
    with_runtime, control, thread_share = [], [], []

    def measure(idle: bool) -> float:
        if idle and not api.is_initialized():
            api.init()
            time.sleep(0.05)
        elif not idle and api.is_initialized():
            api.shutdown()
        comm.Barrier()
        if not idle:
            return _compute_loop(seconds)
        thread = api.state().runtime._thread
        cpu_before, start = _thread_cpu_seconds(thread.native_id), time.perf_counter()
        rate = _compute_loop(seconds)
        thread_share.append((_thread_cpu_seconds(thread.native_id) - cpu_before)
                            / (time.perf_counter() - start))
        return rate

    orders = [("off", "on", "off2"), ("on", "off", "off2"), ("off", "off2", "on")]
    for index in range(rounds):
        rates = {}
        for key in orders[index % len(orders)]:
            rates[key] = measure(key == "on")
        with_runtime.append(rates["on"] / rates["off"])
        control.append(rates["off2"] / rates["off"])
    api.init()
    size = comm.Get_size()

    def across_ranks(value: float) -> float:
        return comm.allreduce(value, MPI.SUM) / size

    ratio = across_ranks(float(np.median(with_runtime)))
    noise = [abs(1 - r) for r in control]
    # A round whose schedstat read failed (nan) is left out, not allowed to void the rest.
    read = [share for share in thread_share if share == share]
    share = across_ranks(float(np.mean(read)) if read else float("nan"))
    return {"runtime_thread_cpu_percent": 100.0 * share,
            "slowdown_percent": 100.0 * (1 - ratio),
            "noise_floor_percent": 100.0 * across_ranks(float(np.median(noise))),
            "control_median_percent": 100.0 * (1 - across_ranks(float(np.median(control)))),
            "rounds": rounds}
