"""``python -m horovodish.bench``: argument parsing and the run's order."""
from __future__ import annotations

import argparse
import sys
import time

from mpi4py import MPI

from ..common import api
from . import report
from .environment import huge_pages
from .burst import burst
from .idle import idle_cost
from .paths import available
from .sweep import SIZES, sweep
from .timing import scale_budgets


def _agreed_paths(comm: MPI.Comm, frameworks: list[str]) -> dict:
    """The paths every rank can time (the same installation, normally): ranks must time
    the same contenders in the same order."""
    paths = available(frameworks)
    common = set.intersection(*map(set, comm.allgather(list(paths))))
    return {name: path for name, path in paths.items() if name in common}


def sharing_cost(comm: MPI.Comm) -> float | None:
    """How many times a plain write it costs to write shared memory another core has just
    read (bench/sharing.py: which mode the machine is in), on rank 0; None elsewhere, and
    where some host runs a single rank. Collective."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    paired = comm.allreduce(node.Get_size(), op=MPI.MIN) >= 2
    node.Free()
    if not paired:
        return None
    # Imported here: ``python -m horovodish.bench.sharing`` imports this package first,
    # and runpy warns when the module it is to run was imported already.
    from .sharing import measure
    times = measure(comm, 1 << 20, 30)
    return times["after rank 1 read it"] / times["alone"] if times else None


def simulated_negotiation(comm: MPI.Comm, quick: bool) -> dict | None:
    """Rank 0's negotiation at 2 to 4,096 simulated ranks (bench/negotiation.py), 162
    tensors, run on rank 0 while the others wait without spinning; None elsewhere."""
    from .negotiation import RANKS, run
    figures = run((2, 128) if quick else RANKS, (162,), 1 if quick else 5) \
        if comm.Get_rank() == 0 else None
    done = comm.Ibarrier()
    while not done.Test():
        time.sleep(0.005)
    return figures


def _per_call(comm: MPI.Comm, args: argparse.Namespace) -> list[dict]:
    from .. import torch as hvd
    from .per_call import SIZES, per_call
    from .training import process_group
    with process_group(hvd):
        return per_call(comm, tuple(s for s in SIZES if s <= args.max_bytes), args.rounds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m horovodish.bench",
                                     description=sys.modules[__package__].__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the figures to this file (rank 0)")
    parser.add_argument("--record", metavar="FOLDER",
                        help="write the figures as a new record in this folder (rank 0; "
                             "docs/records in the repository: see bench/records.py)")
    parser.add_argument("--plot", help="draw bus bandwidth against size to this PNG (rank 0)")
    parser.add_argument("--idle-rounds", type=int, default=16,
                        help="rounds of the idle-cost measurement (default 16)")
    parser.add_argument("--max-bytes", type=int, default=SIZES[-1],
                        help="largest allreduce in the sweep (default 64 MiB)")
    parser.add_argument("--frameworks", default="torch,tensorflow,jax",
                        help="comma-separated frameworks whose paths and training steps to "
                             "time, if installed (default torch,tensorflow,jax; empty: the "
                             "core API only)")
    parser.add_argument("--no-training", action="store_true",
                        help="skip the training steps (against torch DDP and JAX's own "
                             "collectives)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds per measurement (bursts and the training "
                             "step take two more)")
    parser.add_argument("--budget-scale", type=float, default=1.0,
                        help="multiply every timing's length by this (default 1; 0.1 "
                             "runs every measurement briefly: a check that the bench "
                             "works, not figures to compare)")
    args = parser.parse_args(argv)
    scale_budgets(args.budget_scale)
    api.init()
    comm = MPI.COMM_WORLD.Dup()
    frameworks = [f for f in args.frameworks.split(",") if f]
    figures: dict = {"ranks": comm.Get_size(), "huge_pages": huge_pages()}
    mode_before = sharing_cost(comm)
    figures["idle"] = idle_cost(comm, rounds=args.idle_rounds)
    paths = _agreed_paths(comm, frameworks)
    figures["allreduce"] = sweep(comm, [s for s in SIZES if s <= args.max_bytes], paths,
                                 args.rounds)
    figures["many_small"] = burst(comm, paths, rounds=args.rounds + 2)
    if "torch allreduce" in paths:
        from .collectives import SIZES as OTHER_SIZES
        from .collectives import collectives
        figures["collectives"] = collectives(
            comm, [s for s in OTHER_SIZES if s <= args.max_bytes], args.rounds,
            tensorflow="tensorflow allreduce" in paths)
    if not args.no_training and "torch allreduce" in paths:
        from .training import many_tensor_step, training_step
        figures["training"] = training_step(comm, rounds=args.rounds + 2)
        figures["many_tensors"] = many_tensor_step(comm, rounds=args.rounds + 2)
        figures["per_call"] = _per_call(comm, args)
    if "torch allreduce" in paths:
        from .cache_misses import cache_misses, miss_cost
        figures["cache_misses"] = cache_misses(comm.Get_rank(), comm.Get_size())
        figures["cache_misses"]["miss_cost"] = miss_cost(comm, rounds=max(3, args.rounds))
    if not args.no_training and "jax" in frameworks:
        from . import jax_training
        if comm.allreduce(jax_training.available(), op=MPI.LAND):
            figures["jax_training"] = jax_training.jax_training_step(comm,
                                                                     rounds=args.rounds + 2)
    figures["negotiation"] = simulated_negotiation(comm, quick=args.budget_scale < 1)
    mode_after = sharing_cost(comm)
    if mode_before is not None and mode_after is not None:
        figures["sharing"] = {"before": mode_before, "after": mode_after}
    if comm.Get_rank() == 0:
        report.print_report(comm.Get_size(), figures)
        if args.json:
            report.write_json(args.json, figures)
        if args.record:
            from . import records
            command = "horovodishrun -np {} python -m horovodish.bench {}".format(
                comm.Get_size(), " ".join(a for a in (argv if argv is not None else
                                                      sys.argv[1:]) if a)).strip()
            kind = records.bench_kind(comm.Get_size())
            print(f"record: {records.write(args.record, kind, figures, command)}")
        if args.plot:
            report.plot(figures["allreduce"], args.plot)
    comm.Free()
    api.shutdown()
