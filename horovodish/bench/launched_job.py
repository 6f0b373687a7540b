"""One job of ``python -m horovodish.bench.launchers``, under whichever launcher started
it: a 64 MiB allreduce through ``hvd.allreduce`` (torch, in place) against
``MPI_Allreduce`` on the same bytes, and the MLP step against torch DDP on gloo.

    <launcher> python -m horovodish.bench.launched_job --json FILE [--rounds N]
"""
from __future__ import annotations

import argparse
import json

from mpi4py import MPI

from .. import torch as hvd
from .paths import available
from .sweep import sweep
from .training import training_step

ALLREDUCE_BYTES = 64 << 20


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m horovodish.bench.launched_job")
    parser.add_argument("--json", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    paths = {name: path for name, path in available(["torch"]).items()
             if name == "torch allreduce_"}
    row = sweep(comm, [ALLREDUCE_BYTES], paths, args.rounds)[0]
    step = training_step(comm, rounds=args.rounds + 2)
    if comm.Get_rank() == 0:
        path = next(iter(row["paths"].values()))
        figures = {"ranks": comm.Get_size(), "allreduce_bytes": ALLREDUCE_BYTES,
                   "allreduce_s": path["seconds"], "mpi_allreduce_s": row["mpi_s"],
                   "mlp_steps_per_s": step["steps_per_s"], "mlp_over_ddp": step["over_ddp"]}
        with open(args.json, "w") as out:
            json.dump(figures, out)
    comm.Free()
    hvd.shutdown()


if __name__ == "__main__":
    main()
