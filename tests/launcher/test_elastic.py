"""The elastic launcher's parts in one process (discovery output, the blacklist and its
cooldown, placement, reading why a job ended), and its failure paths on real jobs of a
light worker (no framework): too few slots for --elastic-timeout, a script that fails
the same way every time (--reset-limit, or no commit in between)."""
from __future__ import annotations

import math
import re
import time
from pathlib import Path

import pytest

from horovodish.launcher.discovery import (Blacklist, DiscoveryScript, parse_discovery, plan,
                                           host_of_rank)
from horovodish.launcher.driver import Reports
from horovodish.launcher.elastic import judge
from horovodish.launcher.hosts import Host
from multirank import run_ranks

WORKER = Path(__file__).parent / "workers" / "elastic_failures_worker.py"


def test_discovery_output():
    assert parse_discovery("h1:4\n\nh2\n h3:1 \n", 2) == {"h1": 4, "h2": 2, "h3": 1}
    for bad in ("h1:0", "h1:x", "two words", ":3"):
        with pytest.raises(ValueError, match="line 1"):
            parse_discovery(bad, 1)


def test_a_failing_discovery_script_says_why(tmp_path):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho 'no cloud credentials' >&2\nexit 3\n")
    script.chmod(0o755)
    with pytest.raises(RuntimeError, match="exited with code 3: no cloud credentials"):
        DiscoveryScript(str(script), 1).find()


def test_blacklist_drops_hosts_and_slots_for_good_by_default():
    blacklist = Blacklist()
    assert blacklist.drop("h1", 1) == math.inf
    blacklist.drop("h2")
    assert blacklist.apply({"h1": 4, "h2": 2, "h3": 1}) == {"h1": 3, "h3": 1}


def test_cooldown_doubles_per_failure_up_to_its_maximum():
    now = [0.0]
    blacklist = Blacklist(cooldown=(10, 35), clock=lambda: now[0], jitter=lambda: 0.5)
    assert [blacklist.drop("h1") for _ in range(3)] == [15, 25, 35]
    now[0] = 30
    assert blacklist.apply({"h1": 2}) == {}
    now[0] = 36
    assert blacklist.apply({"h1": 2}) == {"h1": 2}


def test_placement_keeps_earlier_hosts_first_up_to_max_np():
    hosts = {"new": 2, "h2": 2, "h1": 2}
    assert plan(hosts, ["h1", "h2"], 5) == [Host("h1", 2, "colon"), Host("h2", 2, "colon"),
                                            Host("new", 1, "colon")]
    assert host_of_rank(plan(hosts, ["h1", "h2"], None), 3) == "h2"


def test_why_a_job_ended():
    hosts = [Host("h1", 2), Host("h2", 2)]
    lost = Reports(lost=[{"ranks": [2, 3], "text": "lost contact"}],
                   exits=[{"rank": 0, "code": 1}])
    assert judge(1, lost, hosts).lost_hosts == ["h2"]
    killed = Reports(exits=[{"rank": 3, "signal": 9}, {"rank": 1, "signal": 9}])
    outcome = judge(9, killed, hosts)
    assert (outcome.kind, outcome.killed_on) == ("killed", "h2")
    failed = Reports(exits=[{"rank": 1, "code": 1}], errors={1: "ValueError: bad"})
    assert judge(1, failed, hosts).text == "rank 1 on h1 exited with code 1: ValueError: bad"
    assert judge(0, Reports(restart=True), hosts).kind == "restart"
    assert judge(0, Reports(), hosts).kind == "done"


def test_too_few_slots_for_the_elastic_timeout_ends_the_job():
    start = time.monotonic()
    result = run_ranks(WORKER, 2, args=["killed"], timeout=60,
                       launcher_args=["--min-np", "2", "--elastic-timeout", "2"])
    assert result.returncode != 0, result.stdout
    assert "dropping 1 slot of localhost for the rest of the job" in result.stdout
    assert re.search(r"ending the job: 1 slot available \(localhost:1\), fewer than "
                     r"--min-np 2, for 2 s \(--elastic-timeout\)", result.stdout), result.stdout
    assert time.monotonic() - start < 40, result.stdout


def test_a_script_that_always_fails_ends_after_the_reset_limit():
    result = run_ranks(WORKER, 2, args=["raises"], timeout=90,
                       launcher_args=["--min-np", "2", "--reset-limit", "2"])
    assert result.returncode == 1, result.stdout
    assert len(re.findall(r"generation \d ended: rank 1 on localhost exited with code 1: "
                          r"ValueError: deliberate failure", result.stdout)) == 3, result.stdout
    assert "ending the job: 2 restarts reached --reset-limit 2; the last failure: rank 1 on " \
           "localhost exited with code 1: ValueError: deliberate failure in generation 3" \
        in result.stdout, result.stdout
    # Each generation went on from the commit at step 5.
    assert result.stdout.count("from step 5") == 2 * 2, result.stdout


def test_without_a_reset_limit_a_failure_that_repeats_from_the_same_commit_ends_it():
    result = run_ranks(WORKER, 2, args=["raises"], timeout=90, launcher_args=["--min-np", "2"])
    assert result.returncode == 1, result.stdout
    assert "ending the job: it failed again with no commit in between" in result.stdout
    assert "generation 3" not in result.stdout, result.stdout
