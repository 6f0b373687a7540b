"""Collectives on process sets, each checked against numpy, while other ranks do other work."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from worker_support import check, close, expect_error, run_checks  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import (ProcessSet, add_process_set, collectives,  # noqa: E402
                                   global_process_set, objects, remove_process_set)
from horovodish.common.errors import HorovodInternalError  # noqa: E402
from horovodish.common.messages import ReduceOp  # noqa: E402


def alloc(dtype):
    return lambda shape: np.empty(shape, dtype=dtype)


def exercise(ps: ProcessSet, rank: int, tag: str) -> None:
    """Every collective on ps, with a numpy reference computed from every member's input."""
    members = ps.ranks
    mine = np.arange(6, dtype=np.float64) + 10 * rank
    want = sum(np.arange(6, dtype=np.float64) + 10 * r for r in members)
    out = np.empty_like(mine)
    got = collectives.allreduce_async(mine, out, f"{tag}.ar", ReduceOp.SUM, process_set=ps).wait()
    close(got, want, f"{tag}: allreduce")
    got = collectives.allreduce_async(mine, np.empty_like(mine), f"{tag}.avg", ReduceOp.AVERAGE,
                                      process_set=ps).wait()
    close(got, want / len(members), f"{tag}: average", 1e-5, atol=1e-8)
    rows = np.full((rank + 1, 2), rank, dtype=np.int32)
    got = collectives.allgather_async(rows, alloc(np.int32), f"{tag}.ag", process_set=ps).wait()
    close(got, np.concatenate([np.full((r + 1, 2), r, np.int32) for r in members]),
          f"{tag}: allgather")
    root = members[-1]  # a world rank
    got = collectives.broadcast_async(mine, np.empty_like(mine), root, f"{tag}.bc",
                                      process_set=ps).wait()
    close(got, np.arange(6, dtype=np.float64) + 10 * root, f"{tag}: broadcast")
    send = np.repeat(np.arange(len(members), dtype=np.float32) + 100 * rank, 2)
    got = collectives.alltoall_async(send, None, alloc(np.float32), f"{tag}.a2a",
                                     process_set=ps).wait()[0]
    me = ps.rank()
    close(got, np.repeat([me + 100 * r for r in members], 2).astype(np.float32),
          f"{tag}: alltoall")
    full = np.ones((len(members) * 2 + 1, 3), dtype=np.float32) * (rank + 1)
    shape = collectives.reducescatter_shape(full.shape, me, len(members))
    got = collectives.grouped_reducescatter_async([full], [np.empty(shape, np.float32)],
                                                  [f"{tag}.rs"], ReduceOp.SUM,
                                                  process_set=ps)[0].wait()
    close(got, np.full(shape, sum(r + 1 for r in members), np.float32), f"{tag}: reducescatter")
    collectives.barrier_async(ps).wait()
    got = objects.broadcast_object({"from": root}, root, process_set=ps)
    check(got == {"from": root}, f"{tag}: broadcast_object gave {got}")
    got = objects.allgather_object(rank, process_set=ps)
    check(got == members, f"{tag}: allgather_object gave {got}")
    # unnamed ops in a set keep their own counter
    for _ in range(3):
        collectives.allreduce_async(mine, np.empty_like(mine), collectives.auto_name("ar", ps),
                                    ReduceOp.SUM, process_set=ps).wait()


def membership(rank: int, size: int, sets: dict) -> None:
    evens = sets["evens"]
    check(evens.size() == 2 and evens.included() == (rank in (0, 2)),
          f"evens: size {evens.size()}, included {evens.included()}")
    check(evens.rank() == ([0, 2].index(rank) if rank in (0, 2) else -1),
          f"evens: rank {evens.rank()}")


def collectives_on_a_set(rank: int, size: int, sets: dict) -> None:
    evens, odds = sets["evens"], sets["odds"]
    if evens.included():
        exercise(evens, rank, "evens")
    else:
        # the excluded rank runs its own collectives meanwhile
        if odds is not None:
            exercise(odds, rank, "odds")
        expect_error(lambda: collectives.allreduce_async(
            np.ones(1), np.ones(1), "x", ReduceOp.SUM, process_set=evens),
            ValueError, "not a member", what="allreduce on a set without this rank")


def errors_on_a_set(rank: int, size: int, sets: dict) -> None:
    evens = sets["evens"]
    if not evens.included():
        return
    expect_error(lambda: collectives.broadcast_async(
        np.ones(1), np.ones(1), 1, "bad.root", process_set=evens),
        ValueError, "root_rank 1", "not a member", what="a root outside the set")
    # The message names world ranks (set rank 1 is world rank 2).
    length = 2 if rank == 0 else 3
    expect_error(lambda: collectives.allreduce_async(
        np.ones(length), np.ones(length), "mismatch", ReduceOp.SUM, process_set=evens).wait(),
        HorovodInternalError, "mismatch", "shape", "rank 0: (2,)", "rank 2: (3,)",
        what="a shape mismatch in the set")


def world(rank: int, size: int, sets: dict) -> None:
    check(global_process_set.mpi_comm == MPI.COMM_WORLD and sets["evens"].mpi_comm is None,
          "Horovod's mpi_comm: COMM_WORLD for the global set, None for a rank list")
    exercise(global_process_set, rank, "world")


def set_from_a_communicator(rank: int, size: int, sets: dict) -> None:
    everyone = add_process_set(ProcessSet(MPI.COMM_WORLD))
    check(everyone.ranks == list(range(size)) and everyone.mpi_comm is MPI.COMM_WORLD,
          f"ranks {everyone.ranks}, mpi_comm {everyone.mpi_comm}")
    exercise(everyone, rank, "everyone")
    remove_process_set(everyone)


def registration_disagreements(rank: int, size: int, sets: dict) -> None:
    evens, odds = sets["evens"], sets["odds"]
    check(remove_process_set(evens), "removing evens returned False")
    expect_error(lambda: collectives.allreduce_async(
        np.ones(1), np.ones(1), "gone", ReduceOp.SUM, process_set=evens),
        ValueError, "not registered", what="allreduce on a removed set")
    # Different lists on different ranks: every rank raises, naming each one's list.
    expect_error(lambda: add_process_set([0, 1] if rank == 0 else [1, 2]), ValueError,
                 "different rank lists", "rank 0: [0, 1]", "rank 1: [1, 2]", "rank 2: [1, 2]",
                 what="add_process_set of different lists")
    # A remove of different sets, or an add meeting a remove: every rank raises.
    spare = add_process_set([1, 2])
    expect_error(lambda: remove_process_set(odds if rank == 1 else spare), ValueError,
                 "different process sets", f"rank 1: {odds.process_set_id}",
                 f"rank 0: {spare.process_set_id}", what="remove_process_set of different sets")
    expect_error(lambda: remove_process_set(spare) if rank == 0 else add_process_set([0, 2]),
                 ValueError, "different calls", "rank 0: remove_process_set",
                 "rank 1: add_process_set([0, 2])", what="a remove meeting an add")
    # A set this rank never registered, or the global set, against a registered one.
    expect_error(lambda: remove_process_set(spare if rank != 2 else ProcessSet([0, 2])),
                 ValueError, "different process sets", f"rank 0: {spare.process_set_id}",
                 "rank 2: None", what="removing a set never registered on rank 2")
    expect_error(lambda: remove_process_set(spare if rank else global_process_set),
                 ValueError, "rank 0: the global process set cannot be removed",
                 what="removing the global set")
    check(remove_process_set(ProcessSet([0, 1])) is False,  # on every rank: nothing to do
          "removing a set never added did not return False")
    # A second set with the same ranks: Horovod's rule (refused), with the existing
    # set's id and the way out, said once for all ranks.
    twin = spare.process_set_id
    expect_error(lambda: add_process_set([1, 2]), ValueError, "add_process_set: a process set "
                 f"with ranks [1, 2] already exists (process set id {twin})",
                 "hvd.remove_process_set()", "(on every rank)", what="a second set [1, 2]")
    remove_process_set(spare)
    remove_process_set(odds)


def comm_null_on_one_rank(rank: int, size: int, sets: dict) -> None:
    """MPI.COMM_NULL on one rank (Split with MPI.UNDEFINED): every rank raises."""
    lonely = MPI.COMM_WORLD.Split(color=0 if rank < 2 else MPI.UNDEFINED, key=rank)
    expect_error(lambda: add_process_set(ProcessSet(lonely)), ValueError, "rank 2: ",
                 "MPI.COMM_NULL", what="a set from MPI.COMM_NULL on rank 2")


def set_per_split_group(rank: int, size: int, sets: dict) -> None:
    """Each rank its own group (Horovod's ProcessSet(comm.Split(...)) pattern)."""
    halves = add_process_set(ProcessSet(MPI.COMM_WORLD.Split(color=rank % 2, key=rank)))
    check(halves.ranks == ([0, 2] if rank % 2 == 0 else [1]), f"halves: {halves.ranks}")
    exercise(halves, rank, "halves")
    remove_process_set(halves)


def added_again(rank: int, size: int, sets: dict) -> None:
    again = add_process_set([0, 1])
    if again.included():
        exercise(again, rank, "again")
    remove_process_set(again)


def init_again_registers_its_sets(rank: int, size: int, sets: dict) -> None:
    """init() on an initialized process registers the sets it is given (it used to drop
    them silently); a list with a refused set registers none of them, so a corrected
    list can be passed again (Horovod's process-set suites do this)."""
    pair = ProcessSet([0, 1])
    api.init(process_sets=[pair])
    check(pair.process_set_id is not None and pair.ranks == [0, 1],
          f"init() again did not register {pair!r}")
    if pair.included():
        exercise(pair, rank, "pair")
    first, clash = ProcessSet([1, 2]), ProcessSet([0, 2])  # [0, 2]: evens exists
    expect_error(lambda: api.init(process_sets=[first, clash]), ValueError,
                 "already exists", what="init() with a set whose ranks a set has")
    check(first.process_set_id is None and clash.process_set_id is None,
          f"after the refusal: {first!r}, {clash!r}")
    api.init(process_sets=[first])
    check(first.process_set_id == pair.process_set_id + 1,
          f"{first!r}: the refused call's ids are free again (pair: {pair!r})")
    if first.included():
        exercise(first, rank, "first")


STATIC_CHECKS = [membership, collectives_on_a_set, errors_on_a_set, world]
DYNAMIC_CHECKS = [set_from_a_communicator, *STATIC_CHECKS, registration_disagreements,
                  comm_null_on_one_rank, set_per_split_group, added_again]

if __name__ == "__main__":
    mode = sys.argv[1]
    evens_static = ProcessSet([0, 2])
    api.init(process_sets="dynamic" if mode == "dynamic" else [evens_static])
    if mode == "static":
        sets = {"evens": evens_static, "odds": None}
    else:
        sets = {"evens": add_process_set([0, 2]), "odds": add_process_set([1])}
    # (Its sets stay registered: last, and only where no later check adds sets.)
    run_checks([*STATIC_CHECKS, init_again_registers_its_sets] if mode == "static"
               else DYNAMIC_CHECKS, api.rank(), api.size(), sets)
