"""``python -m horovodish.bench.launchers``: the same job under torchrun and under
horovodishrun, in alternating rounds (a round: one job under each), on this host.

Each job (``launched_job``) times a 64 MiB ``hvd.allreduce_`` against ``MPI_Allreduce``
and the MLP step against torch DDP on gloo in its own world. The report gives, per
launcher, the median over rounds, and each launcher's figures over horovodishrun's
(Hydra's world): a world formed through the PMI server of ``horovodish.common.world``
(``horovodishrun --gloo``, torchrun) must move bytes as fast. ``MPI_Allreduce``'s own
ratio tells what the launcher's processes cost MPI itself, apart from horovodish.

    python -m horovodish.bench.launchers [--np 2] [--rounds 3] [--record docs/records]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from horovodish.launcher.envvars import rank_defaults

JOB = ["-m", "horovodish.bench.launched_job"]


def commands(np: int, out: str, rounds: int) -> dict[str, list[str]]:
    job = [*JOB, "--json", out, "--rounds", str(rounds)]
    launcher = [sys.executable, "-m", "horovodish.launcher"]
    return {"horovodishrun": [*launcher, "-np", str(np), sys.executable, *job],
            "horovodishrun --gloo": [*launcher, "--gloo", "-np", str(np), sys.executable,
                                     *job],
            "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone",
                         f"--nproc_per_node={np}", *job]}


def run_rounds(np: int, rounds: int, job_rounds: int) -> dict[str, list[dict]]:
    """Every job's figures, by launcher, in the order they ran."""
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "figures.json")
        for _ in range(rounds):
            for launcher, argv in commands(np, out, job_rounds).items():
                # Every launcher's ranks get what horovodishrun gives its own (the
                # huge-page settings): the same job, whoever starts it.
                env = {**os.environ, **rank_defaults(os.environ)}
                done = subprocess.run(argv, env=env, capture_output=True, text=True,
                                      timeout=900)
                if done.returncode != 0:
                    raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n"
                                       f"{done.stdout}{done.stderr}")
                results.setdefault(launcher, []).append(json.loads(Path(out).read_text()))
    return results


def summarise(results: dict[str, list[dict]]) -> dict:
    """Medians per launcher, and torchrun's over horovodishrun's."""
    per = {}
    for launcher, jobs in results.items():
        per[launcher] = {
            "allreduce_64mib_ms": statistics.median(j["allreduce_s"] for j in jobs) * 1e3,
            "mpi_allreduce_64mib_ms": statistics.median(j["mpi_allreduce_s"]
                                                        for j in jobs) * 1e3,
            "mlp_steps_per_s": statistics.median(
                j["mlp_steps_per_s"]["horovodish DistributedOptimizer"] for j in jobs),
            "mlp_over_ddp": statistics.median(j["mlp_over_ddp"] for j in jobs)}
    theirs = per["horovodishrun"]

    def over_mpirun(name: str) -> dict:
        ours = per[name]
        return {"allreduce_time": ours["allreduce_64mib_ms"] / theirs["allreduce_64mib_ms"],
                "mpi_allreduce_time": ours["mpi_allreduce_64mib_ms"]
                / theirs["mpi_allreduce_64mib_ms"],
                "mlp_step_rate": ours["mlp_steps_per_s"] / theirs["mlp_steps_per_s"]}
    return {"launchers": per, "rounds": len(results["torchrun"]),
            "over_horovodishrun": {name: over_mpirun(name) for name in per
                                   if name != "horovodishrun"}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m horovodish.bench.launchers",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="jobs under each launcher")
    parser.add_argument("--job-rounds", type=int, default=3,
                        help="alternating rounds inside each job")
    parser.add_argument("--record", metavar="FOLDER", help="write a 'launchers' record")
    args = parser.parse_args(argv)
    figures = summarise(run_rounds(args.np, args.rounds, args.job_rounds))
    figures["ranks"] = args.np
    for launcher, row in figures["launchers"].items():
        print(f"{launcher:>14}: 64 MiB allreduce_ {row['allreduce_64mib_ms']:.2f} ms "
              f"(MPI_Allreduce {row['mpi_allreduce_64mib_ms']:.2f} ms), MLP step "
              f"{row['mlp_steps_per_s']:.1f}/s, {row['mlp_over_ddp']:.2f}x DDP on gloo")
    for name, ratio in figures["over_horovodishrun"].items():
        print(f"{name} / horovodishrun: allreduce_ time {ratio['allreduce_time']:.3f} "
              f"(MPI_Allreduce's {ratio['mpi_allreduce_time']:.3f}), MLP step rate "
              f"{ratio['mlp_step_rate']:.3f}")
    if args.record:
        from . import records
        command = "python -m horovodish.bench.launchers " + " ".join(
            argv if argv is not None else sys.argv[1:])
        print(f"record: {records.write(args.record, 'launchers', figures, command.strip())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
