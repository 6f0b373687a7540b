"""A job a launcher started as several tasks that MPI sees as one world of one (srun
without --mpi=pmi2, another MPI's mpirun, torchrun) refuses at init() on every copy,
with the fix, instead of running as N silent one-rank jobs."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from horovodish.common.api.launch_check import announced_size, refuse_lone_copies

TRAIN = ("from horovodish.common import api\n"
         "api.init()\n"
         "print('TRAINED ALONE' if api.size() == 1 else 'TRAINED', flush=True)\n")


def test_the_largest_announced_count_and_who_announced_it():
    assert announced_size({}) is None
    assert announced_size({"SLURM_NTASKS": "4"}) is None  # a batch script: one task
    assert announced_size({"SLURM_STEP_NUM_TASKS": "4"}) == (4, "SLURM_STEP_NUM_TASKS",
                                                            "Slurm's srun")
    assert announced_size({"WORLD_SIZE": "2", "OMPI_COMM_WORLD_SIZE": "3"})[:2] == \
        (3, "OMPI_COMM_WORLD_SIZE")
    assert announced_size({"PMI_SIZE": "1", "WORLD_SIZE": "x"}) is None
    refuse_lone_copies(4, {"SLURM_STEP_NUM_TASKS": "4"}, "MPICH")  # MPI sees them all
    with pytest.raises(RuntimeError, match=r"srun --mpi=pmi2.*horovodishrun"):
        refuse_lone_copies(1, {"PMI_SIZE": "2"}, "MPICH")


@pytest.mark.parametrize("variable", ["SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE",
                                      "WORLD_SIZE"])
def test_every_lone_copy_refuses_and_nothing_trains(variable):
    """Three copies started as a scheduler without MPI's interface would: each is an MPI
    singleton that hears of 3 tasks. Every one exits non-zero naming the variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_"))}
    env[variable] = "3"
    copies = [subprocess.Popen([sys.executable, "-c", TRAIN], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
              for _ in range(3)]
    for copy in copies:
        out, _ = copy.communicate(timeout=120)
        assert copy.returncode != 0, out
        assert "TRAINED" not in out, out
        assert f"started this job as 3 tasks ({variable}=3)" in out, out
        assert "horovodishrun" in out, out


def test_a_batch_script_with_an_allocation_of_several_tasks_runs_as_one():
    env = {**os.environ, "SLURM_NTASKS": "4", "SLURM_JOB_ID": "1"}
    out = subprocess.run([sys.executable, "-c", TRAIN], env=env, text=True,
                         capture_output=True, timeout=120)
    assert out.returncode == 0 and "TRAINED ALONE" in out.stdout, out.stdout + out.stderr
