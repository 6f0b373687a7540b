"""A job that a launcher other than MPI's own started (torchrun, a bare environment,
srun without PMI, horovodishrun --gloo): the world it formed, then the collectives and
the framework's training path, against numpy or one process on the whole batch.

    python launched_worker.py LAYOUT FRAMEWORK [--torch-distributed first|after]

LAYOUT as given to -H (``h1:2,h2:2``; one host: ``$(hostname):N``): where each rank must
be, whatever LOCAL_RANK the launcher gave (tests set LOCAL_RANK=0 everywhere, as Spark's
TorchDistributor does). FRAMEWORK: core, torch, tensorflow or jax.
--torch-distributed: the script also calls ``torch.distributed.init_process_group``
(gloo) before or after ``hvd.init()``; both must then agree on rank and results.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from multirank import import_worker
from worker_support import check, close, run_checks

WORKERS = Path(__file__).resolve().parents[2] / "cluster" / "workers"
core = import_worker(WORKERS / "core_worker.py")


def checks_of(framework: str) -> list:
    found = [core.check_topology, core.check_backend_choice, core.check_other_collectives]
    if framework == "torch":
        torch_checks = import_worker(WORKERS / "torch_worker.py")
        found += [torch_checks.check_distributed_optimizer, torch_checks.check_collectives]
    elif framework == "tensorflow":
        tf_checks = import_worker(WORKERS / "tf_worker.py")
        found += [tf_checks.check_tape]
    elif framework == "jax":
        found += [check_jax]
    else:
        found += [core.check_allreduce]
    return found


def check_jax(rank: int, size: int) -> None:
    import jax.numpy as jnp
    import horovodish.jax as hvd
    tree = {"w": jnp.arange(6.0).reshape(2, 3) * (rank + 1), "b": jnp.ones(5) * rank}
    got = hvd.allreduce(tree, op=hvd.Average)
    total = sum(range(1, size + 1))
    close(np.asarray(got["w"]), np.arange(6.0).reshape(2, 3) * total / size, "pytree w",
          1e-6)
    close(np.asarray(got["b"]), np.full(5, sum(range(size)) / size), "pytree b", 1e-6)
    gathered = hvd.allgather(jnp.full((rank + 1, 2), rank, dtype=jnp.int32))
    close(np.asarray(gathered), np.concatenate([np.full((r + 1, 2), r, np.int32)
                                                for r in range(size)]), "allgather")


def beside_torch_distributed(rank: int, size: int) -> None:
    import torch
    import torch.distributed as dist
    import horovodish.torch as hvd
    check(dist.get_rank() == hvd.rank() and dist.get_world_size() == hvd.size(),
          f"torch.distributed: rank {dist.get_rank()} of {dist.get_world_size()}, "
          f"horovodish: {hvd.rank()} of {hvd.size()}")
    values = torch.arange(5, dtype=torch.float64) * (rank + 1)
    theirs = values.clone()
    dist.all_reduce(theirs)
    ours = hvd.allreduce(values, op=hvd.Sum)
    want = np.arange(5, dtype=np.float64) * sum(range(1, size + 1))
    close(theirs.numpy(), want, "torch.distributed's all_reduce")
    close(ours.numpy(), want, "horovodish's allreduce")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("layout")
    parser.add_argument("framework", choices=["core", "torch", "tensorflow", "jax"])
    parser.add_argument("--torch-distributed", choices=["first", "after"])
    args = parser.parse_args()
    if args.framework == "torch":
        import horovodish.torch as hvd
    elif args.framework == "tensorflow":
        import horovodish.tensorflow as hvd
    elif args.framework == "jax":
        import horovodish.jax as hvd
    else:
        from horovodish.common import api as hvd
    checks = checks_of(args.framework)
    if args.torch_distributed:
        import torch.distributed as dist
        checks.append(beside_torch_distributed)
    if args.torch_distributed == "first":
        dist.init_process_group("gloo")
    hvd.init()
    if args.torch_distributed == "after":
        dist.init_process_group("gloo")
    run_checks(checks, hvd.rank(), hvd.size())
    if args.torch_distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
