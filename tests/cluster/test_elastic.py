"""An elastic job across hosts: h3's link goes down mid-run; the heartbeat ends the job,
the launcher drops h3 and goes on on h1 and h2 from the last commit, and the result is
checked against a replay of the surviving schedule (tests/elastic_replay.py)."""
from __future__ import annotations

import re
import threading
import time

from elastic_replay import WORKER, assert_each_sample_once_per_epoch, assert_matches_replay, read
from multirank import assert_ranks_ok

from .jobs import run_job


def test_a_host_whose_link_goes_down_and_the_job_goes_on(cluster, tmp_path):
    ready = tmp_path / "ready"
    pulled: list[float] = []

    def pull_when_running() -> None:
        deadline = time.monotonic() + 90
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        cluster.set_link("h3", False)
        pulled.append(time.monotonic())

    puller = threading.Thread(target=pull_when_running, daemon=True)
    puller.start()
    try:
        result = run_job(cluster, WORKER, "h1:1,h2:1,h3:1", timeout=150,
                         args=[tmp_path, "--ready", ready, 7],
                         launcher_args=["--min-np", "2"],
                         env={"HOROVODISH_HEARTBEAT_TIMEOUT": "4"})
    finally:
        puller.join()
        cluster.set_link("h3", True)
    assert pulled, "the job never got going"
    assert_ranks_ok(result, 2, ["same_model_everywhere"])
    assert re.search(r"generation 1 ended: host h3 lost \(ranks 2\): horovodish: lost "
                     r"contact with host h3", result.stdout), result.stdout
    assert "dropping host h3 for the rest of the job" in result.stdout, result.stdout
    assert "generation 2 on 2 ranks (h1:1,h2:1)" in result.stdout, result.stdout
    schedule = read(tmp_path)
    assert [g.size for g in schedule.generations] == [3, 2]
    assert schedule.generations[1].resume_step >= 5
    assert_each_sample_once_per_epoch(schedule, 1797)
    assert_matches_replay(tmp_path, schedule)
