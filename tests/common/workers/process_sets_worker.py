"""Collectives on process sets, each checked against numpy, while other ranks do other work."""
from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from worker_support import check, close, expect_error, run_checks  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import (ProcessSet, add_process_set, collectives,  # noqa: E402
                                   global_process_set, objects, remove_process_set)
from horovodish.compat.horovod_paths.common_basics import _basics  # noqa: E402
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
    check(global_process_set.mpi_comm is None and sets["evens"].mpi_comm is None,
          "Horovod's mpi_comm: None for the global set of init() without a communicator, "
          "and for a rank list")
    check(str(sets["evens"]) == f"ProcessSet(process_set_id={sets['evens'].process_set_id}, "
          "ranks=[0, 2], mpi_comm=None)", f"Horovod's str(): {sets['evens']}")
    exercise(global_process_set, rank, "world")


def set_from_a_communicator(rank: int, size: int, sets: dict) -> None:
    pair_comm = MPI.COMM_WORLD.Split(color=0 if rank < 2 else 1, key=rank)
    pair = add_process_set(ProcessSet(pair_comm))
    mine = [0, 1] if rank < 2 else [2]
    check(pair.ranks == mine and pair.mpi_comm is pair_comm,
          f"ranks {pair.ranks}, mpi_comm {pair.mpi_comm}")
    exercise(pair, rank, "pair")
    remove_process_set(pair)
    # Every rank is the global set: Horovod's rule refuses a second set of them.
    for everyone in (ProcessSet(MPI.COMM_WORLD), list(range(size))):
        expect_error(lambda: add_process_set(everyone), ValueError,
                     "already exists: the global process set (id 0)",
                     "hvd.global_process_set", "(on every rank)", what="a set of every rank")


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
                 ValueError, "different process sets", "rank 0: None",
                 f"rank 1: {spare.process_set_id}", what="the global set against another")
    check(remove_process_set(global_process_set) is False and
          global_process_set.process_set_id == 0,
          "removing the global set on every rank did not return False (Horovod's answer)")
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
    """Each rank its own group (Horovod's ProcessSet(comm.Split(...)) pattern): each
    group gets an id of its own, as in Horovod, and removing them (each rank its own)
    frees both ids, which the next sets reuse first in first out, as Horovod's do."""
    before = _basics._get_process_set_ids_and_ranks()
    halves = add_process_set(ProcessSet(MPI.COMM_WORLD.Split(color=rank % 2, key=rank)))
    check(halves.ranks == ([0, 2] if rank % 2 == 0 else [1]), f"halves: {halves.ranks}")
    table = _basics._get_process_set_ids_and_ranks()
    new = {set_id: ranks for set_id, ranks in table.items() if set_id not in before}
    check(sorted(new.values()) == [[0, 2], [1]] and new[halves.process_set_id] == halves.ranks,
          f"the groups' ids: {new} (mine {halves.process_set_id})")
    check(_basics._comm_process_set_id(halves.mpi_comm) == halves.process_set_id,
          "_comm_process_set_id of the Split communicator")
    exercise(halves, rank, "halves")
    check(remove_process_set(halves) and halves.process_set_id is None,
          f"removing each rank's half: {halves!r}")
    check(_basics._get_process_set_ids_and_ranks() == before, "both groups were removed")
    free = list(api.state().free_process_set_ids)
    check(free[-2:] == sorted(new), f"freed ids {free}, the halves' {sorted(new)} last")
    first, second = add_process_set([0]), add_process_set([1, 2])
    check([first.process_set_id, second.process_set_id] == free[:2],
          f"ids {first.process_set_id}, {second.process_set_id}: not the first freed {free}")
    remove_process_set(first)
    remove_process_set(second)


def added_again(rank: int, size: int, sets: dict) -> None:
    again = add_process_set([0, 1])
    if again.included():
        exercise(again, rank, "again")
    remove_process_set(again)


def init_again_registers_its_sets(rank: int, size: int, sets: dict) -> None:
    """init() on an initialized process registers the sets it is given (it used to drop
    them silently). As in Horovod (its test_process_sets_static.py): a duplicate in the
    list (the global set's ranks, or an entry's twice) raises ValueError on every rank
    and stays unregistered, while the other entries' groups stay registered; a set of
    ranks a registered set has takes its id."""
    pair = ProcessSet([0, 1])
    api.init(process_sets=[pair])
    check(pair.process_set_id is not None and pair.ranks == [0, 1],
          f"init() again did not register {pair!r}")
    if pair.included():
        exercise(pair, rank, "pair")
    first, every, again = ProcessSet([1, 2]), ProcessSet([2, 1, 0]), ProcessSet([2, 1])
    expect_error(lambda: api.init(process_sets=[first, every, again]), ValueError,
                 "process_sets entry number 1 is a duplicate", what="a duplicate in init()")
    check(every.process_set_id is None and again.process_set_id is None and
          first.process_set_id == pair.process_set_id + 1,
          f"after the refusal: {first!r}, {every!r}, {again!r}")
    evens = ProcessSet([2, 0])  # the static set's ranks: takes its id
    api.init(process_sets=[again, evens])
    check(again.process_set_id == first.process_set_id and
          evens.process_set_id == sets["evens"].process_set_id,
          f"{again!r} and {evens!r} take the registered sets' ids")
    check(_basics._get_process_set_ids_and_ranks() == {
        0: [0, 1, 2], sets["evens"].process_set_id: [0, 2], pair.process_set_id: [0, 1],
        first.process_set_id: [1, 2]}, f"{_basics._get_process_set_ids_and_ranks()}")
    if again.included():
        exercise(again, rank, "again")


def unnamed_ops_pair_after_reinit(rank: int, size: int, sets: dict) -> None:
    """Set ids restart at 1 after shutdown(), maybe with other members: unnamed ops are
    numbered from 0 again, or a rank that was in set 1 before would name its op apart
    from one that was not, and the two would wait for each other (a hang)."""
    for members in ([0, 1], [1, 2]):
        api.shutdown()
        api.init(process_sets="dynamic")
        group = add_process_set(members)
        if group.included():
            mine = np.full(3, float(rank))
            got = collectives.allreduce_async(
                mine, None, collectives.auto_name("allreduce", group), ReduceOp.SUM,
                process_set=group).wait()
            close(got, np.full(3, float(sum(members))), f"unnamed op on {members}")


STATIC_CHECKS = [membership, collectives_on_a_set, errors_on_a_set, world]
DYNAMIC_CHECKS = [set_from_a_communicator, *STATIC_CHECKS, registration_disagreements,
                  comm_null_on_one_rank, set_per_split_group, added_again,
                  unnamed_ops_pair_after_reinit]

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
