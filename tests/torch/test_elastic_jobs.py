"""Elastic jobs under the launcher (horovodishrun --min-np): a rank SIGKILLed mid-epoch,
rank 0 included, and a discovery script that adds slots mid-run. Each job trains the
digits MLP (tests/torch/workers/elastic_digits_worker.py); the test reads its logs and
checks, against a replay of the surviving schedule in one process (tests/elastic_replay.py):
nothing committed was lost, each sample of each epoch was used exactly once, and the final
weights equal the replay's to 1e-6 (float64)."""
from __future__ import annotations

import re

import pytest

from elastic_replay import (WORKER, assert_each_sample_once_per_epoch, assert_matches_replay,
                            read)
from multirank import assert_ranks_ok, run_ranks

SAMPLES = 1797  # sklearn's digits


@pytest.mark.parametrize("victim", [1, 0])
def test_a_killed_rank_and_the_job_goes_on_from_its_last_commit(tmp_path, victim):
    result = run_ranks(WORKER, 3, args=[tmp_path, "--kill", victim, 12],
                       launcher_args=["--min-np", "2"], timeout=150)
    assert_ranks_ok(result, 2, ["same_model_everywhere"])
    assert re.search(rf"generation 1 ended: rank {victim} on localhost was killed by SIGKILL",
                     result.stdout), result.stdout
    assert "generation 2 on 2 ranks (localhost:2)" in result.stdout, result.stdout
    schedule = read(tmp_path)
    first, second = schedule.generations
    assert (first.size, second.size) == (3, 2)
    # Killed after step 12: steps 11 and 12 were not committed (commits every 5 steps).
    assert second.resume_step == 10 and schedule.rolled_back == 2, (second, schedule)
    assert len(first.commits) == 2 and second.resume_seq == 2
    assert_each_sample_once_per_epoch(schedule, SAMPLES)
    assert_matches_replay(tmp_path, schedule)


def test_new_slots_join_at_the_next_commit(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:2\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    result = run_ranks(WORKER, 2, args=[tmp_path, "--grow", hosts, "localhost:3", 8],
                       launcher_args=["--min-np", "2", "--max-np", "3",
                                      "--host-discovery-script", script], timeout=150)
    assert_ranks_ok(result, 3, ["same_model_everywhere"])
    assert "generation 1 ended: the hosts changed" in result.stdout, result.stdout
    assert "generation 2 on 3 ranks (localhost:3): restarting on the new hosts" \
        in result.stdout, result.stdout
    schedule = read(tmp_path)
    first, second = schedule.generations
    assert (first.size, second.size) == (2, 3)
    # It stopped at a commit after the new slots appeared: nothing to roll back.
    assert schedule.rolled_back == 0 and second.resume_step > 8, second
    assert_each_sample_once_per_epoch(schedule, SAMPLES)
    assert_matches_replay(tmp_path, schedule)
