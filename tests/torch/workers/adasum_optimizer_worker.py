"""DistributedOptimizer(op=Adasum) against the delta rule computed by hand on every rank."""
from __future__ import annotations

import sys

import torch

import horovodish.torch as hvd


def adasum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.double().flatten(), b.double().flatten()
    dot = a @ b
    return (1 - dot / (2 * (a @ a))) * a + (1 - dot / (2 * (b @ b))) * b


def data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(16, 5, generator=gen), torch.randn(16, 3, generator=gen)


def loss_of(model: torch.nn.Module, rank: int) -> torch.Tensor:
    x, y = data(rank)
    return (model(x) - y).pow(2).mean()


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    reference = torch.nn.Linear(5, 3)
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if size & (size - 1):
        try:
            hvd.DistributedOptimizer(optimizer, model.named_parameters(), op=hvd.Adasum)
        except ValueError as exc:
            assert "power-of-two" in str(exc)
            sys.stdout.write(f"OK rank {rank}\n")
            return
        raise AssertionError("Adasum optimizer on a non-power-of-two world must raise")
    optimizer = hvd.DistributedOptimizer(optimizer, model.named_parameters(), op=hvd.Adasum)
    # GradScaler's documented pattern with an overflow on the last rank only: every rank
    # skips the step and halves its scale (a rank skipping alone stalled the job).
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    loss = loss_of(model, rank) * (float("inf") if rank == size - 1 else 1.0)
    scaler.scale(loss).backward()
    optimizer.synchronize()
    scaler.unscale_(optimizer)
    with optimizer.skip_synchronize():
        scaler.step(optimizer)
    scaler.update()
    assert scaler.get_scale() == 512.0, f"rank {rank}: scale {scaler.get_scale()}, not skipped"
    for got, want in zip(model.parameters(), reference.parameters()):
        assert torch.equal(got, want), f"rank {rank}: stepped despite another rank's overflow"
    for _ in range(5):
        optimizer.zero_grad()
        loss_of(model, rank).backward()
        optimizer.step()
        # reference: every rank's delta from the same start, combined pairwise
        deltas = []
        for r in range(size):
            reference.zero_grad()
            loss_of(reference, r).backward()
            deltas.append([-0.1 * p.grad.clone() for p in reference.parameters()])
        with torch.no_grad():
            for i, param in enumerate(reference.parameters()):
                level = [d[i] for d in deltas]
                while len(level) > 1:
                    level = [adasum(level[j], level[j + 1]).view_as(param)
                             for j in range(0, len(level), 2)]
                param += level[0].to(param.dtype)
    for got, want in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(got, want, atol=1e-6), (got, want)
    gathered = hvd.allgather_object([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(gathered[0], gathered[-1])), "ranks differ"
    sys.stdout.write(f"OK rank {rank}\n")


if __name__ == "__main__":
    main()
