"""Launchers that are not MPI's own, across two emulated hosts: torchrun's c10d
rendezvous with an agent on each host, and ``horovodishrun --gloo -H`` over OpenSSH's
sshd. (Plain ``srun`` without PMI on the real Slurm is in test_slurm.py.) Each job
forms one MPI world: where every rank runs is checked against the hostnames, the
allreduce the runtime picks against the topology (hierarchical on 2 x 2), the results
against numpy and one process on the whole batch, on every rank."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from multirank import assert_ranks_ok

WORKERS = Path(__file__).resolve().parents[1] / "launcher" / "workers"
LAUNCHED = WORKERS / "launched_worker.py"
SCHEDULED = Path(__file__).parent / "workers" / "scheduled_worker.py"
CORE = ["check_topology", "check_backend_choice", "check_other_collectives"]


def test_torchrun_c10d_rendezvous_on_two_hosts(cluster):
    """Two torchrun agents, one on h1 and one on h2, meet at h1's c10d store; 2 x 2
    ranks in one world, the hierarchical allreduce chosen for large groups."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
            "--nproc_per_node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h1:29400",
            "--rdzv-id=launch-anywhere", "--monitor-interval", "0.5",
            str(LAUNCHED), "h1:2,h2:2", "torch"]
    env = cluster.env(PYTHONUNBUFFERED="1")
    agents = [subprocess.Popen(cluster.on_host(host, argv), env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace",
                               start_new_session=True) for host in ("h1", "h2")]
    outputs = []
    try:
        for agent in agents:
            out, _ = agent.communicate(timeout=240)
            outputs.append(out)
    finally:
        cluster.kill_all()
    result = subprocess.CompletedProcess(argv, max(a.returncode for a in agents),
                                         "\n".join(outputs), None)
    assert_ranks_ok(result, 4, [*CORE, "check_distributed_optimizer", "check_collectives"])


def test_horovodishrun_gloo_over_ssh(sshd):
    """--gloo with -H: the launcher runs the PMI server on h1 and starts h2's ranks over
    ssh itself (the job key through ssh's stdin), no mpirun."""
    before = sshd.logins("h2")
    result = sshd.cluster.run("h1", [sys.executable, "-m", "horovodish.launcher", "--gloo",
                                     "-np", "4", "-H", "h1:2,h2:2", sys.executable,
                                     str(SCHEDULED), "h1:2,h2:2"],
                              env=sshd.env(PYTHONUNBUFFERED="1"), timeout=180)
    assert_ranks_ok(result, 4, ["check_topology", "check_allreduce",
                                "check_other_collectives"])
    # The launcher's check (ssh h2 true), then one login per rank on h2.
    assert sshd.logins("h2") - before == 3, (sshd.logins("h2"), before, result.stdout)
    assert "hydra_pmi_proxy" not in result.stdout
