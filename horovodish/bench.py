"""Benchmark: the runtime against raw MPI on the same bytes, in the same run.

    horovodishrun -np 2 python -m horovodish.bench [--json out.json] [--plot busbw.png]

Reports, per size from 4 KiB to 64 MiB: time per synchronous allreduce through the
runtime and through ``MPI_Allreduce``, algorithm and bus bandwidth, and the ratio of bus
bandwidths (runtime / MPI; above 1 means the runtime is faster). Then the many-small-tensors
case (256 x 16 KiB submitted async, then synchronized; on numpy arrays through the core,
and on torch tensors through horovodish.torch when torch is installed) against one MPI
call on the 4 MiB concatenation and against 256 separate MPI calls; and the idle cost:
how much a compute-bound loop slows while the runtime is initialized and idle.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from typing import Callable, ContextManager, Iterator

import numpy as np
from mpi4py import MPI

from .common import api
from .common.api import collectives
from .common.messages import ReduceOp

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def _time(fn: Callable[[], None], comm: MPI.Comm, budget: float = 0.6,
          min_iters: int = 5, max_iters: int = 2000) -> float:
    """Seconds per call: the slowest rank's mean over an adaptive number of iterations."""
    for _ in range(3):
        fn()
    comm.Barrier()
    start = time.perf_counter()
    fn()
    estimate = max(time.perf_counter() - start, 1e-6)
    iters = int(comm.allreduce(min(max_iters, max(min_iters, int(budget / estimate))), MPI.MIN))
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    elapsed = (time.perf_counter() - start) / iters
    return comm.allreduce(elapsed, MPI.MAX)


def _alternating(fns: dict[str, Callable[[], None]], comm: MPI.Comm, rounds: int = 3,
                 budget: float = 0.2,
                 around: dict[str, Callable[[], ContextManager]] | None = None
                 ) -> dict[str, list[float]]:
    """Seconds per call of each contender in each round; every contender is timed in
    every round, back to back, so that a slow spell of this shared machine (MPICH's own
    allreduce swings several-fold here: docs/tuning.md) hits both sides of a ratio. ``around``
    gives a contender a context to be timed in (a timeline recording, say)."""
    around = around or {}
    times: dict[str, list[float]] = {key: [] for key in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            with around.get(key, contextlib.nullcontext)():
                times[key].append(_time(fn, comm, budget))
    return times


def _busbw(nbytes: int, seconds: float, size: int) -> float:
    algbw = nbytes / seconds
    return algbw * (2 * (size - 1) / size if size > 1 else 1.0)


def sweep(comm: MPI.Comm, sizes: list[int]) -> list[dict]:
    size = comm.Get_size()
    rows = []
    for nbytes in sizes:
        buf = np.zeros(nbytes // 4, dtype=np.float32)  # zeros: repeated sums never overflow
        name = f"bench.{nbytes}"
        timed = _alternating({
            "ours": lambda: collectives.allreduce_async(buf, buf, name, ReduceOp.SUM).wait(),
            "raw": lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)}, comm)
        ours, raw = statistics.median(timed["ours"]), statistics.median(timed["raw"])
        rows.append({
            "bytes": nbytes, "runtime_s": ours, "mpi_s": raw,
            "runtime_algbw": nbytes / ours, "mpi_algbw": nbytes / raw,
            "runtime_busbw": _busbw(nbytes, ours, size), "mpi_busbw": _busbw(nbytes, raw, size),
            "ratio": raw / ours,
        })
    return rows


def many_small(comm: MPI.Comm, count: int = 256, nbytes: int = 16 << 10) -> dict:
    tensors = [np.zeros(nbytes // 4, dtype=np.float32) for _ in range(count)]
    names = [f"small.{i}" for i in range(count)]

    def ours() -> None:
        handles = [collectives.allreduce_async(t, t, n, ReduceOp.SUM)
                   for t, n in zip(tensors, names)]
        for handle in handles:
            handle.wait()

    concat = np.zeros(count * nbytes // 4, dtype=np.float32)
    contenders = {"ours": ours, "one": lambda: comm.Allreduce(MPI.IN_PLACE, concat, op=MPI.SUM)}
    torch_burst = _torch_burst(count, nbytes)
    if comm.allreduce(torch_burst is not None, op=MPI.LAND):  # every rank times the same
        contenders["torch"] = torch_burst

    def separate() -> None:
        for t in tensors:
            comm.Allreduce(MPI.IN_PLACE, t, op=MPI.SUM)

    with tempfile.TemporaryDirectory() as folder:
        @contextlib.contextmanager
        def timeline() -> Iterator[None]:
            api.start_timeline(os.path.join(folder, "timeline.json"))
            try:
                yield
            finally:
                api.stop_timeline()

        times = _alternating({**contenders, "separate": separate, "timeline": ours}, comm,
                             rounds=5, around={"timeline": timeline})
    ours_s, one_s, separate_s, timeline_s = (statistics.median(times[k]) for k in
                                             ("ours", "one", "separate", "timeline"))
    torch_figures = {}
    if "torch" in times:
        torch_s = statistics.median(times["torch"])
        torch_figures = {"torch_runtime_s": torch_s, "torch_over_one_call": torch_s / one_s}
    return {"count": count, "bytes_each": nbytes, "runtime_s": ours_s, **torch_figures,
            "runtime_with_timeline_s": timeline_s,
            "timeline_throughput_loss_percent": 100.0 * (1 - ours_s / timeline_s),
            "mpi_one_call_s": one_s, "mpi_separate_s": separate_s,
            "runtime_over_one_call": ours_s / one_s, "runtime_over_separate": ours_s / separate_s,
            "runtime_over_one_call_per_round": [a / b for a, b in zip(times["ours"],
                                                                       times["one"])]}


def _torch_burst(count: int, nbytes: int) -> Callable[[], None] | None:
    """The same burst through horovodish.torch (allreduce_async_, then synchronize), what
    a PyTorch user calls; None without torch."""
    try:
        import torch

        from . import torch as hvd
    except ImportError:
        return None
    tensors = [torch.zeros(nbytes // 4) for _ in range(count)]
    names = [f"torch.small.{i}" for i in range(count)]

    def burst() -> None:
        handles = [hvd.allreduce_async_(t, name=n, op=hvd.Sum) for t, n in zip(tensors, names)]
        for handle in handles:
            hvd.synchronize(handle)
    return burst


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
    """What an initialized, idle runtime costs a compute-bound loop.

    Two figures: the runtime thread's own CPU time as a share of the loop's wall time
    (precise), and the loop's speed with against without the idle runtime. The second
    is mostly this machine's noise, so each round also times the loop twice with the
    runtime off: the spread of those two against each other is the noise floor that a
    slowdown has to stand out from. Rounds rotate the order of the three loops.
    """
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


def _print_report(size: int, rows: list[dict], small: dict, idle: dict) -> None:
    print(f"horovodish.bench: {size} ranks, float32 Sum allreduce, synchronous, in place")
    print(f"{'bytes':>10} {'ours us':>10} {'MPI us':>10} {'ours busbw':>12} "
          f"{'MPI busbw':>12} {'ratio':>7}")
    for row in rows:
        print(f"{row['bytes']:>10} {row['runtime_s'] * 1e6:>10.1f} {row['mpi_s'] * 1e6:>10.1f} "
              f"{row['runtime_busbw'] / 1e9:>9.3f} GB/s {row['mpi_busbw'] / 1e9:>7.3f} GB/s "
              f"{row['ratio']:>6.2f}x")
    print(f"\n{small['count']} x {small['bytes_each'] >> 10} KiB async then synchronized: "
          f"{small['runtime_s'] * 1e3:.2f} ms; one MPI_Allreduce of the concatenation "
          f"{small['mpi_one_call_s'] * 1e3:.2f} ms ({small['runtime_over_one_call']:.2f}x); "
          f"{small['count']} separate MPI calls {small['mpi_separate_s'] * 1e3:.2f} ms "
          f"({small['runtime_over_separate']:.2f}x); ours / one call per round: "
          f"{min(small['runtime_over_one_call_per_round']):.2f}x to "
          f"{max(small['runtime_over_one_call_per_round']):.2f}x")
    if "torch_runtime_s" in small:
        print(f"the same burst through horovodish.torch (allreduce_async_, synchronize): "
              f"{small['torch_runtime_s'] * 1e3:.2f} ms ({small['torch_over_one_call']:.2f}x "
              "one MPI call)")
    print(f"timeline on: the same burst takes {small['runtime_with_timeline_s'] * 1e3:.2f} ms "
          f"({small['timeline_throughput_loss_percent']:.1f}% less throughput)")
    print(f"idle cost: the idle runtime thread uses {idle['runtime_thread_cpu_percent']:.2f}% "
          f"of a core while a compute-bound loop runs; the loop runs "
          f"{idle['slowdown_percent']:.2f}% slower (median of {idle['rounds']} rotating "
          f"rounds; noise floor: the loop against itself, runtime off, differs by "
          f"{idle['noise_floor_percent']:.2f}% in a median round, "
          f"{idle['control_median_percent']:+.2f}% in the median)")


def _plot(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sizes = [r["bytes"] for r in rows]
    plt.figure(figsize=(7, 4))
    plt.plot(sizes, [r["runtime_busbw"] / 1e9 for r in rows], "o-", label="horovodish")
    plt.plot(sizes, [r["mpi_busbw"] / 1e9 for r in rows], "s--", label="MPI_Allreduce")
    plt.xscale("log", base=2)
    plt.xlabel("bytes")
    plt.ylabel("bus bandwidth (GB/s)")
    plt.legend()
    plt.grid(alpha=0.3)
    plt.tight_layout()
    plt.savefig(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m horovodish.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the figures to this file (rank 0)")
    parser.add_argument("--plot", help="draw bus bandwidth against size to this PNG (rank 0)")
    parser.add_argument("--idle-rounds", type=int, default=16,
                        help="rounds of the idle-cost measurement (default 16)")
    parser.add_argument("--max-bytes", type=int, default=SIZES[-1],
                        help="largest allreduce in the sweep (default 64 MiB)")
    args = parser.parse_args(argv)
    api.init()
    comm = MPI.COMM_WORLD.Dup()
    idle = idle_cost(comm, rounds=args.idle_rounds)
    rows = sweep(comm, [s for s in SIZES if s <= args.max_bytes])
    small = many_small(comm)
    if comm.Get_rank() == 0:
        _print_report(comm.Get_size(), rows, small, idle)
        if args.json:
            with open(args.json, "w") as handle:
                json.dump({"ranks": comm.Get_size(), "allreduce": rows, "many_small": small,
                           "idle": idle}, handle, indent=2)
        if args.plot:
            _plot(rows, args.plot)
    api.shutdown()


if __name__ == "__main__":
    main()
