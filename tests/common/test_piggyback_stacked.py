"""Eager reductions at many ranks (execution/piggyback.py): the gathered parts reduced
as one (ranks, count) array give the rank-order loop's result bit for bit, for every
reduction, dtype and width, and rows that do not lie evenly in one buffer take the loop.
Pure logic, one process; the rows are laid out as MPI's allgather delivers them."""
from __future__ import annotations

import numpy as np
import pytest

from horovodish.common.execution import piggyback
from horovodish.common.execution.arithmetic import reduce_ufunc
from horovodish.common.execution.fused_group import Workspace
from horovodish.common.execution.piggyback import EagerGroup, EagerViews
from horovodish.common.messages import ReduceOp, Response, RequestType
from horovodish.common.negotiation.eager_plan import EagerPlan, plan_eager


def gathered(values: list[np.ndarray], words: int = 3) -> list[np.ndarray]:
    """Each rank's region after a vector of words uint64, as rows of one received
    buffer (mpi_transport's layout): the row of rank r is values[r]'s bytes."""
    nbytes = values[0].nbytes
    width = words + (nbytes + 7) // 8
    received = np.zeros((len(values), width), dtype=np.uint64)
    rows = [received[rank, words:].view(np.uint8)[:nbytes] for rank in range(len(values))]
    for row, value in zip(rows, values):
        row[:] = value.view(np.uint8)
    return rows


def group_of(count: int, dtype: np.dtype, op: ReduceOp, postscale: float = 1.0,
             divide_by: int = 0, offset: int = 0) -> EagerGroup:
    response = Response(name="t", type=RequestType.ALLREDUCE, dtype=dtype.name,
                        shape=(count,), reduce_op=op)
    summed = ReduceOp.SUM if op == ReduceOp.AVERAGE else op  # as the executor plans it
    return EagerGroup([response], [count], dtype, reduce_ufunc(dtype, summed), 1.0, postscale,
                      divide_by, offset, count * dtype.itemsize)


def views_of(groups: list[EagerGroup]) -> EagerViews:
    """The views an executor makes for a plan of these groups."""
    plan = EagerPlan(bits=1, groups=[g.responses for g in groups],
                     offsets=[g.offset for g in groups],
                     nbytes=groups[-1].offset + groups[-1].nbytes)
    return EagerViews(plan, groups)


def rank_order(values: list[np.ndarray], ufunc: np.ufunc) -> np.ndarray:
    """The independent reference: rank 0's part, then each later rank's, in order."""
    out = ufunc(values[0], values[1])
    for value in values[2:]:
        out = ufunc(out, value)
    return out


def spread(rng: np.random.Generator, ranks: int, count: int, dtype: np.dtype
           ) -> list[np.ndarray]:
    """Values whose sums depend on the order they are added in (mixed magnitudes)."""
    if np.issubdtype(dtype, np.integer):
        return list(rng.integers(-50, 50, (ranks, count)).astype(dtype))
    scale = 10.0 ** rng.integers(-3, 4, (ranks, count))
    return list((rng.standard_normal((ranks, count)) * scale).astype(dtype))


@pytest.mark.parametrize("ranks", [8, 9, 1024, 4096])
@pytest.mark.parametrize("count", [1, 2, 3, 17])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32"])
def test_stacked_sums_give_the_rank_order_loops_bits(ranks, count, dtype):
    rng = np.random.default_rng(ranks * 100 + count)
    dtype = np.dtype(dtype)
    values = spread(rng, ranks, count, dtype)
    group = group_of(count, dtype, ReduceOp.SUM)
    rows = gathered(values)
    stacked = views_of([group]).stacked(rows)
    assert stacked is not None and stacked[0].shape == (ranks, count)
    out = np.empty(count, dtype)
    piggyback._reduce_stacked(group, stacked[0], out)
    expected = rank_order(values, np.add)
    assert out.tobytes() == expected.tobytes(), \
        f"sum over {ranks} ranks of {count} {dtype}: {out} != rank order {expected}"


@pytest.mark.parametrize("op, ufunc", [(ReduceOp.MIN, np.minimum), (ReduceOp.MAX, np.maximum),
                                       (ReduceOp.PRODUCT, np.multiply)])
@pytest.mark.parametrize("count", [1, 5])
def test_stacked_min_max_and_product_match_the_loop(op, ufunc, count):
    rng = np.random.default_rng(count)
    ranks, dtype = 1024, np.dtype(np.float32)
    values = [v if op != ReduceOp.PRODUCT else (1 + v / 1e4).astype(dtype)
              for v in spread(rng, ranks, count, dtype)]
    values[7][0] = np.nan  # NaN wins in Min and Max, as the loop's np.minimum gives it
    group = group_of(count, dtype, op)
    stacked = views_of([group]).stacked(gathered(values))
    out = np.empty(count, dtype)
    piggyback._reduce_stacked(group, stacked[0], out)
    assert out.tobytes() == rank_order(values, ufunc).tobytes()


def test_reduce_gathered_scales_an_average_and_places_every_group():
    """Two groups in one region (float32 then int64 at its word offset); the float one
    postscaled, the integer one an exact Average: both as the loop gives them."""
    ranks = 300
    rng = np.random.default_rng(3)
    floats, ints = spread(rng, ranks, 3, np.dtype(np.float32)), \
        spread(rng, ranks, 2, np.dtype(np.int64))
    regions = [np.concatenate([f.view(np.uint8), np.zeros(4, np.uint8), i.view(np.uint8)])
               for f, i in zip(floats, ints)]
    groups = [group_of(3, np.dtype(np.float32), ReduceOp.SUM, postscale=0.5),
              group_of(2, np.dtype(np.int64), ReduceOp.AVERAGE, divide_by=ranks, offset=16)]
    views = views_of(groups)
    rows = gathered(regions)
    stacked, parts = views.stacked(rows), views.parts(rows)
    assert stacked is not None and views.stacked(rows) is stacked  # worked out once
    for index, group in enumerate(groups):
        looped, at_once = np.empty(group.counts[0], group.dtype), \
            np.empty(group.counts[0], group.dtype)
        piggyback._reduce_in_rank_order(group, parts[index], looped)
        piggyback._reduce_stacked(group, stacked[index], at_once)
        assert at_once.tobytes() == looped.tobytes()
    total = np.sum(np.stack(ints), axis=0)
    expected = np.trunc(total / ranks).astype(np.int64)
    assert (at_once == expected).all()
    workspace = Workspace()
    result = piggyback.reduce_gathered(groups[0], stacked[0], [_owned()], workspace)
    assert np.asarray(result[0]).tobytes() == \
        (rank_order(floats, np.add) * np.float32(0.5)).astype(np.float32).tobytes()


def _owned():
    """An entry that lets the runtime own its result (no output of its own)."""
    class Owned:
        output = None
        tensor = None
    return Owned()


def test_rows_that_do_not_lie_evenly_in_one_buffer_take_the_loop():
    values = [np.full(4, rank, np.float32) for rank in range(16)]
    group = group_of(4, np.dtype(np.float32), ReduceOp.SUM)
    views = views_of([group])
    apart = [value.view(np.uint8).copy() for value in values]  # each its own buffer
    assert views.stacked(apart) is None
    rows = gathered(values)
    uneven = rows[:8] + [rows[9]] + rows[9:15]
    assert views_of([group]).stacked(uneven) is None
    few = gathered(values[:piggyback.STACKED_FROM_RANKS - 1])
    assert views_of([group]).stacked(few) is None  # the loop is cheaper there


def test_a_plan_at_many_ranks_reduces_through_the_stacked_views():
    """The plan's own offsets, as the executor meets them."""
    responses = [Response(name=f"m{i}", type=RequestType.ALLREDUCE, dtype="float32",
                          shape=(1,)) for i in range(4)]
    plan = plan_eager([responses], bits=0b1111, size=2048, limit=1 << 20)
    assert plan is not None and plan.offsets == [0]
    assert plan.nbytes == 16
