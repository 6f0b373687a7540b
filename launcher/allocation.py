"""Where ranks go when the command line does not say: what a scheduler gave the job.

* Kubernetes' MPI Operator (and any MPICH job) names a hostfile in ``HYDRA_HOST_FILE``;
  Open MPI's default hostfile variables name one for Open MPI jobs. Either is read as
  ``--hostfile`` would be (``host:N`` or ``host slots=N`` lines).
* Inside a Slurm allocation (``SLURM_JOB_NODELIST``), the hosts are the allocation's
  nodes (``scontrol show hostnames``) with ``SLURM_TASKS_PER_NODE`` slots each (Slurm
  writes ``2(x3),1`` for 2, 2, 2, 1); MPICH's Hydra and Open MPI then start the ranks
  through srun themselves.

Either way ``-np`` defaults to the slots' sum. ``-H``, ``--hostfile`` and
``--host-discovery-script`` always win.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Callable, Mapping

from .hosts import Host, parse_hostfile

HOSTFILE_VARIABLES = ("HYDRA_HOST_FILE", "OMPI_MCA_orte_default_hostfile",
                      "OMPI_MCA_rmaps_default_hostfile", "PRTE_MCA_rmaps_default_hostfile")
_REPEAT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def environment_hostfile(environ: Mapping[str, str]) -> str | None:
    """The hostfile a scheduler named in the environment, if that file exists."""
    for variable in HOSTFILE_VARIABLES:
        path = environ.get(variable)
        if path and Path(path).is_file():
            return path
    return None


def tasks_per_node(spec: str) -> list[int]:
    """Slurm's ``SLURM_TASKS_PER_NODE`` (``2(x3),1``) as one count per node."""
    counts: list[int] = []
    for item in spec.split(","):
        match = _REPEAT.match(item.strip())
        if not match:
            raise ValueError(f"SLURM_TASKS_PER_NODE: cannot read {item!r} in {spec!r}")
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def slurm_hosts(environ: Mapping[str, str],
                run: Callable[..., subprocess.CompletedProcess] = subprocess.run
                ) -> list[Host] | None:
    """The allocation's nodes and their task counts, or None outside an allocation."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    spec = environ.get("SLURM_TASKS_PER_NODE")
    if not nodelist or not spec:
        return None
    done = run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
               timeout=30)
    names = done.stdout.split()
    if done.returncode != 0 or not names:
        raise ValueError(f"scontrol show hostnames {nodelist} failed: "
                         f"{(done.stderr or done.stdout).strip()}")
    counts = tasks_per_node(spec)
    if len(counts) != len(names):
        raise ValueError(f"SLURM_TASKS_PER_NODE={spec} gives {len(counts)} nodes, "
                         f"SLURM_JOB_NODELIST={nodelist} {len(names)}")
    return [Host(name, count, "colon") for name, count in zip(names, counts)]


def from_environment(environ: Mapping[str, str]) -> tuple[str, str | list[Host]] | None:
    """("hostfile", path) or ("slurm", hosts) when the environment says where ranks go."""
    path = environment_hostfile(environ)
    if path is not None:
        return "hostfile", path
    hosts = slurm_hosts(environ)
    return ("slurm", hosts) if hosts else None


def describe(environ: Mapping[str, str]) -> str:
    """One line for --check-build: where ranks go without -H/--hostfile."""
    try:
        found = from_environment(environ)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return f"Slurm allocation found, but its hosts cannot be read: {exc}"
    if found is None:
        return "this host (no -H, --hostfile, HYDRA_HOST_FILE or Slurm allocation)"
    kind, where = found
    if kind == "hostfile":
        hosts = parse_hostfile(Path(where).read_text())
        return f"the hostfile {where} ({len(hosts)} hosts)"
    return ("the Slurm allocation: " + ",".join(f"{h.name}:{h.slots}" for h in where)
            + f" ({sum(h.slots or 0 for h in where)} tasks; mpirun starts them through srun)")
