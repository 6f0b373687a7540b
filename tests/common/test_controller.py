"""Controller and coordinator logic in one process with a fake transport."""
from __future__ import annotations

import pytest

from horovodish.common.execution.buffers import FusionBuffers
from horovodish.common.execution.fusion import plan_fusion
from horovodish.common.messages import ReduceOp, Request, RequestType, Response

from .fake_world import FakeWorld


def ar(name: str, shape=(4,), dtype="float32", **kw) -> Request:
    return Request(name=name, type=RequestType.ALLREDUCE, dtype=dtype, shape=shape, **kw)


def names(result) -> list[str]:
    return [r.name for r in result.responses]


def test_same_order_on_every_rank_whatever_the_submit_order():
    world = FakeWorld(3)
    batch = [ar(n) for n in "abcdef"]
    results = world.cycle({0: batch, 1: batch[::-1], 2: batch[2:] + batch[:2]})
    assert names(results[0]) == names(results[1]) == names(results[2])
    assert sorted(names(results[0])) == list("abcdef")


def test_ready_only_when_every_rank_submitted():
    world = FakeWorld(2)
    first = world.cycle({0: [ar("x")]})
    assert names(first[0]) == names(first[1]) == []
    assert world.controllers[0].has_pending and not world.controllers[1].has_pending
    second = world.cycle({1: [ar("x")]})
    assert names(second[0]) == names(second[1]) == ["x"]
    assert not world.controllers[0].has_pending


def test_cache_hit_uses_one_allreduce_and_no_coordinator_round_trip():
    world = FakeWorld(2)
    world.cycle({0: [ar("x"), ar("y")], 1: [ar("y"), ar("x")]})
    calls = dict(world.exchange.calls)
    results = world.cycle({0: [ar("y"), ar("x")], 1: [ar("x"), ar("y")]})
    assert sorted(names(results[0])) == ["x", "y"] and names(results[0]) == names(results[1])
    assert world.exchange.calls["allreduce_and"] == calls["allreduce_and"] + 1
    assert world.exchange.calls["gather"] == calls["gather"]
    assert not results[0].negotiated_slow
    assert world.controllers[0].fast_cycles >= 1


def test_cached_tensor_waits_for_the_late_rank():
    world = FakeWorld(2)
    world.cycle({0: [ar("x")], 1: [ar("x")]})
    early = world.cycle({0: [ar("x")]})
    assert names(early[0]) == [] and not early[0].negotiated_slow
    late = world.cycle({1: [ar("x")]})
    assert names(late[0]) == names(late[1]) == ["x"]


def test_only_the_cached_tensors_every_rank_has_ready_run():
    """Rank 0 has three cached tensors ready, rank 1 one of them: only that one runs
    (on both), and the others wait on rank 0 until rank 1 submits them."""
    world = FakeWorld(2)
    world.cycle({0: [ar(n) for n in "abc"], 1: [ar(n) for n in "cab"]})
    partial = world.cycle({0: [ar(n) for n in "abc"], 1: [ar("b")]})
    assert names(partial[0]) == names(partial[1]) == ["b"]
    assert not partial[0].negotiated_slow
    rest = world.cycle({1: [ar("c"), ar("a")]})
    assert sorted(names(rest[0])) == ["a", "c"] and names(rest[0]) == names(rest[1])
    assert not any(c.has_pending for c in world.controllers)


def test_cache_invalidation_when_one_rank_changes_shape():
    world = FakeWorld(2)
    world.cycle({0: [ar("x")], 1: [ar("x")]})
    results = world.cycle({0: [ar("x")], 1: [ar("x", shape=(5,))]})
    assert results[0].negotiated_slow
    (response,) = results[0].responses
    assert response.error is not None and "'x'" in response.error and "(4,)" in response.error
    assert results[1].responses[0].error == response.error
    assert len(world.controllers[0].cache) == len(world.controllers[1].cache) == 0
    # and it renegotiates and caches again afterwards
    again = world.cycle({0: [ar("x", shape=(5,))], 1: [ar("x", shape=(5,))]})
    assert again[0].responses[0].error is None and len(world.controllers[0].cache) == 1


def test_cache_eviction_keeps_ranks_consistent():
    world = FakeWorld(2, cache_capacity=2)
    for round_ in range(3):
        for name in "abc":
            results = world.cycle({0: [ar(name)], 1: [ar(name)]})
            assert names(results[0]) == names(results[1]) == [name]
    caches = [c.cache for c in world.controllers]
    assert len(caches[0]) == 2
    assert [(b, r.name) for b, r in caches[0].bits()] == [(b, r.name) for b, r in caches[1].bits()]


def test_cache_disabled():
    world = FakeWorld(2, cache_capacity=0)
    for _ in range(2):
        results = world.cycle({0: [ar("x")], 1: [ar("x")]})
        assert names(results[0]) == ["x"] and results[0].negotiated_slow


MISMATCHES = [
    ("dtype", ar("t"), ar("t", dtype="float64"), ["float32", "float64"]),
    ("shape", ar("t"), ar("t", shape=(2, 2)), ["(4,)", "(2, 2)"]),
    ("reduce op", ar("t"), ar("t", reduce_op=ReduceOp.MAX), ["Sum", "Max"]),
    ("prescale factor", ar("t"), ar("t", prescale=2.0), ["1.0", "2.0"]),
    ("postscale factor", ar("t"), ar("t", postscale=3.0), ["3.0"]),
    ("device class", ar("t"), ar("t", device="cuda"), ["cpu", "cuda"]),
    ("device class", ar("t"), ar("t", device="cuda/host"), ["cpu", "cuda"]),  # staged too
    ("GPU path", ar("t", device="cuda"), ar("t", device="cuda/host"),
     ["HOROVODISH_GPU_OPERATIONS", "rank 0: cuda", "rank 1: cuda/host"]),
    ("collective", ar("t"), Request("t", RequestType.ALLGATHER, "float32", (4,)),
     ["allreduce", "allgather"]),
    ("root rank", Request("t", RequestType.BROADCAST, "float32", (4,), root_rank=0),
     Request("t", RequestType.BROADCAST, "float32", (4,), root_rank=1), ["rank 0: 0"]),
    ("shape after the first dimension", Request("t", RequestType.ALLGATHER, "float32", (4, 2)),
     Request("t", RequestType.ALLGATHER, "float32", (1, 3)), ["(2,)", "(3,)"]),
    ("use of explicit splits", Request("t", RequestType.ALLTOALL, "float32", (2,), splits=(1, 1)),
     Request("t", RequestType.ALLTOALL, "float32", (2,)), ["True", "False"]),
]


@pytest.mark.parametrize("what,mine,theirs,needles", MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_every_mismatch_names_tensor_and_difference(what, mine, theirs, needles):
    world = FakeWorld(2)
    results = world.cycle({0: [mine], 1: [theirs]})
    for result in results:
        (response,) = result.responses
        assert response.error is not None
        assert "'t'" in response.error and what in response.error
        for needle in needles:
            assert needle in response.error
    # the next collective still works
    ok = world.cycle({0: [ar("next")], 1: [ar("next")]})
    assert ok[0].responses[0].error is None


def test_allgather_and_alltoall_responses_carry_every_ranks_sizes():
    world = FakeWorld(2)
    results = world.cycle({
        0: [Request("g", RequestType.ALLGATHER, "float32", (3, 2)),
            Request("a", RequestType.ALLTOALL, "float32", (3,), splits=(1, 2))],
        1: [Request("g", RequestType.ALLGATHER, "float32", (0, 2)),
            Request("a", RequestType.ALLTOALL, "float32", (4,), splits=(4, 0))]})
    by_name = {r.name: r for r in results[1].responses}
    assert by_name["g"].first_dims == (3, 0)
    assert by_name["a"].splits == ((1, 2), (4, 0))


def test_join_counts_joined_rank_as_ready_and_reports_last():
    world = FakeWorld(3)
    join = Request("join", RequestType.JOIN, "uint8", ())
    world.cycle({1: [join]})
    results = world.cycle({0: [ar("x")], 2: [ar("x")]})
    assert [names(r) for r in results] == [["x"]] * 3
    # cached allreduce still runs with the joined rank contributing
    results = world.cycle({0: [ar("x")], 2: [ar("x")]})
    assert [names(r) for r in results] == [["x"]] * 3
    # non-allreduce ops error while a rank has joined
    results = world.cycle({0: [Request("b", RequestType.BROADCAST, "float32", (1,), root_rank=0)],
                           2: [Request("b", RequestType.BROADCAST, "float32", (1,), root_rank=0)]})
    assert "join" in results[0].responses[0].error
    world.cycle({2: [join]})
    results = world.cycle({0: [join]})
    for result in results:
        assert result.responses[-1].type == RequestType.JOIN
        assert result.responses[-1].last_joined == 0


def test_shutdown_flag_reaches_every_rank():
    world = FakeWorld(3)
    results = world.cycle(shutdown={1})
    assert all(r.shutdown and r.shutdown_ranks == [1] for r in results)


def test_stall_inspector_names_tensor_and_rank_then_shuts_down():
    now = [0.0]
    world = FakeWorld(2, stall_check=2.0, stall_shutdown=8.0, clock=lambda: now[0])
    world.cycle({0: [ar("lonely_tensor")]})
    now[0] = 3.0
    world.cycle()
    report = world.controllers[0].coordinator.stall.last_report
    assert "rank 1 has not submitted: lonely_tensor" in report
    now[0] = 9.0
    results = world.cycle()
    assert all(r.shutdown and r.stalled for r in results)


def test_stall_report_says_when_one_name_waits_as_different_collectives():
    """Torch names a tensor "<op>.<name>" (Horovod's names): an allreduce on one rank and
    an allgather on the other under one name never meet, so the report says why."""
    now = [0.0]
    world = FakeWorld(3, stall_check=2.0, clock=lambda: now[0])
    gather = Request("allgather.loss", RequestType.ALLGATHER, "float32", (1,))
    world.cycle({0: [ar("allreduce.loss")], 1: [ar("allreduce.loss")], 2: [gather]})
    world.cycle({0: [ar("allreduce.alone")]})
    now[0] = 3.0
    world.cycle()
    report = world.controllers[0].coordinator.stall.last_report
    assert "rank 2 has not submitted: allreduce.alone, allreduce.loss" in report, report
    assert "'loss' waits as different collectives (allgather on rank 2; allreduce on " \
        "ranks 0, 1)" in report, report
    assert "'alone'" not in report, report  # one collective only: no such line


def test_a_process_sets_messages_name_world_ranks():
    """Set ranks 0, 1, 2 of the set [4, 1, 6]: users know ranks by their world number."""
    now = [0.0]
    world = FakeWorld(3, stall_check=2.0, clock=lambda: now[0], world_ranks=[4, 1, 6])
    results = world.cycle({0: [ar("t")], 1: [ar("t")], 2: [ar("t", dtype="float64")]})
    assert "ranks 1, 4: float32; rank 6: float64" in results[0].responses[0].error
    world.cycle({0: [ar("lonely_tensor")], 2: [ar("lonely_tensor")]})
    now[0] = 3.0
    world.cycle()
    assert "  rank 1 has not submitted: lonely_tensor" in \
        world.controllers[0].coordinator.stall.last_report
    join = Request("join", RequestType.JOIN, "uint8", ())
    world.cycle({2: [join], 1: [ar("lonely_tensor")]})
    results = world.cycle({0: [Request("b", RequestType.BROADCAST, "float32", (1,))],
                           1: [Request("b", RequestType.BROADCAST, "float32", (1,))]})
    assert "ranks 6 have called join()" in results[0].responses[0].error
    world = FakeWorld(2, world_ranks=[3, 5])  # root ranks travel as set ranks
    results = world.cycle({0: [Request("r", RequestType.BROADCAST, "float32", (1,), root_rank=0)],
                           1: [Request("r", RequestType.BROADCAST, "float32", (1,), root_rank=1)]})
    assert "root rank (rank 3: 3; rank 5: 5)" in results[0].responses[0].error


def test_stall_shutdown_shorter_than_check_time_is_reported(caplog):
    """Horovod warns and never shuts down; here the job shuts down at the first report,
    and says so at start rather than stretching the shutdown time silently."""
    now = [0.0]
    with caplog.at_level("WARNING", logger="horovodish"):
        world = FakeWorld(2, stall_check=10.0, stall_shutdown=3.0, clock=lambda: now[0])
    assert "stall shutdown time (3 s) is shorter than the stall check time (10 s)" \
        in caplog.text
    world.cycle({0: [ar("lonely_tensor")]})
    now[0] = 5.0
    assert not any(r.shutdown for r in world.cycle())
    now[0] = 10.5
    assert all(r.shutdown and r.stalled for r in world.cycle())


def test_stall_inspector_sees_cached_tensors():
    now = [0.0]
    world = FakeWorld(2, stall_check=2.0, clock=lambda: now[0])
    world.cycle({0: [ar("c")], 1: [ar("c")]})
    world.cycle({0: [ar("c")]})  # cached, waiting for rank 1
    now[0] = 1.5
    world.cycle()  # older than half the check time: goes to the coordinator
    now[0] = 4.0
    world.cycle()
    assert "rank 1 has not submitted: c" in world.controllers[0].coordinator.stall.last_report
    results = world.cycle({1: [ar("c")]})
    assert names(results[0]) == names(results[1]) == ["c"]


def _resp(name, nbytes, dtype="float32", **kw):
    return Response(name, RequestType.ALLREDUCE, dtype=dtype, shape=(nbytes // 4,), **kw)


def test_fusion_groups_by_key_up_to_threshold():
    responses = [_resp("a", 40), _resp("b", 40, dtype="int32"), _resp("c", 40),
                 _resp("d", 40, prescale=2.0), _resp("e", 40)]
    groups = plan_fusion(responses, threshold=100)
    assert [[r.name for r in g] for g in groups] == [["a", "c"], ["b"], ["d"], ["e"]]
    assert [[r.name for r in g] for g in plan_fusion(responses, 0)] == [[n] for n in "abcde"]
    big = plan_fusion(responses, threshold=1 << 20)
    assert [[r.name for r in g] for g in big] == [["a", "c", "e"], ["b"], ["d"]]


def test_fusion_never_fuses_other_collectives_or_errors():
    responses = [Response("g", RequestType.ALLGATHER, dtype="float32", shape=(1,)),
                 _resp("a", 4), _resp("x", 4, error="bad"), _resp("b", 4)]
    groups = plan_fusion(responses, threshold=1 << 20)
    assert [[r.name for r in g] for g in groups] == [["g"], ["a", "b"], ["x"]]


def test_large_device_tensors_are_not_fused():
    """On the NCCL path (device "cuda") a tensor from DEVICE_UNFUSED_BYTES up goes alone:
    fusing it would only copy it in and out of the fusion buffer. Smaller ones fuse, and
    host tensors of any size fuse as before."""
    from horovodish.common.execution.fusion import DEVICE_UNFUSED_BYTES as big
    responses = [_resp("g1", big, device="cuda"), _resp("s1", 1024, device="cuda"),
                 _resp("g2", big, device="cuda"), _resp("s2", 1024, device="cuda"),
                 _resp("h1", big), _resp("h2", big),
                 _resp("just_under", big - 4, device="cuda"),
                 _resp("staged", big, device="cuda/host")]
    groups = plan_fusion(responses, threshold=128 << 20)
    assert [[r.name for r in g] for g in groups] == [
        ["g1"], ["s1", "s2", "just_under"], ["g2"], ["h1", "h2"], ["staged"]]


def test_fusion_buffers_are_reused():
    buffers = FusionBuffers()
    first = buffers.get(__import__("numpy").dtype("float32"), 100)
    second = buffers.get(__import__("numpy").dtype("float32"), 50)
    assert first.base is second.base or first.__array_interface__["data"] == \
        second.__array_interface__["data"]


def test_cache_retake_keeps_lru_order_exact():
    """Taking the same entries again skips the LRU moves only while nothing was taken,
    inserted or removed in between."""
    from horovodish.common.negotiation.response_cache import ResponseCache

    cache = ResponseCache(8)
    for name in "abcd":
        cache.put(Response(name=name, type=RequestType.ALLREDUCE), ar(name))
    entries = [cache.cached_as(n) for n in "ab"]
    assert [r.name for r in cache.take_entries(entries)] == ["a", "b"]
    assert list(cache._by_name) == list("cdab")
    cache.put(Response(name="e", type=RequestType.ALLREDUCE), ar("e"))
    cache.take_entries(entries)  # after an insertion: moved again
    assert list(cache._by_name) == list("cdeab")
    cache.take_entries([cache.cached_as("c")])
    cache.take_entries(entries)  # after another take: moved again
    assert list(cache._by_name) == list("decab")
    first = cache.take_entries(entries)
    first.append("caller's")  # the caller owns the list it gets
    assert [r.name for r in cache.take_entries(entries)] == ["a", "b"]


def test_repeated_all_hit_cycles_replay_and_agree_with_the_general_path():
    """Identical bursts replay the last all-hit cycle (no per-request classification);
    the responses and the cache's LRU order must be exactly the general path's."""
    worlds = [FakeWorld(2, cache_capacity=64) for _ in range(2)]
    for controller in worlds[1].controllers:
        controller.replay = False
    burst = [ar(f"t{i}") for i in range(40)]
    for step in range(5):
        results = [w.cycle({0: burst, 1: burst[::-1]}) for w in worlds]
        assert names(results[0][0]) == names(results[1][0]) == names(results[0][1])
        assert sorted(names(results[0][0])) == sorted(r.name for r in burst)
    assert worlds[0].controllers[0].replays == 3  # negotiated, recorded, then replayed
    assert worlds[1].controllers[0].replays == 0
    caches = [list(w.controllers[0].cache._by_name) for w in worlds]
    assert caches[0] == caches[1]


def test_replay_and_general_path_agree_on_random_streams():
    """Two worlds fed the same random streams (partial readiness, shape changes, new
    names, evictions from a small cache), one replaying and one not: every cycle must
    give the same responses, errors and cache bits."""
    import random

    rng = random.Random(7)
    worlds = [FakeWorld(2, cache_capacity=12) for _ in range(3)]
    for controller in worlds[1].controllers:
        controller.replay = False
    worlds[2].controllers[1].replay = False  # ranks may decide differently: still alike
    pool = [f"n{i}" for i in range(16)]
    shapes = {name: (4,) for name in pool}
    pending: list[set[str]] = [set(), set()]
    steady = pool[:8]
    for step in range(400):
        requests: dict[int, list[Request]] = {}
        mode = rng.random()
        for rank in range(2):
            if mode < 0.6:  # the steady burst, all of it, both ranks
                chosen = [n for n in steady if n not in pending[rank]]
            else:
                chosen = [n for n in rng.sample(pool, rng.randint(0, 6)) if n not in pending[rank]]
            if rng.random() < 0.05 and chosen:  # one rank changes a shape
                name = rng.choice(chosen)
                requests.setdefault(rank, []).extend(ar(n, shape=(5,) if n == name else shapes[n])
                                                     for n in chosen)
            else:
                requests[rank] = [ar(n, shape=shapes[n]) for n in chosen]
            pending[rank].update(r.name for r in requests.get(rank, []))
        results = [w.cycle(requests) for w in worlds]
        for rank in range(2):
            got = [(r.name, r.error) for r in results[0][rank].responses]
            for other in results[1:]:
                assert got == [(r.name, r.error) for r in other[rank].responses], step
            pending[rank].difference_update(name for name, _ in got)
        for rank in range(2):
            caches = [w.controllers[rank].cache._by_name for w in worlds]
            bits = [{n: c.bit for n, c in cache.items()} for cache in caches]
            assert bits[0] == bits[1] == bits[2], step
            assert list(caches[0]) == list(caches[1]) == list(caches[2]), step  # LRU order
    assert worlds[0].controllers[0].replays > 20  # the replay did run, often
