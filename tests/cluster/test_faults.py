"""Faults across hosts end the job on every host: a non-zero exit, within 60 s of the
fault, a message naming the lost host or rank, and no process left on any host (run_job
checks that after every job)."""
from __future__ import annotations

import threading
import time
from pathlib import Path

from .jobs import run_job

COMMON_FAULTS = Path(__file__).parents[1] / "common" / "workers" / "faults_worker.py"


def test_a_rank_killed_on_the_second_host(cluster, tmp_path):
    start = time.monotonic()
    result = run_job(cluster, "faults_worker.py", args=["killed", tmp_path / "ready"],
                     timeout=90)
    assert time.monotonic() - start < 60, result.stdout
    assert result.returncode != 0, result.stdout
    assert "BAD TERMINATION" in result.stdout and "RUNNING AT h2" in result.stdout, \
        result.stdout


def test_a_host_whose_link_goes_down(cluster, tmp_path):
    """h2's cable is pulled mid-job: MPI alone would wait for ever; the heartbeat between
    hosts (6 s here, 30 s by default) ends both sides."""
    ready = tmp_path / "ready"
    pulled: list[float] = []

    def pull_when_running() -> None:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        cluster.set_link("h2", False)
        pulled.append(time.monotonic())

    puller = threading.Thread(target=pull_when_running, daemon=True)
    puller.start()
    try:
        result = run_job(cluster, "faults_worker.py", args=["link_pulled", ready], timeout=90,
                         env={"HOROVODISH_HEARTBEAT_TIMEOUT": "6"})
        ended = time.monotonic()
    finally:
        puller.join()
        cluster.set_link("h2", True)
    assert pulled, "the job never got going"
    assert ended - pulled[0] < 60, result.stdout
    assert result.returncode != 0, result.stdout
    assert "lost contact with host h2 (ranks 2, 3): nothing heard from it for" \
        in result.stdout, result.stdout


def test_a_stall_across_hosts_names_the_rank_and_ends_the_job(cluster):
    start = time.monotonic()
    result = run_job(cluster, COMMON_FAULTS, "h1:1,h2:1", args=["stalls"], timeout=90,
                     env={"HOROVODISH_STALL_CHECK_TIME_SECONDS": "2",
                          "HOROVODISH_STALL_SHUTDOWN_TIME_SECONDS": "5"})
    assert time.monotonic() - start < 40, result.stdout
    assert result.returncode != 0, result.stdout
    assert "rank 1 has not submitted: lonely_tensor" in result.stdout, result.stdout


def test_a_rank_that_raises_on_the_second_host(cluster):
    result = run_job(cluster, COMMON_FAULTS, "h1:1,h2:2", args=["raises"], timeout=90)
    assert result.returncode != 0, result.stdout
    assert "deliberate failure on rank 1" in result.stdout, result.stdout
    assert "because rank 1 shut down" in result.stdout, result.stdout
