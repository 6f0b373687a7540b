"""Where ranks go without -H/--hostfile: a hostfile a scheduler named (HYDRA_HOST_FILE,
as Kubernetes' MPI Operator sets it; Open MPI's default hostfile variables), or the
Slurm allocation (its nodes and SLURM_TASKS_PER_NODE); -np defaults to their slots."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from horovodish.launcher import allocation, cli
from horovodish.launcher.hosts import Host


def test_slurm_tasks_per_node():
    assert allocation.tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert allocation.tasks_per_node("4") == [4]
    with pytest.raises(ValueError, match="cannot read"):
        allocation.tasks_per_node("2(3)")


def fake_scontrol(names: list[str]):
    def run(argv, **_):
        assert argv[:3] == ["scontrol", "show", "hostnames"]
        return subprocess.CompletedProcess(argv, 0, "\n".join(names) + "\n", "")
    return run


def test_slurm_hosts_pair_nodes_with_their_task_counts():
    env = {"SLURM_JOB_NODELIST": "node[1-3]", "SLURM_TASKS_PER_NODE": "2(x2),1"}
    assert allocation.slurm_hosts(env, fake_scontrol(["node1", "node2", "node3"])) == [
        Host("node1", 2, "colon"), Host("node2", 2, "colon"), Host("node3", 1, "colon")]
    assert allocation.slurm_hosts({}, fake_scontrol([])) is None
    with pytest.raises(ValueError, match="gives 2 nodes"):
        allocation.slurm_hosts({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"},
                               fake_scontrol(["n1", "n2", "n3"]))


def test_a_scheduler_hostfile_stands_in_for_hostfile_and_np(tmp_path: Path, monkeypatch):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-0:2\nworker-1 slots=2\n")  # either syntax
    monkeypatch.setenv("HYDRA_HOST_FILE", str(hostfile))
    args = cli.parse_args(["python", "train.py"])
    assert args.hostfile == str(hostfile) and args.num_proc == 4
    assert [h.name for h in args.hostfile_hosts] == ["worker-0", "worker-1"]
    args = cli.parse_args(["-np", "2", "-H", "localhost:2", "python", "train.py"])
    assert args.hostfile is None and args.num_proc == 2  # -H wins
    monkeypatch.setenv("HYDRA_HOST_FILE", str(tmp_path / "missing"))
    with pytest.raises(SystemExit):  # no hostfile there: -np is required again
        cli.parse_args(["python", "train.py"])


def test_a_job_under_hydra_host_file_runs_on_its_slots(tmp_path: Path):
    """The MPI Operator's contract, on this host: a hostfile in HYDRA_HOST_FILE and no
    -H or -np; the job starts the slots' count of ranks."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost:2\n")
    env = {**os.environ, "HYDRA_HOST_FILE": str(hostfile)}
    code = "from mpi4py import MPI; c = MPI.COMM_WORLD; print(f'RANK {c.rank} OF {c.size}')"
    out = subprocess.run([sys.executable, "-m", "horovodish.launcher", sys.executable, "-c",
                          code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert sorted(re.findall(r"RANK \d OF \d", out.stdout)) == [
        "RANK 0 OF 2", "RANK 1 OF 2"], out.stdout
    # What --check-build prints on its "Ranks go to:" line.
    assert allocation.describe(env) == f"the hostfile {hostfile} (1 hosts)"
    assert allocation.describe({}).startswith("this host")


def test_slurm_discovery_leaves_out_nodes_slurm_took_away():
    """horovodish-slurm-hosts: the allocation's nodes with their task counts, less those
    sinfo shows down, drained or draining, failed, in maintenance or not responding."""
    from horovodish.launcher import slurm_discovery
    states = {"n1": "alloc", "n2": "drng", "n3": "mix", "n4": "down*", "n5": "alloc*",
              "n6": "idle~", "n7": "drain", "n8": "comp"}

    def run(argv, **_):
        if argv[0] == "scontrol":
            return subprocess.CompletedProcess(argv, 0, "\n".join(states) + "\n", "")
        assert argv[:2] == ["sinfo", "-h"] and argv[argv.index("-n") + 1] == ",".join(states)
        return subprocess.CompletedProcess(
            argv, 0, "".join(f"{n} {s}\n" for n, s in states.items()), "")

    env = {"SLURM_JOB_NODELIST": "n[1-8]", "SLURM_TASKS_PER_NODE": "2(x7),1"}
    assert slurm_discovery.usable_hosts(env, run) == [
        Host("n1", 2, "colon"), Host("n3", 2, "colon"), Host("n6", 2, "colon"),
        Host("n8", 1, "colon")]
    with pytest.raises(RuntimeError, match="not inside a Slurm allocation"):
        slurm_discovery.usable_hosts({}, run)


def test_slurm_discovery_script_says_why_it_fails(tmp_path):
    done = subprocess.run([sys.executable, "-m", "horovodish.launcher.slurm_discovery"],
                          capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("SLURM_")})
    assert done.returncode == 1 and done.stdout == ""
    assert "horovodish-slurm-hosts: not inside a Slurm allocation" in done.stderr
