"""Run a command as if each rank were on a host of its own, for NCCL's sake (test-only).

    horovodishrun -np 2 python tests/gpu/distinct_hosts.py tests/gpu/workers/gpu_worker.py

NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected"): it
compares a host hash, which ``NCCL_HOSTID`` overrides. Given a distinct id per rank, the
ranks on a machine's one GPU talk through NCCL's network (socket) transport over
loopback, as if on separate hosts. This sets ``NCCL_HOSTID`` from the rank the launcher
gave (Open MPI's, PMI's or Slurm's variable) and runs the Python script in its place.
The runtime needs nothing of it: it is a way to test NCCL between ranks on one GPU.
"""
from __future__ import annotations

import os
import sys

RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def launcher_rank(environ: dict[str, str]) -> str:
    for variable in RANK_VARIABLES:
        if environ.get(variable, "").isdigit():
            return environ[variable]
    raise SystemExit("distinct_hosts.py: no rank from the launcher "
                     f"(none of {', '.join(RANK_VARIABLES)} is set)")


if __name__ == "__main__":
    os.environ["NCCL_HOSTID"] = f"horovodish-test-host-{launcher_rank(dict(os.environ))}"
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
