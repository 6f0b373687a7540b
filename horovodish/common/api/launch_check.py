"""A job started as several tasks that MPI sees as one world of one: refused at init().

Most launchers' jobs form one world (``world/``); what is refused here is what is left:
a launcher whose variables are incomplete, or another MPI's process manager.

A scheduler or launcher that starts N copies of a script tells each copy the task count
in its own variables. When the MPI library this Python uses did not get the job's
process-management interface from that launcher (``srun`` without ``--mpi=pmi2`` on a
cluster whose ``MpiDefault`` is ``none``; Open MPI's ``mpirun`` starting a Python whose
mpi4py is MPICH's, or the reverse; ``torchrun``), every copy initializes MPI as a
singleton and would train alone, each exiting 0: N silent one-rank jobs. So when MPI's
world has one process but such a variable says more, init() raises on every copy.
"""
from __future__ import annotations

from typing import Mapping

from ..world.launch_env import missing_variables

# (variable, who sets it). Slurm's step variable is set only inside a step that srun
# started (the batch script itself, one task, has SLURM_NTASKS but no step count).
_ANNOUNCED = (
    ("SLURM_STEP_NUM_TASKS", "Slurm's srun"),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
    ("PMI_SIZE", "a PMI launcher (MPICH's Hydra, Intel MPI, srun --mpi=pmi2)"),
    ("MV2_COMM_WORLD_SIZE", "MVAPICH's launcher"),
    ("WORLD_SIZE", "the launcher (torchrun, Kubeflow, Ray Train and the like)"),
)


def announced_size(environ: Mapping[str, str]) -> tuple[int, str, str] | None:
    """The largest task count a launcher announced: (count, variable, launcher)."""
    best = None
    for variable, launcher in _ANNOUNCED:
        value = environ.get(variable, "").strip()
        if value.isdigit() and int(value) > 1 and (best is None or int(value) > best[0]):
            best = (int(value), variable, launcher)
    return best


def refuse_lone_copies(world_size: int, environ: Mapping[str, str], mpi: str) -> None:
    """RuntimeError when a launcher announced several tasks and MPI sees one."""
    announced = announced_size(environ)
    if world_size != 1 or announced is None:
        return
    count, variable, launcher = announced
    missing = missing_variables(environ)
    if missing:
        raise RuntimeError(
            f"horovodish.init(): {launcher} started this job as {count} tasks "
            f"({variable}={count}), but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set, so "
            f"this task cannot find the others and MPI ({mpi}) sees a world of 1: each "
            "task would train alone. Set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT on "
            "every task (docs/launchers.md), start the job with torchrun, or with "
            "horovodishrun.")
    raise RuntimeError(
        f"horovodish.init(): {launcher} started this job as {count} tasks "
        f"({variable}={count}), but MPI ({mpi}) sees a world of 1: each task would train "
        "alone. The MPI library this Python uses did not get the job's process-management "
        "interface from that launcher. Under Slurm, launch with `srun --mpi=pmi2` (or "
        "`--mpi=pmix` where Slurm has it), or run `horovodishrun` inside the allocation; "
        "elsewhere launch with `horovodishrun` (or the mpirun of the MPI that mpi4py uses: "
        "`python -c 'import mpi4py.MPI as m; print(m.Get_library_version())'`).")
