"""Process sets on 3 ranks: collectives on a set that excludes a rank, dynamic add/remove."""
from __future__ import annotations

from pathlib import Path

import pytest

from horovodish.common.api.process_sets import disagreement, new_groups
from multirank import assert_ranks_ok, run_ranks

WORKERS = Path(__file__).parent / "workers"
STATIC_CHECKS = ["membership", "collectives_on_a_set", "errors_on_a_set", "world"]
DYNAMIC_CHECKS = ["set_from_a_communicator", *STATIC_CHECKS, "registration_disagreements",
                  "comm_null_on_one_rank", "set_per_split_group", "added_again",
                  "unnamed_ops_pair_after_reinit"]


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_process_sets(mode):
    result = run_ranks(WORKERS / "process_sets_worker.py", 3, args=[mode], timeout=120)
    assert_ranks_ok(result, 3, [*STATIC_CHECKS, "init_again_registers_its_sets"]
                    if mode == "static" else DYNAMIC_CHECKS)


def test_init_and_shutdown_alternate_without_running_out_of_communicators():
    result = run_ranks(WORKERS / "reinit_worker.py", 2, timeout=180)
    assert_ranks_ok(result, 2, ["init_and_shutdown_alternate"])


def test_init_with_a_list_of_ranks_and_a_rank_left_out():
    """The rank left out checks the ValueError's message (worker_support.expect_error)."""
    result = run_ranks(WORKERS / "init_subset_worker.py", 3, timeout=60)
    assert_ranks_ok(result, 3, ["init_with_ranks_0_and_1"])


ADD, REMOVE, INIT = "add_process_set", "remove_process_set", "init"


@pytest.mark.parametrize("proposals", [
    [(ADD, [0, 2], None)] * 3,
    [(ADD, [0, 2], None), (ADD, [1], None), (ADD, [0, 2], None)],  # comm.Split's groups
    [(REMOVE, 4, None)] * 3,
])
def test_registration_proposals_that_go_ahead(proposals):
    assert disagreement(proposals) is None


@pytest.mark.parametrize("proposals,needles", [
    ([(ADD, [0, 1], None), (ADD, [1, 2], None), (ADD, [1, 2], None)],
     ["different rank lists", "rank 0: [0, 1]; rank 1: [1, 2]; rank 2: [1, 2]"]),
    ([(ADD, [0, 2], None), (ADD, [1], None), (ADD, [2], None)],  # rank 0 counts 2 in, 2 not
     ["different rank lists", "rank 2: [2]"]),
    ([(ADD, [1], None), (ADD, [1], None)], None),  # the same list: fine, rank 0 is outside
    ([(REMOVE, 1, None), (REMOVE, 2, None)], ["different process sets", "ids: rank 0: 1; rank 1: 2"]),
    ([(ADD, [0, 1], None), (REMOVE, 1, None)],
     ["different calls", "rank 0: add_process_set([0, 1]); rank 1: remove_process_set(1)"]),
    ([(ADD, [0, 1], None), (ADD, [0, 1], "a process set with ranks [0, 1] already exists")],
     ["rank 1: a process set with ranks [0, 1] already exists"]),
    ([(ADD, [0, 1], "it exists")] * 2, ["it exists (on every rank)"]),  # said once
])
def test_registration_proposals_that_cannot(proposals, needles):
    problem = disagreement(proposals)
    if needles is None:
        assert problem is None
        return
    assert problem is not None
    for needle in needles:
        assert needle in problem, problem


def test_init_proposals():
    """init()'s: per set, (made from a communicator, ranks); a Split's groups go ahead,
    other differences are named by entry."""
    split = [(INIT, [(True, [0, 2]), (False, [1])], None),
             (INIT, [(True, [1]), (False, [1])], None),
             (INIT, [(True, [0, 2]), (False, [1])], None)]
    assert disagreement(split) is None
    problem = disagreement([(INIT, [(False, [0, 1])], None), (INIT, [(False, [1])], None)])
    assert "process_sets entry number 0 has different ranks" in problem, problem
    assert "rank 0: [0, 1]; rank 1: [1]" in problem, problem
    problem = disagreement([(INIT, [(False, [0])], None), (INIT, [], None)])
    assert "different numbers of process sets (rank 0: 1; rank 1: 0)" in problem, problem


def test_removing_each_rank_its_group():
    """A remove may name each rank's group of one comm.Split (every group goes)."""
    groups = {0: [0, 1, 2], 3: [0, 2], 4: [1]}
    assert disagreement([(REMOVE, 3, None), (REMOVE, 4, None), (REMOVE, 3, None)],
                        groups) is None
    problem = disagreement([(REMOVE, 3, None), (REMOVE, 3, None), (REMOVE, 4, None)], groups)
    assert "different process sets" in problem, problem  # rank 1 is not in set 3


def test_new_groups_in_horovods_order():
    """Sets made from communicators first (each one's groups sorted), then rank lists;
    groups registered already, or met before, are left out."""
    entries = [[(False, [0]), (True, [0, 2]), (True, [0, 1, 2]), (False, [1, 2])],
               [(False, [0]), (True, [1]), (True, [0, 1, 2]), (False, [1, 2])],
               [(False, [0]), (True, [0, 2]), (True, [0, 1, 2]), (False, [1, 2])]]
    assert new_groups(entries, {(0, 1, 2)}) == [(0, 2), (1,), (0,), (1, 2)]
    assert new_groups(entries, {(0, 1, 2), (1,), (1, 2)}) == [(0, 2), (0,)]
