"""Rank 0's negotiation at thousands of ranks, simulated in one process.

    python -m horovodish.bench.negotiation [--record docs/records] [--quick]

Rank 0's real ``Controller`` and ``Coordinator`` run every cycle; the other ranks are
scripted: each one's request record is built as that rank would build it (not timed:
that is its own work, done in parallel), the records are joined as MPI's gather would
deliver them into rank 0's buffer (not timed: the network's part), and the bit-vector
AND returns what every rank agreeing would give. What is timed is rank 0's Python work
in the cycle: classifying its requests, reading the gathered records, validating and
ordering responses, and pickling the broadcast. The network's part is modelled apart
(docs/scaling.md's model, with the constants in the record).

Scenarios, each at 2, 128, 1,024 and 4,096 ranks, for 162 and 1,000 tensors:
first step (every tensor uncached), steady (every tensor a cache hit, the fast path),
one miss (one tensor changed shape on every rank, the rest cache hits), allgather with
first dimensions that differ by rank, and a dtype mismatch on one rank (which must be
named).
"""
from __future__ import annotations

import argparse
import gc
import math
import pickle
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

from ..common.messages import Request, RequestType
from ..common.negotiation.controller import Controller
from ..common.negotiation.request_records import GatheredRecords, encode
from ..common.negotiation.transport import Transport

RANKS = (2, 128, 1024, 4096)
TENSORS = (162, 1000)
# The network model (docs/scaling.md): one message's latency between hosts, and a
# host link's payload bandwidth (25 Gbit/s).
ALPHA_S = 20e-6
LINK_BYTES_PER_S = 25e9 / 8


class SimulatedPeers(Transport):
    """Rank 0's transport in a world of ``size`` ranks whose others are scripted: their
    records for the next gather are ``others`` (ranks 1 .. size-1, in order)."""

    def __init__(self, size: int) -> None:
        self.rank, self.size = 0, size
        self.others: list[bytes] = []
        self.network_s = 0.0  # time spent doing the network's part (excluded)
        self.gathered_bytes = 0
        self.bcast_bytes = 0

    def allreduce_and(self, words: np.ndarray) -> np.ndarray:
        return words  # every other rank sends the same vector

    def gather(self, obj: Any) -> list[Any] | None:
        raise NotImplementedError("the simulated peers only send request records")

    def gather_records(self, record: bytes) -> GatheredRecords:
        start = time.perf_counter()
        gathered = GatheredRecords.of([record, *self.others])
        # Held until the next gather: its buffer is the transport's to reuse
        # (MPITransport keeps one), not freed inside the cycle.
        self.last = gathered
        self.gathered_bytes = int(gathered.offsets[-1])
        self.network_s += time.perf_counter() - start
        return gathered

    def bcast(self, obj: Any) -> Any:
        self.bcast_bytes = len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        return obj  # pickling is rank 0's work under MPI: counted


def _allreduces(tensors: int, changed: int = -1) -> list[Request]:
    return [Request(f"allreduce.layer{i}.weight", RequestType.ALLREDUCE, "float32",
                    (64, 64 + (i % 7) + (1 if i == changed else 0)))
            for i in range(tensors)]


def _allgathers(tensors: int, rank: int) -> list[Request]:
    return [Request(f"allgather.features{i}", RequestType.ALLGATHER, "float32",
                    (1 + (rank * 7 + i) % 13, 32)) for i in range(tensors)]


class _Rank0:
    """Rank 0's controller over simulated peers."""

    def __init__(self, size: int, tensors: int) -> None:
        self.peers = SimulatedPeers(size)
        self.controller = Controller(self.peers, cache_capacity=max(1024, tensors + 64))

    def cycle(self, mine: list[Request], others: Callable[[int], list[Request]] | None
              ) -> dict[str, Any]:
        """One cycle; others(rank) gives rank's uncached requests (None: none)."""
        size = self.peers.size
        if others is None:
            self.peers.others = []
        else:
            same = others(1)
            shared = encode(same)
            self.peers.others = [shared if others(rank) is same else encode(others(rank))
                                 for rank in range(1, size)] if size > 1 else []
        self.peers.network_s = 0.0
        start = time.perf_counter()
        result = self.controller.cycle(mine)
        work = time.perf_counter() - start - self.peers.network_s
        return {"work_s": work, "slow": result.negotiated_slow, "result": result}


def _model_s(size: int, slow: bool, gathered: int, bcast: int) -> float:
    steps = math.ceil(math.log2(size)) if size > 1 else 0
    cost = 2 * steps * ALPHA_S  # the bit-vector AND: recursive doubling
    if slow:
        cost += steps * ALPHA_S + gathered / LINK_BYTES_PER_S  # gather into rank 0
        cost += steps * (ALPHA_S + bcast / LINK_BYTES_PER_S)  # binomial broadcast
    return cost


def _row(rank0: _Rank0, outcome: dict[str, Any], repeats: list[float]) -> dict[str, Any]:
    peers = rank0.peers
    slow = outcome["slow"]
    gathered = peers.gathered_bytes if slow else 0
    bcast = peers.bcast_bytes if slow else 0
    return {"work_ms": statistics.median(repeats) * 1e3, "slow_path": slow,
            "gathered_mb": gathered / 1e6, "bcast_mb": bcast / 1e6,
            "model_network_ms": _model_s(peers.size, slow, gathered, bcast) * 1e3}


def _repeat(make: Callable[[], tuple[_Rank0, Callable[[_Rank0], dict[str, Any]]]],
            repeats: int) -> dict[str, Any]:
    """Median work of ``repeats`` fresh runs of one scenario (its setup not timed)."""
    times, rank0, outcome = [], None, None
    for _ in range(repeats):
        rank0, run = make()
        gc.collect()  # the setup's garbage is not the cycle's to collect
        outcome = run(rank0)
        times.append(outcome["work_s"])
    assert rank0 is not None and outcome is not None
    row = _row(rank0, outcome, times)
    row["result"] = outcome["result"]
    return row


def scenarios(size: int, tensors: int, repeats: int = 5) -> dict[str, dict[str, Any]]:
    """Every scenario's row at one size (results kept under 'result' for the tests)."""
    plain = _allreduces(tensors)
    rows: dict[str, dict[str, Any]] = {}

    def fresh() -> _Rank0:
        return _Rank0(size, tensors)

    def warmed() -> _Rank0:
        rank0 = fresh()
        rank0.cycle(plain, lambda rank: plain)
        rank0.cycle(plain, None)  # the first all-hit cycle records what replays
        return rank0

    rows["first step"] = _repeat(lambda: (fresh(), lambda r: r.cycle(plain, lambda _: plain)),
                                 repeats)
    rows["steady"] = _repeat(lambda: (warmed(), lambda r: r.cycle(plain, None)), repeats)
    changed = _allreduces(tensors, changed=0)
    rows["one miss"] = _repeat(
        lambda: (warmed(), lambda r: r.cycle(changed, lambda _: changed[:1])), repeats)
    gathers = {rank: _allgathers(tensors, rank) for rank in range(size)}
    rows["allgather, first dims by rank"] = _repeat(
        lambda: (fresh(), lambda r: r.cycle(gathers[0], gathers.__getitem__)), repeats)
    odd = size * 2 // 3
    mismatched = [plain[0]._replace(dtype="float64")] + plain[1:]
    rows["dtype differs on one rank"] = _repeat(
        lambda: (fresh(), lambda r: r.cycle(
            plain, lambda rank: mismatched if rank == odd else plain)), repeats)
    return rows


def run(ranks: tuple[int, ...] = RANKS, tensors: tuple[int, ...] = TENSORS,
        repeats: int = 5) -> dict[str, Any]:
    table = []
    for count in tensors:
        for size in ranks:
            for scenario, row in scenarios(size, count, repeats).items():
                row.pop("result")
                table.append({"ranks": size, "tensors": count, "scenario": scenario, **row})
    return {"rows": table, "repeats": repeats, "alpha_us": ALPHA_S * 1e6,
            "link_gbit_s": LINK_BYTES_PER_S * 8 / 1e9}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m horovodish.bench.negotiation",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--record", metavar="FOLDER", help="write a negotiation record here")
    parser.add_argument("--quick", action="store_true", help="2 and 128 ranks, 162 tensors")
    args = parser.parse_args(argv)
    figures = run((2, 128), (162,), 1) if args.quick else run()
    print(f"{'ranks':>6} {'tensors':>7}  {'scenario':<32} {'work ms':>8} {'network ms':>10}")
    for row in figures["rows"]:
        print(f"{row['ranks']:>6} {row['tensors']:>7}  {row['scenario']:<32} "
              f"{row['work_ms']:>8.2f} {row['model_network_ms']:>10.2f}")
    if args.record:
        from . import records
        command = "python -m horovodish.bench.negotiation " + " ".join(argv or sys.argv[1:])
        print(f"record: {records.write(args.record, 'negotiation', figures, command.strip())}")


if __name__ == "__main__":
    main()
