"""The coordinator at thousands of simulated ranks, in one process: every rank's request
record built as that rank builds it, gathered as MPI delivers them, checked against
references computed here rank by rank."""
from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest

from horovodish.common.messages import ReduceOp, Request, RequestType
from horovodish.common.negotiation.coordinator import Coordinator, format_ranks
from horovodish.common.negotiation.request_records import GatheredRecords, encode

from .fake_world import FakeWorld

SIZE = 4096


def ar(name: str, shape=(8, 3), dtype="float32", **kw) -> Request:
    return Request(name, RequestType.ALLREDUCE, dtype, shape, **kw)


def ag(name: str, rows: int, dtype="float32") -> Request:
    return Request(name, RequestType.ALLGATHER, dtype, (rows, 5))


def negotiate(per_rank: list[list[Request]], coordinator: Coordinator | None = None):
    coordinator = coordinator or Coordinator(range(len(per_rank)))
    coordinator.add_gathered(GatheredRecords.of([encode(requests) for requests in per_rank]))
    return coordinator, coordinator.ready_responses()


@pytest.mark.parametrize("odd", [0, 2731, SIZE - 1])
def test_a_dtype_mismatch_on_one_of_4096_ranks_is_named(odd):
    batch = [ar(f"layer{i}") for i in range(20)]
    per_rank = [batch] * SIZE
    per_rank[odd] = batch[:7] + [ar("layer7", dtype="float64")] + batch[8:]
    _, responses = negotiate(per_rank)
    assert [r.name for r in responses] == [f"layer{i}" for i in range(20)]
    errors = {r.name: r.error for r in responses if r.error is not None}
    assert list(errors) == ["layer7"]
    others = f"{format_ranks(sorted(set(range(SIZE)) - {odd}))}: float32"
    mine = f"rank {odd}: float64"
    parts = [mine, others] if odd == 0 else [others, mine]  # in order of lowest rank
    assert errors["layer7"] == (
        f"allreduce of tensor 'layer7': ranks disagree on the dtype ({'; '.join(parts)}). "
        "Every rank must submit the same dtype for a name.")
    if odd == 2731:
        assert "ranks 0-2730, 2732-4095: float32; rank 2731: float64" in errors["layer7"]


def test_every_kind_of_disagreement_at_scale_is_caught():
    """One rank of 4,096 differs in one field at a time: each is an error naming it."""
    base = ar("t", prescale=0.5)
    cases = {
        "shape": base._replace(shape=(8, 4)),
        "reduce op": base._replace(reduce_op=ReduceOp.MAX),
        "prescale factor": base._replace(prescale=0.25),
        "collective": base._replace(type=RequestType.BROADCAST, root_rank=0),
        "device class": base._replace(device="cuda"),
    }
    for what, odd_request in cases.items():
        per_rank = [[base]] * SIZE
        per_rank[1234] = [odd_request]
        (response,) = negotiate(per_rank)[1]
        assert response.error is not None and f"on the {what} (" in response.error, what
        assert "rank 1234:" in response.error and "ranks 0-1233, 1235-4095:" in response.error


def test_allgather_first_dims_and_alltoall_splits_per_rank():
    rng = np.random.default_rng(3)
    rows = rng.integers(0, 9, SIZE)
    per_rank = [[ar("a"), ag("g", int(rows[rank]))] for rank in range(SIZE)]
    _, responses = negotiate(per_rank)
    gathered = {r.name: r for r in responses}
    assert gathered["g"].error is None
    assert gathered["g"].first_dims == tuple(int(x) for x in rows)
    assert gathered["g"].shape == (int(rows[0]), 5)

    size = 64
    splits = rng.integers(0, 4, (size, size))
    explicit = [[Request("x", RequestType.ALLTOALL, "int32", (int(splits[r].sum()), 2),
                         splits=tuple(int(s) for s in splits[r]))] for r in range(size)]
    (response,) = negotiate(explicit)[1]
    assert response.error is None and np.array_equal(np.array(response.splits), splits)
    even = [[Request("y", RequestType.ALLTOALL, "int32", (size * (r % 3), 2))]
            for r in range(size)]
    (response,) = negotiate(even)[1]
    assert [row[0] for row in response.splits] == [r % 3 for r in range(size)]
    assert all(len(set(row)) == 1 for row in response.splits)


def _reference_order(cycles: list[list[list[Request]]], size: int) -> list[list[str]]:
    """Per cycle, the names that complete in it, in order of first arrival (cycle, then
    rank, then the rank's own order): the order the coordinator promises."""
    seen: dict[str, set[int]] = {}
    arrival: list[str] = []
    out = []
    for cycle in cycles:
        for rank, requests in enumerate(cycle):
            for request in requests:
                if request.name not in seen:
                    seen[request.name] = set()
                    arrival.append(request.name)
                seen[request.name].add(rank)
        done = [name for name in arrival if len(seen[name]) == size]
        for name in done:
            arrival.remove(name)
            del seen[name]
        out.append(done)
    return out


def test_response_order_follows_first_arrival_across_cycles():
    """Ranks submit 300 names in their own orders over three cycles (in groups that send
    the same list, and some alone): the responses come in the reference order."""
    size, names = SIZE, [f"n{i}" for i in range(300)]
    rng = random.Random(7)
    orders = [names[:]] + [rng.sample(names, len(names)) for _ in range(5)]
    cuts = [(100, 200), (50, 250), (150, 160)]
    cycles: list[list[list[Request]]] = [[], [], []]
    for rank in range(size):
        order = orders[rank % len(orders)] if rank % 97 else rng.sample(names, len(names))
        a, b = cuts[rank % len(cuts)]
        for cycle, part in zip(cycles, (order[:a], order[a:b], order[b:])):
            cycle.append([ar(name) for name in part])
    coordinator = Coordinator(range(size))
    got = [[r.name for r in negotiate(cycle, coordinator)[1]] for cycle in cycles]
    assert got == _reference_order(cycles, size)
    assert sum(map(len, got)) == len(names)


def test_records_of_unequal_length_and_joined_ranks():
    """Half the ranks bring one more tensor (records of two lengths); ranks that joined
    count as ready for allreduce only."""
    size = 1000
    per_rank = [[ar("a")] + ([ar("b")] if rank % 2 else []) for rank in range(size)]
    coordinator, responses = negotiate(per_rank)
    assert [r.name for r in responses] == ["a"]
    assert set(coordinator.waiting["b"]) == set(range(1, size, 2))
    join = Request("join", RequestType.JOIN, "", ())
    _, responses = negotiate([[join] if rank % 2 == 0 else [] for rank in range(size)],
                             coordinator)
    assert [r.name for r in responses] == ["b"]


def test_the_record_is_the_same_bytes_in_every_process():
    """Ranks group by digest: equal requests must encode alike whatever the process's
    string hashing or object identity (a digest that differed would cost a group per
    rank; one that collided would be a wrong answer)."""
    code = ("import sys; from horovodish.common.messages import Request, RequestType as T;"
            "from horovodish.common.negotiation.request_records import encode;"
            "d = ''.join(['float', '32']);"
            "r = [Request('w' + str(i), T.ALLGATHER, d if i % 2 else 'float32', (i, 3)) "
            "for i in range(5)];"
            "sys.stdout.write(encode(r).hex())")
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}, check=True).stdout
               for seed in ("1", "2", "random")}
    assert len(outputs) == 1
    here = encode([Request(f"w{i}", RequestType.ALLGATHER, "float32", (i, 3))
                   for i in range(5)]).hex()
    assert outputs == {here}


def test_every_rank_gets_the_same_order_and_dims_through_the_controllers():
    """Six real controllers (FakeWorld) submitting in different orders, allgathers of
    per-rank first dims among allreduces: identical responses everywhere."""
    size = 6
    world = FakeWorld(size)
    requests = {rank: [ar("x"), ag("g", rank + 1), ar("y"), ag("h", 2 * rank)]
                for rank in range(size)}
    for rank in range(size):
        random.Random(rank).shuffle(requests[rank])
    results = world.cycle(requests)
    orders = [[(r.name, r.first_dims) for r in result.responses] for result in results]
    assert all(order == orders[0] for order in orders)
    dims = dict(orders[0])
    assert dims["g"] == tuple(range(1, size + 1))
    assert dims["h"] == tuple(2 * r for r in range(size))


def test_allgather_first_dims_that_change_every_step_need_no_slow_cycle():
    """After the first step, a cached allgather whose first dimension changes on some
    ranks is a cache hit whose dims ride one small allgather: no slow-path cycle, the
    right dims every step, on every rank; a change of anything else still misses."""
    size = 3
    world = FakeWorld(size)
    rng = np.random.default_rng(5)
    for step in range(6):
        rows = rng.integers(0, 5, size) if step % 2 else np.full(size, 2)
        results = world.cycle({r: [ar("loss", shape=(1,)), ag("batch", int(rows[r]))]
                               for r in range(size)})
        assert [result.negotiated_slow for result in results] == [step == 0] * size, step
        for result in results:
            got = {resp.name: resp for resp in result.responses}
            assert got["batch"].error is None
            assert got["batch"].first_dims == tuple(int(x) for x in rows), step
            assert got["batch"].shape == (int(rows[0]), 5)
    assert world.controllers[0].slow_cycles == 1
    changed = world.cycle({r: [ag("batch", 1, dtype="float64" if r == 1 else "float32")]
                           for r in range(size)})
    assert changed[0].negotiated_slow and "dtype" in changed[0].responses[0].error


@pytest.mark.parametrize("size", [2, 1024, 4096])
def test_scalars_that_ride_along_are_summed_over_every_simulated_rank(size):
    """The fast path with four scalars riding on the bit vectors (bench/negotiation.py's
    eager row): rank 0's real controller and executor reduce the gathered rows of size
    ranks, rank r sending r + 1 + i for metric i; the sums are checked against the
    closed form, and the default limit across hosts lets them ride exactly where their
    region's bytes times the other ranks fit under it."""
    from horovodish.bench.negotiation import eager_scalars
    from horovodish.common.negotiation.eager_plan import CROSS_HOST_EAGER_LIMIT
    row = eager_scalars(size, repeats=2)
    for i in range(4):
        got = float(row["result"][f"metric{i}"])
        expected = sum(rank + 1 + i for rank in range(size))
        assert got == expected, f"metric{i} over {size} ranks: {got}, not {expected}"
    assert not row["slow_path"] and row["work_ms"] > 0
    assert row["rides_by_default"] == (16 * (size - 1) <= CROSS_HOST_EAGER_LIMIT)
