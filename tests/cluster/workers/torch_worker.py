"""PyTorch across hosts: DistributedOptimizer equals one process on the whole batch, and
the torch collectives against numpy, on every rank. A hidden layer of 512 KiB makes the
fused gradients large enough for the hierarchical allreduce on a 2x2 job."""
from __future__ import annotations


import numpy as np
import torch
from torch import nn

import horovodish.torch as hvd

from worker_support import close, run_checks, same_on_every_rank  # noqa: E402

FEATURES, HIDDEN, PER_RANK, STEPS = 256, 512, 4, 3


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1)).double()


def batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(PER_RANK * size, FEATURES, generator=gen, dtype=torch.float64)
    return x, x[:, :3].sum(1, keepdim=True)


def check_distributed_optimizer(rank: int, size: int) -> None:
    for name, make in (("SGD", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
                       ("Adam", lambda p: torch.optim.Adam(p, lr=0.01))):
        reference, distributed = model(), model()
        if rank == size - 1:  # a different start: broadcast_parameters must fix it
            with torch.no_grad():
                for p in distributed.parameters():
                    p.add_(1.0)
        ref_opt = make(reference.parameters())
        opt = hvd.DistributedOptimizer(make(distributed.parameters()),
                                       named_parameters=distributed.named_parameters())
        hvd.broadcast_parameters(distributed.state_dict(), root_rank=0)
        for step in range(STEPS):
            x, y = batch(step, size)
            ref_opt.zero_grad()
            nn.functional.mse_loss(reference(x), y).backward()
            ref_opt.step()
            mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
            opt.zero_grad()
            nn.functional.mse_loss(distributed(x[mine]), y[mine]).backward()
            opt.step()
        for (label, p), q in zip(distributed.named_parameters(), reference.parameters()):
            close(p, q, f"{name} {label} after {STEPS} steps", tol=1e-9)
        same_on_every_rank(torch.cat([p.detach().reshape(-1) for p in distributed.parameters()]),
                           f"{name} parameters")


def check_collectives(rank: int, size: int) -> None:
    for count in (7, 200_000):
        mine = torch.arange(count, dtype=torch.float32) * (rank + 1)
        want = np.arange(count, dtype=np.float64) * sum(range(1, size + 1))
        close(hvd.allreduce(mine, op=hvd.Sum), want, f"allreduce sum of {count}")
        close(hvd.allreduce(mine), want / size, f"allreduce average of {count}", tol=1e-6)
    got = hvd.allgather(torch.full((rank + 1, 2), float(rank)))
    close(got, np.concatenate([np.full((r + 1, 2), float(r)) for r in range(size)]),
          "allgather")
    close(hvd.broadcast(torch.full((3,), float(rank)), root_rank=size - 1),
          np.full(3, float(size - 1)), "broadcast")
    grouped = hvd.grouped_allreduce([torch.ones(5) * rank, torch.ones(300_000) * rank],
                                    op=hvd.Sum)
    close(grouped[1], np.full(300_000, float(sum(range(size)))), "grouped allreduce")


if __name__ == "__main__":
    hvd.init()
    run_checks([check_distributed_optimizer, check_collectives], hvd.rank(), hvd.size())
