"""SyncBatchNorm and buffer strategies on real ranks, against references on gathered data.

Every rank's data is a pure function of (rank, name), so each rank builds the whole
batch and runs torch's own BatchNorm on it as the reference. Named checks
(tests/worker_support.py), in CHECKS, run by training_worker.py.
"""
from __future__ import annotations

import copy
import zlib

import torch
from torch import nn

from worker_support import check, expect_error  # noqa: E402

import horovodish.torch as hvd  # noqa: E402


def data(rank: int, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}/{rank}".encode()))
    return torch.randn(shape, generator=gen) * 3 + 1


def near(got: torch.Tensor, want: torch.Tensor, what: str, tol: float = 1e-5) -> None:
    if not check(got.shape == want.shape,
                 f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"):
        return
    got, want = got.detach(), want.detach()
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    diff = float((got - want).abs().max()) if got.numel() else 0.0
    check(diff <= tol * scale, f"{what}: differs by {diff} (largest value {scale})")


def sync_batch_norm(rank: int, size: int) -> None:
    rows = [(3, 1, 5, 2)[r % 4] for r in range(size)]  # uneven local batches
    start = sum(rows[:rank])
    mine = slice(start, start + rows[rank])
    cases = [("2d", (4,), {}), ("4d", (3, 2, 2), {}), ("cumulative", (3,), {"momentum": None}),
             ("no affine", (3, 2), {"affine": False})]
    for label, shape, kwargs in cases:
        channels = shape[0]
        if rank == 0:  # one more layer on one rank (an EMA copy) must not shift names
            hvd.SyncBatchNorm(channels)
        sync = hvd.SyncBatchNorm(channels, **kwargs)
        ref = nn.BatchNorm1d(channels, **kwargs) if len(shape) < 3 else \
            nn.BatchNorm2d(channels, **kwargs)
        if sync.affine:
            with torch.no_grad():
                for module in (sync, ref):
                    module.weight.copy_(torch.linspace(0.5, 2.0, channels))
                    module.bias.copy_(torch.linspace(-1.0, 1.0, channels))
        for step in range(3):
            name = f"sbn.{label}.{step}"
            inputs = [data(r, name, (rows[r], *shape)) for r in range(size)]
            upstream = [data(r, name + ".g", (rows[r], *shape)) for r in range(size)]
            x = inputs[rank].clone().requires_grad_()
            full = torch.cat(inputs).requires_grad_()
            y = sync(x)
            want = ref(full)
            near(y.detach(), want.detach()[mine], f"{label} step {step}: output")
            (y * upstream[rank]).sum().backward()
            (want * torch.cat(upstream)).sum().backward()
            near(x.grad, full.grad[mine], f"{label} step {step}: input grad")
            near(sync.running_mean, ref.running_mean, f"{label}: running mean")
            near(sync.running_var, ref.running_var, f"{label}: running var")
            check(int(sync.num_batches_tracked) == int(ref.num_batches_tracked), "batches")
            if sync.affine:
                for got, exp, what in [(sync.weight, ref.weight, "weight"),
                                       (sync.bias, ref.bias, "bias")]:
                    near(hvd.allreduce(got.grad, name=f"{name}.{what}", op=hvd.Sum),
                         exp.grad, f"{label}: summed {what} grad", 1e-4)
                    got.grad = exp.grad = None
        sync.eval()
        ref.eval()
        x = data(rank, f"sbn.{label}.eval", (2, *shape))
        near(sync(x), ref(x), f"{label}: eval output")
    # Under autocast the output keeps the activation's dtype, as torch's BatchNorm's does.
    sync, ref = hvd.SyncBatchNorm(3), nn.BatchNorm2d(3)
    inputs = [data(r, "sbn.autocast", (rows[r], 3, 2, 2)) for r in range(size)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        conv = nn.Conv2d(3, 3, 1)
        with torch.no_grad():
            conv.weight.copy_(torch.eye(3).view(3, 3, 1, 1))
            conv.bias.zero_()
        got, want = sync(conv(inputs[rank])), ref(conv(torch.cat(inputs)))
    check(got.dtype == want.dtype == torch.bfloat16, f"autocast: dtype {got.dtype}, torch's "
          f"{want.dtype}")
    near(got.float(), want.float()[mine], "autocast: output", 2e-2)
    # A rank without rows still takes part (3 ranks and more).
    if size >= 3:
        sync, ref = hvd.SyncBatchNorm(2), nn.BatchNorm1d(2)
        inputs = [data(r, "sbn.empty", (0 if r == 1 else 2, 2)) for r in range(size)]
        near(sync(inputs[rank]).detach(), ref(torch.cat(inputs)).detach()[
            sum(i.shape[0] for i in inputs[:rank]):][:inputs[rank].shape[0]], "empty rank")
        near(sync.running_var, ref.running_var, "empty rank: running var")
    model = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3), nn.Sequential(nn.BatchNorm1d(3)))
    model[1].running_mean.fill_(0.5)
    converted = hvd.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model))
    check(isinstance(converted[1], hvd.SyncBatchNorm)
          and isinstance(converted[2][0], hvd.SyncBatchNorm), "convert_sync_batchnorm")
    near(converted[1].running_mean, model[1].running_mean, "converted keeps running stats")


class Buffers(nn.Module):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.register_buffer("a", data(rank, "buf.a", (3,)))
        self.register_buffer("b", torch.tensor(10 * rank + 3))
        self.register_buffer("c", data(rank, "buf.c", (2, 2)))
        self.register_buffer("d", data(rank, "buf.d", (4,)))
        self.sub = nn.Module()
        self.sub.register_buffer("e", data(rank, "buf.e", (2,)))
        self.sub.register_buffer("f", torch.full((2,), float(rank)))


def buffer_strategies(rank: int, size: int) -> None:
    root = size - 1
    everyone = [Buffers(r) for r in range(size)]  # the references: never synced
    module = Buffers(rank)
    top = lambda tensors: torch.stack(tensors).max(0).values  # noqa: E731
    sync = hvd.BufferSync(module, {"a": "average", "b": "sum", "c": top, "sub.*": "none",
                                   "sub.f": "average"}, default="broadcast", root_rank=root)
    sync()
    near(module.a, sum(m.a for m in everyone) / size, "average", 1e-6)
    check(int(module.b) == sum(10 * r + 3 for r in range(size)), "sum of int buffer")
    near(module.c, torch.stack([m.c for m in everyone]).max(0).values, "callable")
    near(module.d, Buffers(root).d, "broadcast from root")
    near(module.sub.e, Buffers(rank).sub.e, "none leaves alone")
    near(module.sub.f, torch.full((2,), (size - 1) / 2), "exact name beats pattern")
    # Integer average is a floor, as for allreduce.
    ints = nn.Module()
    ints.register_buffer("n", torch.tensor(rank))
    hvd.sync_buffers(ints, {"n": "average"})
    check(int(ints.n) == sum(range(size)) // size, "integer average")
    for bad, fragment in [({"nope": "sum"}, "name no buffer"), ({"a": "median"}, "unknown")]:
        expect_error(lambda: hvd.BufferSync(module, bad), ValueError, fragment,
                     what=f"BufferSync with {bad}")
    expect_error(lambda: hvd.sync_buffers(module, {"a": lambda ts: ts[0][:1]}, default="none"),
                 ValueError, "shape", what="a callable returning the wrong shape")


def optimizer_buffer_sync(rank: int, size: int) -> None:
    """buffer_sync= runs after every step: running stats become the mean over ranks."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    initial = copy.deepcopy(model)
    inputs = [data(r, "obs.x", (5, 3)) for r in range(size)]
    sync = hvd.BufferSync(model, {"1.running_*": "average"})
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), buffer_sync=sync)
    model(inputs[rank]).pow(2).mean().backward()
    opt.step()
    local = []
    for r in range(size):
        replica = copy.deepcopy(initial)
        replica(inputs[r])
        local.append(replica[1])
    near(model[1].running_mean, sum(m.running_mean for m in local) / size, "opt: mean")
    near(model[1].running_var, sum(m.running_var for m in local) / size, "opt: var")
    check(int(model[1].num_batches_tracked) == 1, "opt: batches tracked broadcast")


CHECKS = [sync_batch_norm, buffer_strategies, optimizer_buffer_sync]
