"""Jobs that MPI's own process manager did not start form one MPI world all the same
(horovodish/common/world): under torchrun, in a bare RANK/WORLD_SIZE/MASTER_ADDR
environment (Kubeflow's PyTorchJob, SageMaker, AzureML), with every process at
LOCAL_RANK=0 (Spark's TorchDistributor), beside torch.distributed, and under
``horovodishrun --gloo``. Each job runs the real launcher and checks its results
against numpy or one process on the whole batch, and where each rank is against the
host it runs on. The faults: a rank that never arrives, a rank that dies, a rank killed
under ``torchrun --max-restarts`` with elastic training (its final weights against a
replay), hostile connections to the PMI server while a job forms. Multi-host launches
(torchrun's c10d rendezvous on two hosts, srun without PMI, --gloo over ssh) are in
tests/cluster/test_launch_anywhere.py."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from elastic_replay import WORKER as ELASTIC_WORKER
from elastic_replay import assert_resumed_after_a_kill_at_step_12
from multirank import (assert_digits_example, assert_ranks_ok, free_port, run_command,
                       run_environment_ranks)

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
WORKER = HERE / "workers" / "launched_worker.py"
TORCH_COLLECTIVES = ROOT / "tests" / "torch" / "workers" / "collectives_worker.py"
CORE = ["check_topology", "check_backend_choice", "check_other_collectives"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--monitor-interval", "0.5"]
LAUNCHER = [sys.executable, "-m", "horovodish.launcher"]


def layout(np: int) -> str:
    return f"{socket.gethostname()}:{np}"


def servers_left() -> list[str]:
    """PMI servers still running (a job must leave none)."""
    out = subprocess.run(["pgrep", "-af", "horovodish.common.world.serve"],
                         capture_output=True, text=True).stdout
    return out.splitlines()


def test_torchrun_runs_every_collective_and_the_optimizer():
    np = 3
    result = run_command([*TORCHRUN, f"--nproc_per_node={np}", TORCH_COLLECTIVES],
                         timeout=240)
    assert_ranks_ok(result, np, ["topology", "allreduce", "allgather", "broadcast",
                                 "alltoall", "reducescatter", "errors", "optimizer_steps"])
    assert not servers_left()


def test_torchrun_beside_torch_distributed():
    """init_process_group before hvd.init() (after it: the bare environment's test
    below): one store, one rank numbering."""
    result = run_command([*TORCHRUN, "--nproc_per_node=2", WORKER, layout(2), "torch",
                          "--torch-distributed", "first"], timeout=180)
    assert_ranks_ok(result, 2, [*CORE, "check_distributed_optimizer",
                                "beside_torch_distributed"])


def test_torchrun_runs_the_main_job():
    result = run_command([*TORCHRUN, "--nproc_per_node=2",
                          ROOT / "examples" / "pytorch_digits.py"], timeout=180)
    assert_digits_example(result, 2)


def test_a_bare_environment_beside_torch_distributed_that_comes_later():
    """hvd.init() listens on MASTER_PORT until every rank is in; init_process_group
    then takes the port for its own store."""
    result = run_environment_ranks(WORKER, 2, [layout(2), "core", "--torch-distributed",
                                               "after"], timeout=180)
    assert_ranks_ok(result, 2, [*CORE, "beside_torch_distributed"])


@pytest.mark.parametrize("framework", ["tensorflow", "jax"])
def test_a_bare_environment_with_every_rank_at_local_rank_0(framework):
    """As Spark's TorchDistributor starts them: LOCAL_RANK=0 on every process of the
    host. The topology comes from the hosts the ranks report, not from LOCAL_RANK."""
    result = run_environment_ranks(WORKER, 2, [layout(2), framework],
                                   env={"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"},
                                   timeout=240)
    extra = ["check_tape"] if framework == "tensorflow" else ["check_jax"]
    assert_ranks_ok(result, 2, [*CORE, *extra])


def test_hostile_connections_while_the_job_forms_change_nothing():
    """While 3 ranks start (the bare environment's server listens on MASTER_PORT), a
    stranger connects to it over and over: wrong keys, garbage, a 5 MB line, held
    connections. The job forms and its results are right; the server logged the
    refusals."""
    port = free_port()
    stop = threading.Event()
    attempts = {"n": 0}

    def hammer() -> None:
        payloads = [b'{"key":"guess","rank":1,"size":3,"role":"pmi","host":"x"}\n',
                    b"cmd=init pmi_version=1 pmi_subversion=1\n", b"\x00\xff" * 50 + b"\n",
                    b"y" * (5 << 20) + b"\n",
                    b'{"key":"guess","rank":99,"size":3,"role":"pmi","host":"x"}\n']
        held = []
        while not stop.is_set():
            for payload in payloads:
                try:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=1)
                    sock.sendall(payload)
                    attempts["n"] += 1
                    sock.close()
                    if len(held) < 30:  # and some that never say a word
                        held.append(socket.create_connection(("127.0.0.1", port), timeout=1))
                except OSError:
                    time.sleep(0.02)
        for sock in held:
            sock.close()

    thread = threading.Thread(target=hammer, daemon=True)
    thread.start()
    try:
        result = run_environment_ranks(WORKER, 3, [layout(3), "core"], timeout=180,
                                       port=port)
    finally:
        stop.set()
        thread.join(10)
    assert_ranks_ok(result, 3, [*CORE, "check_allreduce"])
    assert attempts["n"] > 0
    assert "refused: wrong job key" in result.stdout, result.stdout
    assert "refused: not a greeting" in result.stdout, result.stdout


ALLREDUCE_LOOP = """
import os, sys, time, numpy as np
from horovodish.common import api
from horovodish.common.api import collectives
from horovodish.common.messages import ReduceOp
api.init()
sys.stdout.write(f"rank {api.rank()} of {api.size()} running\\n"); sys.stdout.flush()
data = np.ones(1 << 18, np.float32)
for step in range(100000):
    collectives.allreduce_async(data, np.empty_like(data), "loop", ReduceOp.SUM).wait()
    if api.rank() == 1 and step == 50 and os.environ.get("DIE"):
        os.kill(os.getpid(), 9)
"""


def test_a_rank_that_never_arrives_is_named_on_every_rank(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(ALLREDUCE_LOOP)
    started = time.monotonic()
    result = run_environment_ranks(script, 3, ranks=[0, 1], timeout=60,
                                   env={"HOROVODISH_START_TIMEOUT": "4"})
    assert result.returncode != 0, result.stdout
    assert time.monotonic() - started < 30, result.stdout
    assert "running" not in result.stdout, result.stdout
    named = re.findall(r"rank\(s\) 2 of 3 did not reach the PMI server within the start "
                       r"timeout \(4 s\)", result.stdout)
    assert len(named) >= 2, result.stdout  # each rank that came (and the server's log)
    assert not servers_left()


def test_a_rank_that_dies_ends_the_job_everywhere(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(ALLREDUCE_LOOP)
    started = time.monotonic()
    result = run_environment_ranks(script, 3, env={"DIE": "1"}, timeout=90)
    assert time.monotonic() - started < 60, result.stdout
    assert result.returncode != 0, result.stdout
    for rank in (0, 2):
        assert f"horovodish: rank {rank}: the job is ending: rank 1 (on " \
            f"{socket.gethostname()}) exited or was killed before it finalized MPI" \
            in result.stdout, result.stdout
    assert not servers_left()


def test_elastic_under_torchrun_goes_on_from_the_last_commit(tmp_path):
    """Rank 1 SIGKILLs itself after step 12 (commits every 5 steps); the PMI server ends
    the other ranks, torchrun starts the group again, and the new one resumes from
    commit 2 (step 10), found on disk by torchrun's run id. Final weights: the replay's."""
    result = run_command([*TORCHRUN, "--nproc_per_node=3", "--max-restarts", "1",
                          ELASTIC_WORKER, tmp_path, "--kill", "1", "12"], timeout=240)
    assert_ranks_ok(result, 3, ["same_model_everywhere"])
    assert "the job is ending: rank 1" in result.stdout, result.stdout
    assert_resumed_after_a_kill_at_step_12(tmp_path, (3, 3))
    root = Path(f"/tmp/horovodish-elastic-{os.geteuid()}")
    assert not root.exists() or not any(root.iterdir()), list(root.iterdir())


def test_horovodishrun_gloo_starts_the_ranks_itself():
    result = run_command([*LAUNCHER, "--gloo", "-np", "3", sys.executable, WORKER,
                          layout(3), "core"], timeout=180)
    assert_ranks_ok(result, 3, [*CORE, "check_allreduce"])
    assert not servers_left()


def test_horovodishrun_gloo_ends_the_job_when_a_rank_fails(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(ALLREDUCE_LOOP)
    started = time.monotonic()
    result = run_command([*LAUNCHER, "--gloo", "-np", "3", sys.executable, script],
                         env={"DIE": "1"}, timeout=60)
    assert result.returncode != 0, result.stdout
    assert time.monotonic() - started < 30, result.stdout
    assert "rank 1 (on" in result.stdout, result.stdout
    assert not servers_left()


REFUSED = """
import mpi4py.MPI
{patch}
from horovodish.common import api
api.init()
print("TRAINED")
"""


@pytest.mark.parametrize("case", ["openmpi", "mpi4py first"])
def test_what_cannot_join_a_world_says_why_on_every_rank(tmp_path, case):
    """An MPI without MPICH's PMI-1 client (Open MPI, stood in for by its version
    string), and mpi4py.MPI imported before horovodish (MPI is then a world of one)."""
    script = tmp_path / "job.py"
    if case == "openmpi":
        script.write_text(REFUSED.replace("import mpi4py.MPI\n", "").format(
            patch="import horovodish, mpi4py.MPI as M\n"
                  "M.Get_library_version = lambda: 'Open MPI v5.0.3'"))
        needle = "mpi4py uses Open MPI v5.0.3, which has no such client"
    else:
        script.write_text(REFUSED.format(patch=""))
        needle = "mpi4py.MPI was imported before horovodish"
    result = run_environment_ranks(script, 2, timeout=60,
                                   env={"HOROVODISH_START_TIMEOUT": "5"})
    assert result.returncode != 0 and "TRAINED" not in result.stdout, result.stdout
    assert result.stdout.count(needle) == 2, result.stdout
