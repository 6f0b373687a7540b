"""Host discovery inside a Slurm allocation, for elastic jobs: the allocation's nodes that
Slurm still calls usable, with their task counts.

    sbatch --no-kill -N 2 --ntasks-per-node 2 job.sh      # job.sh:
    horovodishrun -np $SLURM_NTASKS --min-np 2 \\
        --host-discovery-script horovodish-slurm-hosts python train.py

Why a discovery script rather than the allocation read once: with ``--no-kill`` an
allocation outlives a node that fails, and a node an administrator drains stays in it
while its work goes on. The elastic launcher runs this every second; a node that turns
``down``, ``drain``/``draining``, ``fail`` or ``maint`` (or stops answering: a ``*``
state) drops out of what it prints, the job leaves at its next commit and goes on from
there on the nodes that remain. Nodes and slots come from ``SLURM_JOB_NODELIST`` and
``SLURM_TASKS_PER_NODE`` (launcher/allocation.py); states from ``sinfo``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping

from .allocation import slurm_hosts
from .hosts import Host

# sinfo's short states (%t) in which a node takes work: the rest (down, drain, drng,
# fail, failg, maint, boot, powered down ...) do not.
USABLE_STATES = frozenset({"alloc", "mix", "idle", "comp", "resv"})
_FLAGS = "*~#!%$@^-+"  # sinfo's state suffixes; "*": not responding


def node_states(names: list[str],
                run: Callable[..., subprocess.CompletedProcess] = subprocess.run
                ) -> dict[str, str]:
    """{node: sinfo's short state with its suffix} for the given nodes."""
    done = run(["sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N %t"],
               capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"sinfo failed: {(done.stderr or done.stdout).strip()}")
    return dict(line.split()[:2] for line in done.stdout.splitlines() if line.strip())


def usable(state: str) -> bool:
    return not state.endswith("*") and state.rstrip(_FLAGS) in USABLE_STATES


def usable_hosts(environ: Mapping[str, str],
                 run: Callable[..., subprocess.CompletedProcess] = subprocess.run
                 ) -> list[Host]:
    """The allocation's hosts whose nodes are usable now. Raises RuntimeError outside an
    allocation or when Slurm cannot be asked."""
    try:
        hosts = slurm_hosts(environ, run)
    except ValueError as exc:
        raise RuntimeError(str(exc)) from None
    if hosts is None:
        raise RuntimeError("not inside a Slurm allocation (no SLURM_JOB_NODELIST and "
                           "SLURM_TASKS_PER_NODE)")
    states = node_states([h.name for h in hosts], run)
    return [h for h in hosts if usable(states.get(h.name, "unknown"))]


def main() -> int:
    try:
        hosts = usable_hosts(os.environ)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"horovodish-slurm-hosts: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write("".join(f"{h.name}:{h.slots}\n" for h in hosts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
