"""Benchmark across hosts: the allreduce strategies side by side in one job, with the
bytes that crossed each host's link and the lower bound.

    horovodishrun -np 4 -H h1:2,h2:2 python -m horovodish.bench.hosts \\
        --link-rate 1gbit [--link-dev eth0] [--sizes 64] [--json out.json]

For each size, in alternating rounds (so a slow spell of a shared machine hits every
contender): the runtime's hierarchical allreduce, its flat ring, its flat MPI path, and
MPI's own MPI_Allreduce on the same buffer. With --link-dev, each host's first rank reads
the bytes its interface sent (``tc -s qdisc show dev DEV``: root, and a qdisc on DEV, as
on the emulated cluster of tests/cluster) before and after each contender. The lower
bound: between H hosts an allreduce must send, from each host, 2(H-1)/H of the buffer
(H = 2: the whole buffer once in each direction); at --link-rate that takes at least
bytes x 2(H-1)/H / rate. Then the small-tensor burst (256 x 16 KiB submitted at once)
hierarchical against flat, and the negotiation of one tiny allreduce, cached and not.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Callable

import numpy as np
from mpi4py import MPI

from ..common import api
from ..common.api import collectives
from ..common.messages import ReduceOp

# The runtime's strategies: the variables each is started with.
STRATEGIES = {
    "hierarchical": {"HOROVODISH_HIERARCHICAL_ALLREDUCE": "1"},
    "flat ring": {"HOROVODISH_HIERARCHICAL_ALLREDUCE": "0", "HOROVODISH_CPU_OPERATIONS": "ring"},
    "flat mpi": {"HOROVODISH_HIERARCHICAL_ALLREDUCE": "0", "HOROVODISH_CPU_OPERATIONS": "mpi"},
}
MPI_OWN = "MPI_Allreduce"


def _rate_bits(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", text.strip().lower())
    if not match:
        raise argparse.ArgumentTypeError(f"expected e.g. 1gbit or 10gbit, got {text!r}")
    return float(match[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match[2]]


def _link_bytes(dev: str | None) -> int:
    """Bytes this host's interface has sent (its root qdisc's count); 0 without --link-dev."""
    if dev is None:
        return 0
    out = subprocess.run(["tc", "-s", "qdisc", "show", "dev", dev], capture_output=True,
                         text=True).stdout
    sent = re.findall(r"Sent (\d+) bytes", out)
    return int(sent[0]) if sent else 0


class Job:
    """What every contender is measured with: the world, this host's first rank, the hosts."""

    def __init__(self, dev: str | None) -> None:
        self.comm = MPI.COMM_WORLD
        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.first = local.Get_rank() == 0
        self.local_size = local.Get_size()
        self.hosts = self.comm.allreduce(1 if self.first else 0)
        self.dev = dev

    def host_bytes(self) -> int:
        """Sum over hosts of the bytes each host's link has sent."""
        mine = _link_bytes(self.dev) if self.first else 0
        return self.comm.allreduce(mine)

    def measure(self, fn: Callable[[], None], iters: int) -> tuple[float, int]:
        """(median seconds per call over iters, link bytes per call summed over hosts)."""
        fn()  # warm: buffers, connections, the response cache
        self.comm.Barrier()
        before = self.host_bytes()
        times = []
        for _ in range(iters):
            self.comm.Barrier()
            start = time.perf_counter()
            fn()
            times.append(self.comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
        self.comm.Barrier()
        return statistics.median(times), (self.host_bytes() - before) // iters


def _with_runtime(env: dict[str, str], body: Callable[[], dict]) -> dict:
    """Run body inside init()/shutdown() with env set (the strategy's configuration)."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        api.init()
        try:
            return body()
        finally:
            api.shutdown()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def allreduce_round(job: Job, nbytes: int, iters: int) -> dict[str, tuple[float, int]]:
    buf = np.ones(nbytes // 4, dtype=np.float32)
    out = np.empty_like(buf)
    results = {}
    for label, env in STRATEGIES.items():
        def body() -> dict:
            name = f"bench.{nbytes}"
            return {label: job.measure(lambda: collectives.allreduce_async(
                buf, out, name, ReduceOp.SUM).wait(), iters)}
        results.update(_with_runtime(env, body))
    results[MPI_OWN] = job.measure(lambda: job.comm.Allreduce(buf, out, op=MPI.SUM), iters)
    return results


def burst(job: Job, count: int = 256, nbytes: int = 16 << 10, iters: int = 5) -> dict:
    tensors = [np.ones(nbytes // 4, np.float32) for _ in range(count)]
    names = [f"burst.{i}" for i in range(count)]
    results = {}
    for label in ("hierarchical", "flat mpi"):
        def body() -> dict:
            def run() -> None:
                for handle in collectives.grouped_allreduce_async(
                        tensors, [None] * count, names, ReduceOp.SUM):
                    handle.wait()
            return {label: job.measure(run, iters)}
        results.update(_with_runtime(STRATEGIES[label], body))
    return results


def negotiation(job: Job, iters: int = 50) -> dict:
    """One 4-byte allreduce at a time, flat: under a name seen before (a cache hit: the
    negotiation is one bit-vector allreduce) and under a new name each time (a miss:
    every rank's request goes to the coordinator, which broadcasts the response)."""
    tiny = np.ones(1, np.float32)

    def body() -> dict:
        counter = iter(range(10**9))
        hit = job.measure(lambda: collectives.allreduce_async(
            tiny, tiny, "tiny", ReduceOp.SUM).wait(), iters)
        miss = job.measure(lambda: collectives.allreduce_async(
            tiny, tiny, f"tiny.{next(counter)}", ReduceOp.SUM).wait(), iters)
        return {"cache hit": hit, "cache miss": miss}
    return _with_runtime(STRATEGIES["flat mpi"], body)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m horovodish.bench.hosts",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[64],
                        help="allreduce sizes in MiB (default 64)")
    parser.add_argument("--link-rate", type=_rate_bits, required=True,
                        help="each host's link rate, e.g. 1gbit (for the lower bound)")
    parser.add_argument("--link-dev", help="interface whose sent bytes to count, e.g. eth0")
    parser.add_argument("--iters", type=int, default=3, help="timed calls per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-burst", action="store_true")
    parser.add_argument("--json", help="write the figures to this file (rank 0)")
    args = parser.parse_args(argv)
    job = Job(args.link_dev)
    rows = []
    for mib in args.sizes:
        nbytes = int(mib * (1 << 20)) // 4 * 4
        rounds = [allreduce_round(job, nbytes, args.iters) for _ in range(args.rounds)]
        share = 2 * (job.hosts - 1) / job.hosts
        row = {"bytes": nbytes, "hosts": job.hosts, "ranks": job.comm.Get_size(),
               "lower_bound_bytes_per_host": nbytes * share,
               "lower_bound_s": nbytes * share * 8 / args.link_rate}
        for label in rounds[0]:
            row[label] = {"seconds": min(r[label][0] for r in rounds),
                          "link_bytes_per_host": statistics.median(
                              r[label][1] for r in rounds) / job.hosts}
        rows.append(row)
    small = {} if args.no_burst else {**burst(job), **negotiation(job)}
    if job.comm.Get_rank() == 0:
        _report(rows, small, args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"allreduce": rows, "burst": {
                    k: {"seconds": v[0], "link_bytes": v[1]} for k, v in small.items()}}, f,
                    indent=1)


def _report(rows: list[dict], small: dict, args: argparse.Namespace) -> None:
    for row in rows:
        print(f"\nallreduce of {row['bytes'] / (1 << 20):g} MiB, {row['ranks']} ranks on "
              f"{row['hosts']} hosts, links at {args.link_rate / 1e9:g} Gbit/s: lower bound "
              f"{row['lower_bound_bytes_per_host'] / (1 << 20):.1f} MiB per host, "
              f"{row['lower_bound_s']:.3f} s")
        print(f"  {'strategy':14} {'seconds':>8} {'vs ring':>8} {'vs MPI':>7} "
              f"{'MiB/host':>9} {'x bound':>8}")
        ring, mpi = row["flat ring"]["seconds"], row[MPI_OWN]["seconds"]
        for label in (*STRATEGIES, MPI_OWN):
            seconds = row[label]["seconds"]
            sent = row[label]["link_bytes_per_host"]
            print(f"  {label:14} {seconds:8.3f} {ring / seconds:7.2f}x {mpi / seconds:6.2f}x "
                  f"{sent / (1 << 20):9.1f} {sent / row['lower_bound_bytes_per_host']:7.2f}x")
    for label, (seconds, sent) in small.items():
        what = "one 4-byte allreduce" if label.startswith("cache") else "burst of 256 x 16 KiB"
        print(f"{what}, {label}: {seconds * 1e3:.2f} ms, "
              f"{sent / (1 << 20):.2f} MiB over the links")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
