"""Eager cycles (negotiation/eager_plan.py): the plan, its prediction from agreed results,
and the controller's exchange, in one process with the fake transport. The multi-rank
worker (workers/eager_worker.py) checks the reductions themselves against numpy."""
from __future__ import annotations

from pathlib import Path

import pytest

from horovodish.common.execution.fusion import plan_fusion
from horovodish.common.messages import ReduceOp, Request, RequestType, Response
from horovodish.common.negotiation.eager_plan import EagerPredictor, plan_eager

from multirank import assert_ranks_ok, run_ranks

from .fake_world import FakeWorld


def ar(name: str, shape=(4,), dtype="float32", **kw) -> Request:
    return Request(name=name, type=RequestType.ALLREDUCE, dtype=dtype, shape=shape, **kw)


def response(name: str, count: int = 4, dtype: str = "float32", **kw) -> Response:
    return Response(name=name, type=RequestType.ALLREDUCE, dtype=dtype, shape=(count,), **kw)


def test_a_plan_places_each_group_on_a_word_and_counts_the_bytes():
    groups = plan_fusion([response("a", 3, "float16"), response("b", 5, "float16"),
                          response("c", 2, "int64")], threshold=1 << 20)
    plan = plan_eager(groups, bits=0b111, size=2, limit=1 << 10)
    assert plan is not None
    assert [[r.name for r in g] for g in plan.groups] == [["a", "b"], ["c"]]
    assert plan.offsets == [0, 16]  # 8 float16 = 16 bytes, already on a word
    assert plan.nbytes == 32


def test_what_cannot_ride_along_gets_no_plan():
    one = [[response("a")]]
    assert plan_eager(one, 1, size=2, limit=16) is not None
    assert plan_eager(one, 1, size=2, limit=15) is None  # over the limit
    assert plan_eager(one, 1, size=3, limit=16) is None  # a rank receives 2 x 16
    assert plan_eager(one, 1, size=1, limit=1 << 20) is None  # nobody to meet
    for odd in (response("a", reduce_op=ReduceOp.ADASUM), response("a", device="cuda"),
                response("a", error="shapes differ"),
                Response(name="a", type=RequestType.BROADCAST, dtype="float32", shape=(4,))):
        assert plan_eager([[odd]], 1, size=2, limit=1 << 20) is None


def test_a_plan_starts_after_two_like_cycles_and_ends_at_a_miss():
    predictor = EagerPredictor(size=2, limit=1 << 10)
    responses = [response("a")]
    groups = [responses]
    assert predictor.after_cycle(responses, 0b1, False, groups) is None  # seen once
    plan = predictor.after_cycle(responses, 0b1, False, groups)
    assert plan is not None and plan.bits == 0b1
    assert predictor.after_cycle([], None, True, []) is plan  # idle: nothing learnt
    assert predictor.after_cycle(responses, 0b1, False, groups) is plan
    assert predictor.after_cycle(responses, 0b1, True, groups) is None  # a rank missed
    assert predictor.after_cycle(responses, 0b1, False, groups) is None  # once more...
    assert predictor.after_cycle(responses, 0b1, False, groups) is not None  # ...twice
    assert predictor.after_cycle(responses, None, False, groups) is None  # slow path
    other = [response("b")]
    assert predictor.after_cycle(other, 0b10, False, [other]) is None  # other hits


def test_a_new_limit_forgets_what_was_learnt():
    predictor = EagerPredictor(size=2, limit=1 << 10)
    responses = [response("a")]
    for _ in range(2):
        plan = predictor.after_cycle(responses, 1, False, [responses])
    assert plan is not None
    predictor.set_limit(0)
    assert predictor.after_cycle([], None, False, []) is plan  # idle: the plan in force
    assert predictor.after_cycle(responses, 1, False, [responses]) is None  # relearning
    assert predictor.after_cycle(responses, 1, False, [responses]) is None  # over 0 bytes


def test_a_loss_and_a_metric_in_turn_ride_along_too():
    """Period 2: a plan for the hits of two cycles ago."""
    predictor = EagerPredictor(size=2, limit=1 << 10)
    loss, metric = [response("loss")], [response("metric")]
    seen = [predictor.after_cycle(r, bits, False, [r])
            for r, bits in [(loss, 1), (metric, 2), (loss, 1), (metric, 2), (loss, 1)]]
    assert seen[:3] == [None, None, None]
    assert seen[3].bits == 1 and seen[4].bits == 2


def test_after_the_cache_changed_a_bit_gets_a_new_plan():
    """A slow cycle may give a bit to another tensor (here: Sum after Average, under the
    same name): the plan must be the new response's, not the one remembered."""
    predictor = EagerPredictor(size=2, limit=1 << 10)
    average = [response("g", reduce_op=ReduceOp.AVERAGE)]
    for _ in range(2):
        plan = predictor.after_cycle(average, 1, False, [average])
    assert plan.groups[0][0].reduce_op == ReduceOp.AVERAGE
    summed = [response("g", reduce_op=ReduceOp.SUM)]
    assert predictor.after_cycle(summed, None, False, [summed]) is None  # renegotiated
    for _ in range(2):
        plan = predictor.after_cycle(summed, 1, False, [summed])
    assert plan.groups[0][0].reduce_op == ReduceOp.SUM


def _eager_world(size: int, batch: list[Request]) -> FakeWorld:
    """A world in steady state on batch, each rank filling its region with its rank."""
    world = FakeWorld(size)
    requests = {rank: batch for rank in range(size)}
    for _ in range(3):  # negotiated, recorded, replayed
        world.cycle(requests)
    results = world.cycle(requests)
    groups = plan_fusion(results[0].responses, 1 << 20)
    plan = plan_eager(groups, results[0].cached_bits, size, 1 << 20)
    assert plan is not None
    for controller in world.controllers:
        def fill(plan, region, rank=controller.rank) -> bool:
            region[:] = rank + 1
            return True
        controller.eager, controller.fill_eager = plan, fill
    return world


def test_an_eager_cycle_brings_every_ranks_region_and_the_same_responses():
    batch = [ar("x"), ar("y", shape=(3,), dtype="int32")]
    world = _eager_world(3, batch)
    plain = FakeWorld(3)
    for _ in range(4):
        expected = plain.cycle({rank: batch for rank in range(3)})
    results = world.cycle({rank: batch for rank in range(3)})
    for rank, result in enumerate(results):
        assert [r.name for r in result.responses] == [r.name for r in expected[rank].responses]
        assert result.gathered is not None and not result.eager_missed
        assert [row.tobytes() for row in result.gathered] == \
            [bytes([r + 1]) * len(row) for r, row in enumerate(result.gathered)]
    assert all(c.eager_cycles == 1 for c in world.controllers)


def test_one_rank_that_cannot_fill_makes_an_ordinary_cycle_everywhere():
    batch = [ar("x"), ar("y")]
    world = _eager_world(2, batch)
    world.controllers[1].fill_eager = lambda plan, region: False
    results = world.cycle({0: batch, 1: batch})
    for result in results:
        assert result.gathered is None and result.eager_missed
        assert sorted(r.name for r in result.responses) == ["x", "y"]  # still reduced
        assert result.cached_bits is not None  # the hits were cached ones all the same


def test_a_rank_with_other_work_misses_and_nothing_runs_twice():
    batch = [ar("x")]
    world = _eager_world(2, batch)
    results = world.cycle({0: batch, 1: batch + [ar("new")]})  # rank 1 cannot replay
    for result in results:
        assert result.gathered is None and result.eager_missed
    assert [r.name for r in results[0].responses] == ["x"]
    later = world.cycle({0: [ar("new")]})
    assert [r.name for r in later[0].responses] == [r.name for r in later[1].responses] == ["new"]
    assert all(c.eager_cycles == 0 for c in world.controllers)


WORKER = Path(__file__).parent / "workers" / "eager_worker.py"
CHECKS = ["every_op_and_dtype_in_place", "into_outputs_and_runtime_blocks",
          "fused_groups_of_several_dtypes", "a_rank_with_more_work_falls_back",
          "a_shape_change_on_one_rank_is_an_error_everywhere",
          "not_while_a_timeline_records", "mid_sizes_reduced_by_slices",
          "large_tensors_never_ride_along", "a_late_reader_reads_its_own_cycle",
          "negotiation_in_shared_memory_on_one_host"]


# MPI set-ups that this machine lacks, as tests/mpi_variants.py makes them.
AS_ACROSS_HOSTS = {"HOROVODISH_TEST_NO_SHM_EXCHANGE": "1"}
AS_MPI_3 = {"HOROVODISH_TEST_MPI_VERSION": "3.1"}


@pytest.mark.parametrize("ranks, limit, variant", [
    (2, None, {}), (3, None, {}), (2, "0", {}),
    # the exchange as across hosts: MPI's persistent allgather
    (2, "131072", AS_ACROSS_HOSTS),
    # an MPI without persistent collectives (Open MPI 4): on one host nothing changes (the
    # exchange is shared memory); as across hosts, an Iallgather per cycle
    (2, None, AS_MPI_3),
    (3, "131072", {**AS_MPI_3, **AS_ACROSS_HOSTS}),
])
def test_eager_cycles_reduce_like_numpy_on_every_rank(ranks, limit, variant):
    """With the default limit the worker requires eager cycles to have run; with 0, none."""
    env = {**variant, **({"HOROVODISH_EAGER_LIMIT": limit} if limit is not None else {})}
    assert_ranks_ok(run_ranks(WORKER, ranks, env=env, timeout=180), ranks, CHECKS)
