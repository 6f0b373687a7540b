"""A training step through DistributedOptimizer against torch DDP (gloo) and against
the same step with no communication at all (the bound), and where its time goes."""
from __future__ import annotations

import os
import socket
import statistics
import time

from mpi4py import MPI

from .timing import alternating


def _mlp(torch, widths: list[int]):
    torch.manual_seed(0)
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def training_step(comm: MPI.Comm, widths: list[int] | None = None, batch: int = 64,
                  rounds: int = 5, budget: float = 0.3) -> dict:
    """Steps per second of each contender (median over rounds), the ratios, and a
    phase breakdown of our step (seconds per step, each phase timed on its own)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from .. import torch as hvd
    widths = widths or [784, 1024, 1024, 10]
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    port = hvd.broadcast_object(_free_port() if hvd.rank() == 0 else None, root_rank=0,
                                name="bench.gloo.port")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=hvd.rank(), world_size=hvd.size())
    try:
        gen = torch.Generator().manual_seed(1 + hvd.rank())
        data = torch.randn(batch, widths[0], generator=gen)
        target = torch.randint(0, widths[-1], (batch,), generator=gen)
        ours_model = _mlp(torch, widths)
        ours = hvd.DistributedOptimizer(torch.optim.SGD(ours_model.parameters(), lr=0.01),
                                        named_parameters=ours_model.named_parameters())
        ddp_model = torch.nn.parallel.DistributedDataParallel(_mlp(torch, widths))
        ddp = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
        local_model = _mlp(torch, widths)
        local = torch.optim.SGD(local_model.parameters(), lr=0.01)

        def stepper(model, optimizer):
            def step() -> None:
                optimizer.zero_grad()
                F.cross_entropy(model(data), target).backward()
                optimizer.step()
            return step
        contenders = {"horovodish DistributedOptimizer": stepper(ours_model, ours),
                      "torch DDP (gloo)": stepper(ddp_model, ddp),
                      "no communication": stepper(local_model, local)}
        times = alternating(contenders, comm, rounds, budget)
        rate = {key: 1.0 / statistics.median(values) for key, values in times.items()}
        ratios = {
            "over_ddp": statistics.median(d / o for o, d in zip(
                times["horovodish DistributedOptimizer"], times["torch DDP (gloo)"])),
            "ddp_over_bound": statistics.median(b / d for d, b in zip(
                times["torch DDP (gloo)"], times["no communication"])),
            "ours_over_bound": statistics.median(b / o for o, b in zip(
                times["horovodish DistributedOptimizer"], times["no communication"])),
        }
        return {"widths": widths, "batch_per_rank": batch, "threads": torch.get_num_threads(),
                "steps_per_s": rate, **ratios,
                "phases_s": _phases(comm, ours_model, ours, data, target, F)}
    finally:
        dist.destroy_process_group()


def _phases(comm: MPI.Comm, model, optimizer, data, target, F, steps: int = 30) -> dict:
    """Seconds per step in forward+backward (gradients are submitted as they are ready),
    in waiting for the last reductions (synchronize), and in the wrapped optimizer."""
    forward_backward = wait = update = 0.0
    comm.Barrier()
    for _ in range(steps):
        t0 = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        t1 = time.perf_counter()
        optimizer.synchronize()
        t2 = time.perf_counter()
        with optimizer.skip_synchronize():
            optimizer.step()
        t3 = time.perf_counter()
        forward_backward += t1 - t0
        wait += t2 - t1
        update += t3 - t2
    size = comm.Get_size()
    return {name: comm.allreduce(value / steps, MPI.SUM) / size for name, value in
            (("forward_backward", forward_backward), ("wait_for_reductions", wait),
             ("optimizer", update))}
