"""A training step through DistributedOptimizer against torch DDP (gloo) and against
the same step with no communication at all (the bound), and where its time goes; and a
many-tensor step (162 small parameter tensors) that shows the host time each reducer
adds per parameter tensor."""
from __future__ import annotations

import contextlib
import os
import socket
import statistics
import time
from typing import Iterator

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


def many_tensor_model(torch, blocks: int = 40, width: int = 64, classes: int = 10):
    """40 blocks of Linear(64, 64) + LayerNorm(64) + Tanh and a Linear(64, 10) head: 162
    parameter tensors of at most 16 KiB, where a reducer's cost per tensor dominates."""
    torch.manual_seed(0)
    layers = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.Tanh()]
    layers.append(torch.nn.Linear(width, classes))
    return torch.nn.Sequential(*layers)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def process_group(hvd, backend: str = "gloo") -> Iterator[None]:
    """torch.distributed beside horovodish, for DDP's side: gloo over loopback, or NCCL
    (each rank on its local GPU)."""
    import torch.distributed as dist
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # Under torchrun every rendezvous of torch's goes through its agent's store.
        dist.init_process_group(backend, rank=hvd.rank(), world_size=hvd.size())
    else:
        port = hvd.broadcast_object(free_port() if hvd.rank() == 0 else None, root_rank=0,
                                    name=f"bench.{backend}.port")
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}",
                                rank=hvd.rank(), world_size=hvd.size())
    try:
        yield
    finally:
        dist.destroy_process_group()


def ddp_name(backend: str) -> str:
    return f"torch DDP ({backend})"


def _side_by_side(comm: MPI.Comm, build, batch: int, input_shape: tuple[int, ...],
                  classes: int, rounds: int, budget: float, tag: str = "",
                  sharded: bool = False, device: str = "cpu",
                  backend: str = "gloo") -> tuple[dict, dict[str, list[float]]]:
    """The same model (``build()``), data and SGD under DistributedOptimizer, DDP and no
    communication (sharded: DistributedOptimizer(shard_optimizer_state=True) and DDP
    with torch's ZeroRedundancyOptimizer), timed in alternating rounds: our model and
    optimizer, and seconds per step of each. On a CUDA device every step ends with the
    device's work done (torch.cuda.synchronize), for every contender alike."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from .. import torch as hvd
    gen = torch.Generator().manual_seed(1 + hvd.rank())
    data = torch.randn(batch, *input_shape, generator=gen).to(device)
    target = torch.randint(0, classes, (batch,), generator=gen).to(device)
    ours_model = build().to(device)
    ours = hvd.DistributedOptimizer(
        torch.optim.SGD(ours_model.parameters(), lr=0.01), shard_optimizer_state=sharded,
        named_parameters=[(f"{tag}{n}", p) for n, p in ours_model.named_parameters()])
    on_gpu = torch.device(device).type == "cuda"
    ddp_model = torch.nn.parallel.DistributedDataParallel(
        build().to(device), device_ids=[torch.device(device).index] if on_gpu else None)
    ddp = ZeroRedundancyOptimizer(ddp_model.parameters(), torch.optim.SGD, lr=0.01) \
        if sharded else torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    local_model = build().to(device)
    local = torch.optim.SGD(local_model.parameters(), lr=0.01)

    def stepper(model, optimizer):
        def step() -> None:
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()
            if on_gpu:
                torch.cuda.synchronize()
        return step
    contenders = {OURS: stepper(ours_model, ours), ddp_name(backend): stepper(ddp_model, ddp),
                  BOUND: stepper(local_model, local)}
    return ({"model": ours_model, "optimizer": ours, "data": data, "target": target},
            alternating(contenders, comm, rounds, budget))


OURS, DDP, BOUND = "horovodish DistributedOptimizer", ddp_name("gloo"), "no communication"


def training_step(comm: MPI.Comm, widths: list[int] | None = None, batch: int = 64,
                  rounds: int = 5, budget: float = 0.3) -> dict:
    """Steps per second of each contender (median over rounds), the ratios, and a
    phase breakdown of our step (seconds per step, each phase timed on its own)."""
    import torch
    import torch.nn.functional as F

    from .. import torch as hvd
    widths = widths or [784, 1024, 1024, 10]
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    with process_group(hvd):
        ours, times = _side_by_side(comm, lambda: _mlp(torch, widths), batch, (widths[0],),
                                    widths[-1], rounds, budget)
        rate = {key: 1.0 / statistics.median(values) for key, values in times.items()}
        ratios = {
            "over_ddp": statistics.median(d / o for o, d in zip(times[OURS], times[DDP])),
            "ddp_over_bound": statistics.median(b / d for d, b in zip(times[DDP],
                                                                       times[BOUND])),
            "ours_over_bound": statistics.median(b / o for o, b in zip(times[OURS],
                                                                        times[BOUND])),
        }
        phases, by_rank = _phases(comm, ours["model"], ours["optimizer"], ours["data"],
                                  ours["target"], F)
        return {"widths": widths, "batch_per_rank": batch, "threads": torch.get_num_threads(),
                "steps_per_s": rate, **ratios, "phases_s": phases,
                "forward_backward_by_rank_s": by_rank}


def many_tensor_step(comm: MPI.Comm, batch: int = 32, rounds: int = 5,
                     budget: float = 0.3) -> dict:
    """The 162-tensor model under each contender: ms per step, and the host time that
    DDP and DistributedOptimizer add over the plain step per parameter tensor (median
    of the per-round figures, and their range); then the same for the sharded optimizer
    (ZeRO stage 2) against DDP with torch's ZeroRedundancyOptimizer. One torch thread
    per rank: the step is host-bound, and what is measured is the reducers' Python and
    C++ per tensor."""
    import torch

    from .. import torch as hvd
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = {}
    try:
        with process_group(hvd):
            for key, sharded in (("replicated", False), ("sharded", True)):
                rows[key] = against_ddp(comm, lambda: many_tensor_model(torch), batch, (64,),
                                        10, rounds, budget, f"many.{key}.", sharded)
    finally:
        torch.set_num_threads(threads)
    return {"parameter_tensors": rows["replicated"]["parameter_tensors"],
            "batch_per_rank": batch, **rows["replicated"], "sharded": rows["sharded"]}


def against_ddp(comm: MPI.Comm, build, batch: int, input_shape: tuple[int, ...],
                classes: int, rounds: int = 5, budget: float = 0.3, tag: str = "",
                sharded: bool = False, device: str = "cpu", backend: str = "gloo") -> dict:
    """One model (``build()``) under DistributedOptimizer, DDP and no communication, in
    torch.distributed's process group (``process_group(hvd, backend)``, entered by the
    caller): ms per step of each, the host time each reducer adds per parameter tensor,
    and horovodish's added time over DDP's (medians of the rounds, and their ranges)."""
    ours, times = _side_by_side(comm, build, batch, input_shape, classes, rounds, budget,
                                tag, sharded, device, backend)
    row = _added_per_tensor(ours["model"], times, ddp_name(backend))
    steps = {key: statistics.median(values) for key, values in times.items()}
    row["ours_over_ddp_step"] = steps[OURS] / steps[ddp_name(backend)]
    return row


def _added_per_tensor(model, times: dict[str, list[float]], ddp: str = DDP) -> dict:
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    added = {key: [(t - b) / tensors for t, b in zip(times[key], times[BOUND])]
             for key in (OURS, ddp)}
    ratio = [o / d if d > 0 else float("inf") for o, d in zip(added[OURS], added[ddp])]
    return {"parameter_tensors": tensors,
            "ms_per_step": {key: statistics.median(v) * 1e3 for key, v in times.items()},
            "ms_per_step_range": {key: [min(v) * 1e3, max(v) * 1e3]
                                  for key, v in times.items()},
            "added_us_per_tensor": {key: statistics.median(v) * 1e6
                                    for key, v in added.items()},
            "added_us_per_tensor_range": {key: [min(v) * 1e6, max(v) * 1e6]
                                          for key, v in added.items()},
            "ours_added_over_ddp_added": statistics.median(ratio),
            "ours_added_over_ddp_added_range": [min(ratio), max(ratio)]}


def _phases(comm: MPI.Comm, model, optimizer, data, target, F, steps: int = 30
            ) -> tuple[dict, list[float]]:
    """Seconds per step in forward+backward (gradients are submitted as they are ready),
    in waiting for the last reductions (synchronize), and in the wrapped optimizer, the
    mean over ranks; and each rank's forward+backward: a step waits for the slowest
    rank's, so their spread is part of every rank's wait."""
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
    return ({name: comm.allreduce(value / steps, MPI.SUM) / size for name, value in
             (("forward_backward", forward_backward), ("wait_for_reductions", wait),
              ("optimizer", update))}, comm.allgather(forward_backward / steps))
