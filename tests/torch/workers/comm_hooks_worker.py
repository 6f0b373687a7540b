"""Communication hooks (DistributedOptimizer.register_comm_hook) and PowerSGD on real ranks.

References: the DistributedOptimizer without a hook (exact allreduce) on the same data,
Compression.fp16/bf16 for the cast hooks, bytes counted where every collective enters
the core (not PowerSGD's own counter), and examples/pytorch_digits.py's exact run for
the accuracy PowerSGD must keep.
"""
from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from worker_support import check, close, expect_error, run_checks  # noqa: E402

import horovodish.torch as hvd  # noqa: E402
from horovodish.common.api import collectives  # noqa: E402

BATCH = 12
STEPS = 12


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()


def train(hook: Any = None, state: Any = None, steps: int = STEPS, **kwargs: Any
          ) -> tuple[nn.Module, Any]:
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), **kwargs)
    if hook is not None:
        opt.register_comm_hook(state, hook)
    per = BATCH // hvd.size()
    mine = slice(hvd.rank() * per, (hvd.rank() + 1) * per)
    for step in range(steps):
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(BATCH, 5, generator=gen, dtype=torch.float64)
        y = torch.randn(BATCH, 3, generator=gen, dtype=torch.float64)
        opt.zero_grad()
        F.mse_loss(model(x[mine]), y[mine]).backward()
        opt.step()
    return model, opt


def same(model: nn.Module, want: nn.Module, what: str, tol: float) -> None:
    for (name, got), expected in zip(model.named_parameters(), want.parameters()):
        close(got, expected, f"{what}: {name}", tol)


def powersgd_at_full_rank_is_exact(rank: int, size: int) -> None:
    """Rank = min(rows, cols) for every matrix (forced to compress): P Q^T is the exact
    average, with the learned buckets, one gradient a bucket, and a predivide factor."""
    for kwargs in ({}, {"bucket_cap_mb": 0}, {"gradient_predivide_factor": 2.0}):
        exact, _ = train(**kwargs)
        state = hvd.PowerSGDState(matrix_approximation_rank=64, start_powerSGD_iter=2,
                                  min_compression_rate=0)
        full, _ = train(hvd.powersgd_hook, state, **kwargs)
        check(state.bytes_sent > 0, "the compressed path ran")
        same(full, exact, f"full rank {kwargs}", 1e-9)
    low = hvd.PowerSGDState(matrix_approximation_rank=1, start_powerSGD_iter=2)
    approximated, _ = train(hvd.powersgd_hook, low)
    with torch.no_grad():
        differs = max(float((a - b).abs().max()) for a, b in zip(approximated.parameters(),
                                                                 exact.parameters()))
    check(differs > 1e-6, f"rank 1 should not be exact (differs by {differs})")


def matches_ddp_powersgd_hook(rank: int, size: int) -> None:
    """Ranks 1 and 2 (error feedback, warm start): the weights of torch DDP on gloo with
    its own powerSGD_hook, the reference for 'DDP's algorithm'."""
    import os
    import socket

    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ddp_powersgd
    from torch.nn.parallel import DistributedDataParallel
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    port = hvd.broadcast_object(port if rank == 0 else None, root_rank=0)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size)
    try:
        per = BATCH // size
        mine = slice(rank * per, (rank + 1) * per)
        for r in (1, 2):
            ddp = DistributedDataParallel(make_model())
            ddp.register_comm_hook(ddp_powersgd.PowerSGDState(
                process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=2,
                min_compression_rate=0.5), ddp_powersgd.powerSGD_hook)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
            for step in range(STEPS):
                gen = torch.Generator().manual_seed(step)
                x = torch.randn(BATCH, 5, generator=gen, dtype=torch.float64)
                y = torch.randn(BATCH, 3, generator=gen, dtype=torch.float64)
                opt.zero_grad()
                F.mse_loss(ddp(x[mine]), y[mine]).backward()
                opt.step()
            state = hvd.PowerSGDState(matrix_approximation_rank=r, start_powerSGD_iter=2,
                                      min_compression_rate=0.5)
            ours, _ = train(hvd.powersgd_hook, state)
            same(ours, ddp.module, f"rank {r} against DDP's powerSGD_hook", 1e-9)
            exact, _ = train()
            with torch.no_grad():
                apart = max(float((a - b).abs().max()) for a, b in zip(
                    ours.parameters(), exact.parameters()))
            check(apart > 1e-6, f"rank {r}: no different from the exact allreduce")
    finally:
        dist.destroy_process_group()


def cast_hooks_equal_compression(rank: int, size: int) -> None:
    """fp16/bf16 hooks send what Compression.fp16/bf16 send; allreduce_hook is exact."""
    tol = 0.0 if size <= 2 else 1e-3  # 3 values summed in another order round apart
    for hook, compression in ((hvd.fp16_compress_hook, hvd.Compression.fp16),
                              (hvd.bf16_compress_hook, hvd.Compression.bf16)):
        want, _ = train(compression=compression)
        got, _ = train(hook)
        same(got, want, hook.__name__, tol)
    exact, _ = train()
    got, _ = train(hvd.allreduce_hook)
    same(got, exact, "allreduce_hook", 1e-12)


def a_hook_of_ones_own(rank: int, size: int) -> None:
    """A user hook: sum the buffer with hvd.allreduce_async, divide in finish. It sees
    the bucket's parameters, names and step."""
    seen: list[tuple[int, list[str]]] = []

    def hook(state: Any, bucket: hvd.GradBucket) -> Any:
        seen.append((bucket.step, bucket.names()))
        check(all(torch.equal(g, v) for g, v in zip(bucket.gradients(), (
            p.grad for p in bucket.parameters()))), "gradients() are the parameters' ones")
        handle = hvd.allreduce_async(bucket.buffer(), name=f"mine.{bucket.name}", op=hvd.Sum)
        return lambda: hvd.synchronize(handle) * bucket.scale()
    exact, _ = train()
    got, _ = train(hook)
    same(got, exact, "own hook", 1e-12)
    check(seen[0][0] == 0 and seen[-1][0] == STEPS - 1, f"steps seen: {seen[:2]}...")
    check(sorted(n for _, names in seen if _ == 1 for n in names) ==
          sorted(n for n, _ in make_model().named_parameters()), "every gradient once a step")


def bytes_per_step(rank: int, size: int) -> None:
    """Bytes handed to the core per step, counted at the core's entry points: PowerSGD
    of rank r sends (rows + cols) * r per compressed matrix plus the rest exactly."""
    sent: list[int] = []
    originals = (collectives.allreduce_async, collectives.grouped_allreduce_async)

    def single(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(tensor.nbytes)
        return originals[0](tensor, *args, **kwargs)

    def grouped(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(sum(t.nbytes for t in tensors))
        return originals[1](tensors, *args, **kwargs)
    collectives.allreduce_async, collectives.grouped_allreduce_async = single, grouped
    try:
        torch.manual_seed(0)
        shapes = [(64, 48), (64,), (10, 64), (10,)]
        per_step = {}
        for r in (0, 1, 2, 4):
            model = nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 10))
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                           named_parameters=model.named_parameters())
            state = hvd.PowerSGDState(matrix_approximation_rank=r, start_powerSGD_iter=2) \
                if r else None
            if r:
                opt.register_comm_hook(state, hvd.powersgd_hook)
            for step in range(4):  # the last one counts (learned buckets, compressing)
                opt.zero_grad()
                del sent[:]
                model(torch.randn(8, 48)).pow(2).mean().backward()
                opt.step()
            per_step[r] = sum(sent)
        exact = sum(torch.Size(s).numel() for s in shapes) * 4
        check(per_step[0] == exact, f"exact allreduce: {per_step[0]} bytes, want {exact}")
        for r in (1, 2, 4):
            want = 4 * (64 + 10 + (64 + 48) * r + (10 + 64) * r)
            check(per_step[r] == want, f"rank {r}: {per_step[r]} bytes a step, want {want}")
            sys.stdout.write(f"rank {rank}: PowerSGD rank {r} sends {per_step[r]} bytes a "
                             f"step, exact {exact}: {exact / per_step[r]:.1f}x fewer\n")
    finally:
        collectives.allreduce_async, collectives.grouped_allreduce_async = originals


def digits_accuracy_kept(rank: int, size: int) -> None:
    """examples/pytorch_digits.py with PowerSGD of rank 1 to 4 reaches the exact run's
    test accuracy within 1 point."""
    import pytorch_digits
    accuracy = {}
    for r in (0, 1, 2, 3, 4):
        accuracy[r], _ = pytorch_digits.train(pytorch_digits.parse_args(
            ["--powersgd-rank", str(r)]))
    sys.stdout.write(f"rank {rank}: digits test accuracy by PowerSGD rank (0: exact): "
                     f"{accuracy}\n")
    check(accuracy[0] >= 0.95, f"the exact run reached {accuracy[0]}")
    for r in (1, 2, 3, 4):
        check(abs(accuracy[r] - accuracy[0]) <= 0.01,
              f"PowerSGD rank {r}: {accuracy[r]:.4f}, exact {accuracy[0]:.4f}")


def errors(rank: int, size: int) -> None:
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    opt.register_comm_hook(None, hvd.fp16_compress_hook)
    expect_error(lambda: opt.register_comm_hook(None, hvd.allreduce_hook), RuntimeError,
                 "registered already", what="twice")
    compressed = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                          named_parameters=model.named_parameters(),
                                          compression=hvd.Compression.fp16)
    expect_error(lambda: compressed.register_comm_hook(None, hvd.allreduce_hook),
                 ValueError, "compresses already", what="with compression")
    sharded = hvd.DistributedOptimizer(torch.optim.SGD(make_model().parameters(), lr=0.1),
                                       shard_optimizer_state=True)
    expect_error(lambda: sharded.register_comm_hook(None, hvd.allreduce_hook), ValueError,
                 "reduce-scattered", what="sharded")
    _, late = train(steps=1)
    expect_error(lambda: late.register_comm_hook(None, hvd.allreduce_hook), RuntimeError,
                 "before the first backward", what="late")
    expect_error(lambda: train(lambda s, b: (lambda: torch.zeros(1, dtype=torch.float64)),
                               steps=1), ValueError, "returned 1 values", what="wrong size")


if __name__ == "__main__":
    hvd.init()
    torch.set_num_threads(1)
    checks = [powersgd_at_full_rank_is_exact, matches_ddp_powersgd_hook,
              cast_hooks_equal_compression, a_hook_of_ones_own,
              bytes_per_step, errors, digits_accuracy_kept]
    chosen = sys.argv[1:]
    run_checks([c for c in checks if not chosen or c.__name__ in chosen], hvd.rank(),
               hvd.size())
