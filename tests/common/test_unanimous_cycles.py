"""Unanimous cycles: a list of uncached requests every rank sends alike is answered by
each rank alone, with no gather at the coordinator and no broadcast from it, and with
exactly the responses, order and cache bits the coordinator would have given."""
from __future__ import annotations

import random

from horovodish.common.messages import ReduceOp, Request, RequestType
from horovodish.common.negotiation.eager_plan import plan_eager

from .fake_world import FakeWorld


def ar(name: str, shape=(4,), dtype="float32", **kw) -> Request:
    return Request(name=name, type=RequestType.ALLREDUCE, dtype=dtype, shape=shape, **kw)


def _kinds() -> list[Request]:
    """One of each kind a rank may answer alone, with the fields that vary."""
    return [
        ar("a.sum", (3, 2), reduce_op=ReduceOp.SUM),
        ar("a.avg", (7,), "float64", reduce_op=ReduceOp.AVERAGE, prescale=0.5, postscale=3.0),
        ar("a.max", (), "int32", reduce_op=ReduceOp.MAX),
        Request("b.root1", RequestType.BROADCAST, "float32", (5,), root_rank=1),
        Request("rs", RequestType.REDUCESCATTER, "float32", (6, 2), reduce_op=ReduceOp.SUM),
        Request("barrier", RequestType.BARRIER, "uint8", ()),
        Request("g", RequestType.ALLGATHER, "float32", (3, 2)),
        Request("t.even", RequestType.ALLTOALL, "float32", (6,)),
        Request("t.splits", RequestType.ALLTOALL, "int64", (6, 2), splits=(1, 2, 3)),
    ]


def _worlds(size: int, cache_capacity: int = 16) -> tuple[FakeWorld, FakeWorld]:
    """A world with unanimous cycles and one where every list goes to the coordinator."""
    alone, coordinated = FakeWorld(size, cache_capacity), FakeWorld(size, cache_capacity)
    for controller in coordinated.controllers:
        controller.unanimous = False
    return alone, coordinated


def _bits(world: FakeWorld, rank: int) -> list[tuple[int, str]]:
    return sorted((bit, response.name) for bit, response in
                  world.controllers[rank].cache.bits())


def test_a_list_every_rank_sends_alike_is_answered_without_the_coordinator():
    alone, coordinated = _worlds(3)
    batch = _kinds()
    got = alone.cycle({rank: batch for rank in range(3)})
    want = coordinated.cycle({rank: batch for rank in range(3)})
    assert alone.exchange.calls["gather"] == alone.exchange.calls["bcast"] == 0
    assert coordinated.exchange.calls["gather"] == 1
    for rank in range(3):
        assert got[rank].responses == want[rank].responses  # every field, in order
        assert got[rank].negotiated_slow
        assert _bits(alone, rank) == _bits(coordinated, rank)
        assert alone.controllers[rank].unanimous_cycles == 1
    # The cache entries made alone serve the next cycle as the coordinator's do.
    again = alone.cycle({rank: batch for rank in range(3)})
    assert [r.name for r in again[0].responses] == sorted(
        (r.name for r in batch), key=[r.name for r in got[0].responses].index)
    assert not again[0].negotiated_slow


def test_lists_that_differ_go_to_the_coordinator_and_mismatches_are_named():
    alone, _ = _worlds(2)
    results = alone.cycle({0: [ar("x"), ar("y")], 1: [ar("y"), ar("x")]})
    assert alone.exchange.calls["gather"] == 1
    assert [r.name for r in results[0].responses] == [r.name for r in results[1].responses]
    results = alone.cycle({0: [ar("z", dtype="float32")], 1: [ar("z", dtype="float64")]})
    for rank in range(2):
        error = results[rank].responses[0].error
        assert error is not None and "'z'" in error and "dtype" in error
        assert "float32" in error and "float64" in error
    assert alone.controllers[0].unanimous_cycles == 0


def test_join_and_rows_or_splits_that_differ_go_to_the_coordinator():
    """An allgather's first dimension and an alltoall's splits are outside the record's
    own digest: ranks that differ only there must still get the coordinator's answer
    (each rank's rows, each rank's splits), not each its own."""
    alone, coordinated = _worlds(2)
    differing = [
        {0: Request("g", RequestType.ALLGATHER, "float32", (3, 2)),
         1: Request("g", RequestType.ALLGATHER, "float32", (5, 2))},
        {0: Request("t", RequestType.ALLTOALL, "float32", (4,), splits=(1, 3)),
         1: Request("t", RequestType.ALLTOALL, "float32", (4,), splits=(2, 2))},
        {0: Request("u", RequestType.ALLTOALL, "float32", (4,)),
         1: Request("u", RequestType.ALLTOALL, "float32", (6,))},
        {rank: Request("join", RequestType.JOIN, "uint8", ()) for rank in range(2)},
    ]
    for requests in differing:
        calls = alone.exchange.calls["gather"]
        got = alone.cycle({rank: [request] for rank, request in requests.items()})
        want = coordinated.cycle({rank: [request] for rank, request in requests.items()})
        assert alone.exchange.calls["gather"] == calls + 1, requests[0]
        for rank in range(2):
            assert got[rank].responses == want[rank].responses
    assert alone.controllers[0].unanimous_cycles == 0
    g = alone.controllers[1].cache.cached_as("g")
    assert g is not None and g.response.first_dims == (3, 5)


def test_names_the_coordinator_holds_do_not_change_a_unanimous_answer():
    """Rank 0 sent a name rank 1 has not: a list both then send alike is answered
    alone, as the coordinator would, and the held name later by the coordinator."""
    alone, coordinated = _worlds(2)
    for world in (alone, coordinated):
        world.cycle({0: [ar("held")]})
    got = alone.cycle({0: [ar("y")], 1: [ar("y")]})
    want = coordinated.cycle({0: [ar("y")], 1: [ar("y")]})
    assert got[0].responses == want[0].responses and [r.name for r in got[1].responses] == ["y"]
    assert alone.controllers[0].unanimous_cycles == 1 and alone.exchange.calls["gather"] == 1
    got = alone.cycle({1: [ar("held")]})
    want = coordinated.cycle({1: [ar("held")]})
    assert got[0].responses == want[0].responses and [r.name for r in got[1].responses] == ["held"]
    assert not alone.controllers[0].has_pending


def test_rank_0s_tuned_parameters_still_reach_every_rank():
    alone, _ = _worlds(2)
    alone.controllers[0].params_to_send = {"fusion_threshold": 1 << 20}
    results = alone.cycle({0: [ar("p")], 1: [ar("p")]})
    assert alone.exchange.calls["bcast"] == 1
    assert results[1].params == {"fusion_threshold": 1 << 20}
    assert [r.name for r in results[1].responses] == ["p"]


def test_unanimous_and_coordinated_worlds_agree_on_random_streams():
    """The same random streams (lists alike on every rank half the time, partial
    readiness, shape changes, several kinds, evictions from a small cache) through both
    worlds: every cycle gives the same responses, errors and cache bits."""
    rng = random.Random(11)
    size = 3
    alone, coordinated = _worlds(size, cache_capacity=10)
    pool = [f"n{i}" for i in range(14)]
    kinds = {name: rng.choice([RequestType.ALLREDUCE, RequestType.BROADCAST,
                               RequestType.ALLGATHER, RequestType.REDUCESCATTER,
                               RequestType.ALLTOALL])
             for name in pool}
    pending: list[set[str]] = [set() for _ in range(size)]

    def request(name: str, rows: int) -> Request:
        return Request(name, kinds[name], "float32", (rows, 2),
                       root_rank=1 if kinds[name] is RequestType.BROADCAST else -1)

    owed: list[list[str]] = [[] for _ in range(size)]  # names a rank has yet to send
    for step in range(300):
        requests: dict[int, list[Request]] = {}
        if any(owed):  # the ranks that held back send the rest: nothing alike
            for rank in range(size):
                requests[rank] = [request(n, 3) for n in owed[rank]]
                owed[rank] = []
        else:
            fresh = [f"u{step}.{i}" for i in range(rng.randint(0, 2))]  # unnamed ops, say
            for name in fresh:
                kinds[name] = RequestType.ALLREDUCE
            shared = [n for n in rng.sample(pool, rng.randint(0, 3))
                      if not any(n in mine for mine in pending)] + fresh
            alike = rng.random() < 0.6  # every rank sends the same list now
            for rank in range(size):
                now = len(shared) if alike else rng.randint(0, len(shared))
                rows = 3 if rng.random() < 0.97 else 5  # now and then a shape that differs
                requests[rank] = [request(n, rows) for n in shared[:now]]
                owed[rank] = shared[now:]
        for rank in range(size):
            pending[rank].update(r.name for r in requests[rank])
        got, want = alone.cycle(requests), coordinated.cycle(requests)
        for rank in range(size):
            assert [(r.name, r.error) for r in got[rank].responses] == \
                [(r.name, r.error) for r in want[rank].responses], step
            assert got[rank].responses == want[rank].responses, step
            assert _bits(alone, rank) == _bits(coordinated, rank), step
            pending[rank].difference_update(r.name for r in got[rank].responses)
    # Every name was answered but those some rank has yet to send.
    assert set().union(*pending) <= set().union(*map(set, owed))
    assert alone.controllers[0].unanimous_cycles > 40  # the streams did exercise the unanimous path
    assert coordinated.controllers[0].unanimous_cycles == 0


def _speculating(world: FakeWorld, packs=lambda rank: True) -> None:
    """Every controller of world plans fresh allreduces as one group riding along and
    packs rank r's region with the byte r + 1 (where packs(r) lets it)."""
    for rank, controller in enumerate(world.controllers):
        transport = controller.transport
        transport.region_capacity = lambda words: 1 << 16
        # As through shared memory: a plain AND is the same exchange with no region, so
        # ranks that bring data and ranks that do not meet in one.
        transport.start_allreduce_and = \
            lambda words, t=transport: (t.region(words.size, 0), t.start_gather_and(words))[1]

        def fill(plan, region, rank=rank):
            region[:] = rank + 1
            return packs(rank)
        controller.fill_eager = fill
        controller.speculate = lambda responses: plan_eager([responses], 0, world.size, 1 << 20)


def test_a_unanimous_list_of_small_allreduces_brings_every_ranks_data():
    world = FakeWorld(3)
    _speculating(world)
    batch = [ar("s1", (4,)), ar("s2", (3,), "float64")]
    results = world.cycle({rank: batch for rank in range(3)})
    for rank, result in enumerate(results):
        assert [r.name for r in result.responses] == ["s1", "s2"]
        assert result.plan is not None and result.gathered is not None
        assert [[r.name for r in group] for group in result.plan.groups] == [["s1", "s2"]]
        assert [int(row[0]) for row in result.gathered] == [1, 2, 3]  # each rank's bytes
        assert world.controllers[rank].speculated_cycles == 1
    assert world.exchange.calls["gather"] == 1  # the exchange's, not the coordinator's


def test_the_data_is_ignored_unless_every_rank_packed_and_nothing_cached_is_ready():
    world = FakeWorld(2)
    _speculating(world, packs=lambda rank: rank == 0)  # rank 1 cannot pack
    results = world.cycle({0: [ar("p")], 1: [ar("p")]})
    assert all(r.gathered is None and [x.name for x in r.responses] == ["p"] for r in results)
    assert world.controllers[0].unanimous_cycles == 1  # answered alone all the same
    world = FakeWorld(2)
    _speculating(world)
    world.cycle({0: [ar("c")], 1: [ar("c")]})  # c is cached from here
    results = world.cycle({0: [ar("c"), ar("q")], 1: [ar("c"), ar("q")]})
    assert all(r.gathered is None and [x.name for x in r.responses] == ["c", "q"]
               for r in results)
    results = world.cycle({0: [ar("x"), ar("y")], 1: [ar("y"), ar("x")]})  # lists differ
    assert all(r.gathered is None for r in results)
    assert world.controllers[0].speculated_cycles == 1  # the first cycle's only
