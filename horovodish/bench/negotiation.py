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
named). The slow ones go through the coordinator, as when the ranks' lists differ
(in order, or in which tensors a cycle caught); the first step also with every rank's
list alike, which each rank answers alone (the controller's unanimous cycles). And the fast path with small allreduces riding on it (``eager``: four float32
scalars, a loss and three metrics, every rank's gathered with the bit vectors and
reduced at every rank): rank 0's packing, controller cycle and reduction of the
gathered rows are timed, the plan forced whatever the limits say, and the row says
whether the default limit for ranks across hosts would let them ride, beside the
modelled exchange with and without them.
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

from ..common.entry import Entry
from ..common.execution.executor import Executor
from ..common.execution.fusion import plan_fusion
from ..common.handles import Completions
from ..common.messages import ReduceOp, Request, RequestType
from ..common.negotiation.controller import Controller
from ..common.negotiation.eager_plan import CROSS_HOST_EAGER_LIMIT, plan_eager
from ..common.negotiation.transport import Pending
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

    # Eager cycles: [vector | region] gathered into one (size, width) buffer, laid out
    # as mpi_transport's allgather delivers it; the other ranks' regions are filled by
    # ``fill_others`` once (their work), rank 0's row is copied in each cycle.
    def region(self, words: int, nbytes: int) -> np.ndarray:
        if getattr(self, "_layout", None) != (words, nbytes):
            width = words + (nbytes + 7) // 8
            self._send = np.zeros(width, dtype=np.uint64)
            self._received = np.zeros((self.size, width), dtype=np.uint64)
            self._rows = [self._received[rank, words:].view(np.uint8)[:nbytes]
                          for rank in range(self.size)]
            self._layout = (words, nbytes)
        return self._send[words:].view(np.uint8)[:nbytes]

    def fill_others(self, fill: Callable[[int, np.ndarray], None]) -> None:
        """fill(rank, row) for every other rank's row of the gathered buffer."""
        for rank in range(1, self.size):
            fill(rank, self._rows[rank])

    def start_gather_and(self, words: np.ndarray) -> Pending:
        start = time.perf_counter()
        self._send[:words.size] = words
        # What the allgather moves, not rank 0's work: every rank's vector (the same
        # as rank 0's) and rank 0's region.
        self._received[:, :words.size] = words
        self._received[0, words.size:] = self._send[words.size:]
        self.gathered_bytes = self._received.nbytes
        self.network_s += time.perf_counter() - start
        return _GatheredVectors(self._received[:, :words.size], self._rows)


class _GatheredVectors(Pending):
    """An eager exchange's outcome: rank 0 ANDs the gathered vectors itself, as
    mpi_transport's does (its work, timed)."""

    def __init__(self, vectors: np.ndarray, rows: list[np.ndarray]) -> None:
        super().__init__(vectors[0], rows)
        self._vectors = vectors

    def result(self) -> np.ndarray:
        return np.bitwise_and.reduce(self._vectors, axis=0)


def _allreduces(tensors: int, changed: int = -1) -> list[Request]:
    return [Request(f"allreduce.layer{i}.weight", RequestType.ALLREDUCE, "float32",
                    (64, 64 + (i % 7) + (1 if i == changed else 0)))
            for i in range(tensors)]


def _allgathers(tensors: int, rank: int) -> list[Request]:
    return [Request(f"allgather.features{i}", RequestType.ALLGATHER, "float32",
                    (1 + (rank * 7 + i) % 13, 32)) for i in range(tensors)]


class _Rank0:
    """Rank 0's controller over simulated peers."""

    def __init__(self, size: int, tensors: int, unanimous: bool = False) -> None:
        """unanimous: let every-rank-alike lists be answered without the coordinator
        (the peers do send rank 0's vector: the scenario must give them rank 0's list)."""
        self.peers = SimulatedPeers(size)
        self.controller = Controller(self.peers, cache_capacity=max(1024, tensors + 64))
        self.controller.unanimous = unanimous

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


def _allgather_model_s(size: int, nbytes: int) -> float:
    """An allgather of nbytes a rank by recursive doubling."""
    steps = math.ceil(math.log2(size)) if size > 1 else 0
    return steps * ALPHA_S + (size - 1) * nbytes / LINK_BYTES_PER_S


SCALARS = 4  # a loss and three metrics


def _scalar_requests() -> list[Request]:
    return [Request(f"metric{i}", RequestType.ALLREDUCE, "float32", (), reduce_op=ReduceOp.SUM)
            for i in range(SCALARS)]


def eager_scalars(size: int, repeats: int = 5) -> dict[str, Any]:
    """The eager row at one size: median work of ``repeats`` steady eager cycles (each
    after one untimed, which works out the views of a new layout), and the results of
    the last one (kept under 'result': rank r sends r + 1 + i for metric i)."""
    requests = _scalar_requests()
    rank0 = _Rank0(size, SCALARS)
    for _ in range(3):  # negotiated, recorded, replayed: the steady state
        cycle = rank0.cycle(requests, lambda rank: requests)["result"]
    groups = plan_fusion(cycle.responses, 64 << 20)
    plan = plan_eager(groups, cycle.cached_bits, size, limit=1 << 62)
    assert plan is not None, "four scalars always make a plan without a limit"
    rides = plan_eager(groups, cycle.cached_bits, size, CROSS_HOST_EAGER_LIMIT) is not None
    executor = Executor(None, 0, size)  # type: ignore[arg-type]  # no backend: eager only
    completions = Completions()
    controller, peers = rank0.controller, rank0.peers
    entries: dict[str, Entry] = {}
    controller.eager = plan
    controller.fill_eager = lambda plan, region: executor.pack_eager(plan, region, entries.get)
    peers.region(controller._vector_words, plan.nbytes)
    order = [[response.name for response in group] for group in plan.groups]
    offsets = {name: offset + 4 * index for names, offset in zip(order, plan.offsets)
               for index, name in enumerate(names)}

    def fill(rank: int, row: np.ndarray) -> None:
        for i, request in enumerate(requests):
            at = offsets[request.name]
            row[at:at + 4].view(np.float32)[0] = rank + 1 + i

    peers.fill_others(fill)
    times = []
    for _ in range(repeats + 1):
        entries.clear()
        for i, request in enumerate(requests):
            entries[request.name] = Entry(request, np.array(1.0 + i, np.float32), completions)
        gc.collect()
        peers.network_s = 0.0
        start = time.perf_counter()
        result = controller.cycle(requests)
        assert result.gathered is not None, "the eager cycle did not gather"
        for index, names in enumerate(order):
            executor.execute_gathered(plan, index, [entries[name] for name in names],
                                      result.gathered)
        times.append(time.perf_counter() - start - peers.network_s)
    vector_bytes = 8 * controller._vector_words
    return {"work_ms": statistics.median(times[1:]) * 1e3, "slow_path": False,
            "gathered_mb": peers.gathered_bytes / 1e6, "bcast_mb": 0.0,
            "model_network_ms": _allgather_model_s(size, vector_bytes + plan.nbytes) * 1e3,
            "model_without_ms": (_model_s(size, False, 0, 0) +
                                 _model_s(size, False, 0, 0)) * 1e3,
            "rides_by_default": rides,
            "result": {name: entry.wait(0) for name, entry in entries.items()}}


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
    rows["first step, every list alike"] = _repeat(
        lambda: (_Rank0(size, tensors, unanimous=True),
                 lambda r: r.cycle(plain, lambda _: plain)), repeats)
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


EAGER_SCENARIO = f"steady, {SCALARS} scalars ride along"


def run(ranks: tuple[int, ...] = RANKS, tensors: tuple[int, ...] = TENSORS,
        repeats: int = 5) -> dict[str, Any]:
    table = []
    for count in tensors:
        for size in ranks:
            for scenario, row in scenarios(size, count, repeats).items():
                row.pop("result")
                table.append({"ranks": size, "tensors": count, "scenario": scenario, **row})
    for size in ranks:
        row = eager_scalars(size, repeats)
        row.pop("result")
        table.append({"ranks": size, "tensors": SCALARS, "scenario": EAGER_SCENARIO, **row})
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
        without = f" (without: {row['model_without_ms']:.2f}, by default: " \
            f"{'rides' if row['rides_by_default'] else 'does not ride'})" \
            if "model_without_ms" in row else ""
        print(f"{row['ranks']:>6} {row['tensors']:>7}  {row['scenario']:<32} "
              f"{row['work_ms']:>8.2f} {row['model_network_ms']:>10.2f}{without}")
    if args.record:
        from . import records
        command = "python -m horovodish.bench.negotiation " + " ".join(argv or sys.argv[1:])
        print(f"record: {records.write(args.record, 'negotiation', figures, command.strip())}")


if __name__ == "__main__":
    main()
