"""DistributedOptimizer(op=Adasum) against the delta rule computed by hand on every rank."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from worker_support import check, close, expect_error, run_checks  # noqa: E402

import horovodish.torch as hvd  # noqa: E402


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


def rejects_a_non_power_of_two_world(rank: int, size: int, run: SimpleNamespace) -> None:
    expect_error(lambda: hvd.DistributedOptimizer(run.sgd, run.model.named_parameters(),
                                                  op=hvd.Adasum),
                 ValueError, "power-of-two", what="Adasum optimizer on a non-power-of-two world")


def overflow_on_one_rank_skips_every_rank(rank: int, size: int, run: SimpleNamespace) -> None:
    """GradScaler's documented pattern with an overflow on the last rank only: every rank
    skips the step and halves its scale (a rank skipping alone stalled the job)."""
    model, optimizer = run.model, run.optimizer
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    loss = loss_of(model, rank) * (float("inf") if rank == size - 1 else 1.0)
    scaler.scale(loss).backward()
    optimizer.synchronize()
    scaler.unscale_(optimizer)
    with optimizer.skip_synchronize():
        scaler.step(optimizer)
    scaler.update()
    check(scaler.get_scale() == 512.0, f"scale {scaler.get_scale()}, not skipped")
    for got, want in zip(model.parameters(), run.reference.parameters()):
        check(torch.equal(got, want), "stepped despite another rank's overflow")


def follows_the_delta_rule(rank: int, size: int, run: SimpleNamespace) -> None:
    model, reference, optimizer = run.model, run.reference, run.optimizer
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
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        close(got, want, name, 1e-5, atol=1e-6)


def ranks_agree(rank: int, size: int, run: SimpleNamespace) -> None:
    gathered = hvd.allgather_object([p.detach().clone() for p in run.model.parameters()])
    check(all(torch.equal(a, b) for a, b in zip(gathered[0], gathered[-1])), "ranks differ")


if __name__ == "__main__":
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    reference = torch.nn.Linear(5, 3)
    reference.load_state_dict(model.state_dict())
    run = SimpleNamespace(model=model, reference=reference,
                          sgd=torch.optim.SGD(model.parameters(), lr=0.1))
    if size & (size - 1):
        run_checks([rejects_a_non_power_of_two_world], rank, size, run)
    else:
        run.optimizer = hvd.DistributedOptimizer(run.sgd, model.named_parameters(),
                                                 op=hvd.Adasum)
        # GradScaler on CPU tensors arrived in torch 2.3 (torch.amp.GradScaler("cpu")).
        scaled = [overflow_on_one_rank_skips_every_rank] if hasattr(torch.amp, "GradScaler") \
            else []
        run_checks([*scaled, follows_the_delta_rule, ranks_agree], rank, size, run)
