"""Collectives on process sets, each checked against numpy, while other ranks do other work."""
from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from horovodish.common import api
from horovodish.common.api import (ProcessSet, add_process_set, collectives,
                                   global_process_set, objects, remove_process_set)
from horovodish.common.errors import HorovodInternalError
from horovodish.common.messages import ReduceOp


def alloc(dtype):
    return lambda shape: np.empty(shape, dtype=dtype)


def exercise(ps: ProcessSet, rank: int, tag: str) -> None:
    """Every collective on ps, with a numpy reference computed from every member's input."""
    members = ps.ranks
    mine = np.arange(6, dtype=np.float64) + 10 * rank
    want = sum(np.arange(6, dtype=np.float64) + 10 * r for r in members)
    out = np.empty_like(mine)
    got = collectives.allreduce_async(mine, out, f"{tag}.ar", ReduceOp.SUM, process_set=ps).wait()
    assert np.array_equal(got, want), (tag, got, want)
    got = collectives.allreduce_async(mine, np.empty_like(mine), f"{tag}.avg", ReduceOp.AVERAGE,
                                      process_set=ps).wait()
    assert np.allclose(got, want / len(members))
    rows = np.full((rank + 1, 2), rank, dtype=np.int32)
    got = collectives.allgather_async(rows, alloc(np.int32), f"{tag}.ag", process_set=ps).wait()
    assert np.array_equal(got, np.concatenate([np.full((r + 1, 2), r, np.int32) for r in members]))
    root = members[-1]  # a world rank
    got = collectives.broadcast_async(mine, np.empty_like(mine), root, f"{tag}.bc",
                                      process_set=ps).wait()
    assert np.array_equal(got, np.arange(6, dtype=np.float64) + 10 * root)
    send = np.repeat(np.arange(len(members), dtype=np.float32) + 100 * rank, 2)
    got = collectives.alltoall_async(send, None, alloc(np.float32), f"{tag}.a2a",
                                     process_set=ps).wait()[0]
    me = ps.rank()
    assert np.array_equal(got, np.repeat([me + 100 * r for r in members], 2).astype(np.float32))
    full = np.ones((len(members) * 2 + 1, 3), dtype=np.float32) * (rank + 1)
    shape = collectives.reducescatter_shape(full.shape, me, len(members))
    got = collectives.grouped_reducescatter_async([full], [np.empty(shape, np.float32)],
                                                  [f"{tag}.rs"], ReduceOp.SUM,
                                                  process_set=ps)[0].wait()
    assert np.array_equal(got, np.full(shape, sum(r + 1 for r in members), np.float32))
    collectives.barrier_async(ps).wait()
    assert objects.broadcast_object({"from": root}, root, process_set=ps) == {"from": root}
    assert objects.allgather_object(rank, process_set=ps) == members
    # unnamed ops in a set keep their own counter
    for _ in range(3):
        collectives.allreduce_async(mine, np.empty_like(mine), collectives.auto_name("ar", ps),
                                    ReduceOp.SUM, process_set=ps).wait()


def expect(exc_type, fn, *needles):
    try:
        fn()
    except exc_type as exc:
        assert all(n in str(exc) for n in needles), str(exc)
        return
    raise AssertionError(f"expected {exc_type.__name__} {needles}")


def main(mode: str) -> None:
    evens_static = ProcessSet([0, 2])
    api.init(process_sets="dynamic" if mode == "dynamic" else [evens_static])
    rank, size = api.rank(), api.size()
    if mode == "static":
        evens = evens_static
        odds = None
    else:
        evens = add_process_set([0, 2])
        odds = add_process_set([1])
        everyone = add_process_set(ProcessSet(MPI.COMM_WORLD))  # from an mpi4py communicator
        assert everyone.ranks == list(range(size)), everyone.ranks
        exercise(everyone, rank, "everyone")
        remove_process_set(everyone)
    assert evens.size() == 2 and evens.included() == (rank in (0, 2))
    assert evens.rank() == ([0, 2].index(rank) if rank in (0, 2) else -1)
    if evens.included():
        exercise(evens, rank, "evens")
    else:
        # the excluded rank runs its own collectives meanwhile
        if odds is not None:
            exercise(odds, rank, "odds")
        expect(ValueError, lambda: collectives.allreduce_async(
            np.ones(1), np.ones(1), "x", ReduceOp.SUM, process_set=evens), "not a member")
    if evens.included():
        expect(ValueError, lambda: collectives.broadcast_async(
            np.ones(1), np.ones(1), 1, "bad.root", process_set=evens), "root_rank 1",
            "not a member")
        # The message names world ranks (set rank 1 is world rank 2).
        length = 2 if rank == 0 else 3
        expect(HorovodInternalError, lambda: collectives.allreduce_async(
            np.ones(length), np.ones(length), "mismatch", ReduceOp.SUM,
            process_set=evens).wait(), "mismatch", "shape", "rank 0: (2,)", "rank 2: (3,)")
    exercise(global_process_set, rank, "world")
    if mode == "dynamic":
        assert remove_process_set(evens)
        expect(ValueError, lambda: collectives.allreduce_async(
            np.ones(1), np.ones(1), "gone", ReduceOp.SUM, process_set=evens), "not registered")
        # Different lists on different ranks: every rank raises, naming each one's list.
        expect(ValueError, lambda: add_process_set([0, 1] if rank == 0 else [1, 2]),
               "different rank lists", "rank 0: [0, 1]", "rank 1: [1, 2]", "rank 2: [1, 2]")
        # A remove of different sets, or an add meeting a remove: every rank raises.
        spare = add_process_set([1, 2])
        expect(ValueError, lambda: remove_process_set(odds if rank == 1 else spare),
               "different process sets", f"rank 1: {odds.process_set_id}",
               f"rank 0: {spare.process_set_id}")
        expect(ValueError, lambda: remove_process_set(spare) if rank == 0 else
               add_process_set([0, 2]), "different calls", "rank 0: remove_process_set",
               "rank 1: add_process_set([0, 2])")
        # A set this rank never registered, or the global set, against a registered one.
        expect(ValueError, lambda: remove_process_set(spare if rank != 2 else ProcessSet([0, 2])),
               "different process sets", f"rank 0: {spare.process_set_id}", "rank 2: None")
        expect(ValueError, lambda: remove_process_set(spare if rank else global_process_set),
               "rank 0: the global process set cannot be removed")
        assert remove_process_set(ProcessSet([0, 1])) is False  # on every rank: nothing to do
        # A second set with the same ranks: Horovod's rule (refused), with the existing
        # set's id and the way out, said once for all ranks.
        twin = spare.process_set_id
        expect(ValueError, lambda: add_process_set([1, 2]), "add_process_set: a process set "
               f"with ranks [1, 2] already exists (process set id {twin})",
               "hvd.remove_process_set()", "(on every rank)")
        remove_process_set(spare)
        remove_process_set(odds)
        # MPI.COMM_NULL on one rank (Split with MPI.UNDEFINED): every rank raises.
        lonely = MPI.COMM_WORLD.Split(color=0 if rank < 2 else MPI.UNDEFINED, key=rank)
        expect(ValueError, lambda: add_process_set(ProcessSet(lonely)), "rank 2: ",
               "MPI.COMM_NULL")
        # Each rank its own group (Horovod's ProcessSet(comm.Split(...)) pattern).
        halves = add_process_set(ProcessSet(MPI.COMM_WORLD.Split(color=rank % 2, key=rank)))
        assert halves.ranks == ([0, 2] if rank % 2 == 0 else [1]), halves.ranks
        exercise(halves, rank, "halves")
        remove_process_set(halves)
        again = add_process_set([0, 1])
        if again.included():
            exercise(again, rank, "again")
        remove_process_set(again)
    sys.stdout.write(f"OK rank {rank} of {size}\n")


if __name__ == "__main__":
    main(sys.argv[1])
