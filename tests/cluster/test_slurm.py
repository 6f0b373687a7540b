"""Jobs under a real Slurm (tests/cluster/slurm.py: slurmctld, a slurmd on each of two
emulated hosts, munge), started the ways users start them: srun, salloc with
horovodishrun, the sbatch scripts in examples/slurm/. Results are checked against numpy
on every rank (or against the digits example's accuracy and a replay of the elastic
schedule), placement against the hostnames; after each test no job and no job process
is left (the ``slurm`` fixture)."""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from elastic_replay import WORKER as ELASTIC_WORKER
from elastic_replay import assert_each_sample_once_per_epoch, assert_matches_replay, read
from multirank import assert_ranks_ok

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parent / "workers" / "scheduled_worker.py"
CHECKS = ["check_topology", "check_allreduce", "check_other_collectives"]
LAUNCHER = [sys.executable, "-m", "horovodish.launcher"]
def test_srun_with_pmi2_starts_one_job(slurm):
    result = slurm.run(["srun", "-N2", "-n4", "--mpi=pmi2", sys.executable, WORKER,
                          "h1:2,h2:2"])
    assert_ranks_ok(result, 4, CHECKS)


def test_plain_srun_without_pmi_forms_one_job(slurm):
    """Slurm's default MpiDefault=none starts four tasks with no PMI: init() forms one
    world from SLURM_PROCID, SLURM_STEP_NUM_TASKS and SLURM_STEP_NODELIST (rank 0's PMI
    server on h1, on a port derived from the job and step ids)."""
    result = slurm.run(["srun", "-N2", "-n4", sys.executable, WORKER, "h1:2,h2:2"])
    assert_ranks_ok(result, 4, CHECKS)
    assert "sees a world of 1" not in result.stdout, result.stdout


def test_salloc_then_horovodishrun_takes_the_allocation(slurm, tmp_path):
    result = slurm.run(["salloc", "-N2", "-n4", *LAUNCHER, sys.executable, WORKER,
                        "h1:2,h2:2"], cwd=tmp_path)
    assert_ranks_ok(result, 4, CHECKS)
    # srun (Hydra's launcher here) got no ssh option: it would have written the ranks'
    # output to a file named after it.
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_sbatch_runs_the_main_job_script(slurm, tmp_path):
    """examples/slurm/train.sbatch (its command given, the worker: the digits example it
    runs by default is tested on its own): horovodishrun inside the batch job."""
    out = tmp_path / "job.out"
    code, state = slurm.batch([f"--chdir={ROOT}", f"--output={out}",
                               ROOT / "examples" / "slurm" / "train.sbatch",
                               sys.executable, WORKER, "h1:2,h2:2"], timeout=120)
    job = subprocess.CompletedProcess("sbatch", code, f"{state}\n{out.read_text()}", None)
    assert_ranks_ok(job, 4, CHECKS)
    assert state == "COMPLETED", job.stdout


def test_a_node_lost_mid_job_ends_it_with_horovodish_s_message(slurm):
    """h2's cable is pulled while srun's job runs. Slurm would wait SlurmdTimeout (600 s
    here); horovodish's heartbeat between hosts (6 s here, 30 s by default) ends the job
    and names h2."""
    argv = ["srun", "-N2", "-n4", "--mpi=pmi2", sys.executable, WORKER, "h1:2,h2:2", "300"]
    proc = subprocess.Popen(slurm.cluster.on_host("h1", [str(a) for a in argv]),
                            env=slurm.env(HOROVODISH_HEARTBEAT_TIMEOUT="6"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while sum("running" in line for line in lines) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sum("running" in line for line in lines) == 4, "".join(lines)
        slurm.cluster.set_link("h2", False)
        pulled = time.monotonic()
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
        ended = time.monotonic()
    finally:
        slurm.cluster.set_link("h2", True)
    reader.join(10)
    output = "".join(lines)
    assert ended - pulled < 60, output
    assert proc.returncode != 0, output
    assert "horovodish: lost contact with host h2 (ranks 2, 3): nothing heard from it " \
        "for 6 s" in output, output
    slurm.assert_nothing_left(within=60)  # h2's slurmstepd hears of the end once back


@pytest.mark.parametrize("loss", ["drained", "link down"])
def test_elastic_job_leaves_a_lost_node_and_goes_on(slurm, tmp_path, loss):
    """examples/slurm/elastic.sbatch (--no-kill, horovodish-slurm-hosts) with the elastic
    test worker; after step 6, h2 is drained (the discovery leaves it out: the ranks
    leave at their next commit) or its link goes down (the heartbeat ends the
    generation; Slurm notices only after SlurmdTimeout). Either way the job finishes on
    h1's task from its last commit, and its weights match a replay of what survived."""
    out, ready = tmp_path / "job.out", tmp_path / "ready"
    acted: list[float] = []

    def lose_h2_when_running() -> None:
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not ready.exists():
            return
        if loss == "drained":
            slurm.drain("h2", "elastic-test")
        else:
            slurm.cluster.set_link("h2", False)
        acted.append(time.monotonic())
        # The lost node comes back once the job has gone on without it, so that Slurm can
        # end the job's step there (it would wait SlurmdTimeout otherwise).
        while "generation 2 on" not in (out.read_text() if out.exists() else "") \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        slurm.cluster.set_link("h2", True)

    actor = threading.Thread(target=lose_h2_when_running, daemon=True)
    actor.start()
    try:
        code, state = slurm.batch([f"--chdir={ROOT}", f"--output={out}",
                                   "--ntasks-per-node=1",  # CI's 2 cores: 2 ranks, then 1
                                   ROOT / "examples" / "slurm" / "elastic.sbatch",
                                   sys.executable, ELASTIC_WORKER, tmp_path, "--ready", ready,
                                   6], timeout=240, MIN_NP="1", HOROVODISH_HEARTBEAT_TIMEOUT="4")
    finally:
        actor.join()
        slurm.cluster.set_link("h2", True)
        slurm.resume("h2")
    log = f"{state}\n" + (out.read_text() if out.exists() else "")
    assert acted, "the job never got going:\n" + log
    assert code == 0 and state == "COMPLETED", log
    assert "generation 1 on 2 ranks (h1:1,h2:1)" in log, log
    if loss == "link down":
        assert re.search(r"generation 1 ended: host h2 lost \(ranks 1\): horovodish: lost "
                         r"contact with host h2", log), log
    assert "generation 2 on 1 rank (h1:1)" in log, log
    schedule = read(tmp_path)
    assert [g.size for g in schedule.generations] == [2, 1], log
    assert schedule.generations[1].resume_step >= 5, log  # the first commit, at step 5
    assert_each_sample_once_per_epoch(schedule, 1797)
    assert_matches_replay(tmp_path, schedule)
