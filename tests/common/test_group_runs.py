"""How the executor cuts a host allreduce group into runs (executor.Executor._runs): a
tensor that would go to another backend alone than the group goes to reduces alone
there, the tensors between such tensors stay fused. Pure logic, on one process: two
fake host backends stand for shared memory (fused groups at any size, single tensors
from 64 KiB to 4 MiB), the ring (single tensors from 4 MiB) and MPI (the rest), and a
fake transport stands for
a second rank that holds the same values (the sum is twice the input). The results go
through the real fusion-buffer, single-tensor and result-block paths."""
from __future__ import annotations

import numpy as np
import pytest

from horovodish.common.entry import Entry
from horovodish.common.execution.backends.base import Backend
from horovodish.common.execution.executor import Executor
from horovodish.common.execution.operations import OperationManager
from horovodish.common.handles import Completions
from horovodish.common.messages import ReduceOp, Request, RequestType, Response

SINGLE_BELOW = 4 << 20
SHM_FROM = 64 << 10  # smaller single tensors go to MPI
SIZE = 2


class TwoRanksAlike(Backend):
    """A flat reduction as if every one of SIZE ranks held this rank's values."""

    def __init__(self, name: str, takes) -> None:
        self.name = name
        self._takes = takes
        self.reduced: list[int] = []  # elements per reduction, in order
        self.fail_on: int | None = None  # the reduction (index) that raises

    def enabled(self, kind, dtype, nbytes, tensors=1, op=None) -> bool:
        return kind == RequestType.ALLREDUCE and self._takes(nbytes, tensors)

    def allreduce(self, buf, op, source=None) -> None:
        self.reduced.append(buf.size)
        if self.fail_on == len(self.reduced) - 1:
            raise RuntimeError(f"{self.name} lost a peer")
        np.multiply(buf if source is None else source, SIZE, out=buf)


def _executor():
    shm = TwoRanksAlike("shm", lambda nbytes, tensors: tensors > 1 or
                        SHM_FROM <= nbytes < SINGLE_BELOW)
    ring = TwoRanksAlike("ring", lambda nbytes, tensors: nbytes >= SINGLE_BELOW)
    mpi = TwoRanksAlike("mpi", lambda nbytes, tensors: True)
    return Executor(OperationManager([shm, ring, mpi]), 0, SIZE), shm, ring, mpi


# Elements per tensor: small ones between large ones (float32: 1.5M elements is 6 MiB).
COUNTS = [1000, 1_500_000, 3000, 5, 1_200_000, 1_100_000, 77]


def _group(counts, dtype="float32", op=ReduceOp.SUM, pre=1.0, post=1.0):
    return [Response(f"t{i}", RequestType.ALLREDUCE, dtype, (n,), op, prescale=pre,
                     postscale=post) for i, n in enumerate(counts)]


def _entries(group, inputs, form):
    """form: "out" (caller outputs), "in" (in place) or "owned" (runtime result blocks)."""
    entries = []
    for response, x in zip(group, inputs):
        request = Request(response.name, response.type, response.dtype, response.shape)
        output = {"out": np.empty_like(x), "in": x, "owned": None}[form]
        entries.append(Entry(request, x, Completions(), output))
    return entries


def _results(entries):
    for entry in entries:
        assert entry._error is None, entry._error
    return [entry._result for entry in entries]


@pytest.mark.parametrize("form", ["out", "in", "owned"])
def test_large_tensors_leave_the_group_and_reduce_alone(form):
    executor, shm, ring, mpi = _executor()
    rng = np.random.default_rng(3)
    inputs = [rng.uniform(-2, 2, n).astype(np.float32) for n in COUNTS]
    want = [x.astype(np.float64) * 0.5 * SIZE * 3.0 for x in inputs]
    group = _group(COUNTS, pre=0.5, post=3.0)
    entries = _entries(group, [x.copy() for x in inputs], form)
    executor.execute(group, entries)
    for i, (got, expected) in enumerate(zip(_results(entries), want)):
        np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg=f"tensor {i} ({form})")
    # The large ones alone on the ring, in order; the runs between them fused on shm.
    assert ring.reduced == [1_500_000, 1_200_000, 1_100_000]
    # The runs between them: two fused on shared memory, one tensor alone as one goes.
    assert shm.reduced == [3000 + 5] and mpi.reduced == [1000, 77]


def test_integer_average_divides_each_run():
    executor, shm, ring, mpi = _executor()
    counts = [10, 1_100_000, 9]
    inputs = [np.arange(n, dtype=np.int32) % 97 - 40 for n in counts]
    group = _group(counts, "int32", ReduceOp.AVERAGE)
    entries = _entries(group, inputs, "owned")
    executor.execute(group, entries)
    for i, (got, x) in enumerate(zip(_results(entries), inputs)):
        np.testing.assert_array_equal(got, x, err_msg=f"tensor {i}")  # (x + x) / 2
    assert ring.reduced == [1_100_000] and mpi.reduced == [10, 9] and shm.reduced == []


@pytest.mark.parametrize("count", [300_000, 10_000, 500_000])
def test_a_group_without_large_tensors_stays_whole(count):
    """1.2 MB tensors would take shared memory alone too; 40 KB ones MPI, and 2 MB ones
    the same, below the size from which a tensor may leave its group."""
    executor, shm, ring, mpi = _executor()
    counts = [count] * 8
    inputs = [np.full(n, float(i), np.float32) for i, n in enumerate(counts)]
    group = _group(counts)
    entries = _entries(group, inputs, "out")
    executor.execute(group, entries)
    for i, got in enumerate(_results(entries)):
        np.testing.assert_array_equal(got, np.full(counts[i], 2.0 * i))
    assert ring.reduced == mpi.reduced == [] and sum(shm.reduced) == sum(counts)


def test_a_failed_run_fails_the_group_after_every_run_has_reduced():
    """The other ranks run every run's collective: a failure on this rank must not skip
    the later ones (they would wait for it), and it fails every handle of the group."""
    executor, shm, ring, mpi = _executor()
    ring.fail_on = 0
    group = _group(COUNTS)
    entries = _entries(group, [np.ones(n, np.float32) for n in COUNTS], "out")
    executor.execute(group, entries)
    assert ring.reduced == [1_500_000, 1_200_000, 1_100_000]
    assert shm.reduced == [3005] and mpi.reduced == [1000, 77]
    for entry in entries:
        assert entry._error is not None and "ring lost a peer" in str(entry._error)
        assert "'t1'" in str(entry._error)
