"""Gradients of the torch collectives against analytic references, on every rank.

Each rank's input x_r and upstream weight w_r are pure functions of (rank, name), so every
rank can compute the gradient of loss = sum_r <w_r, op(x)_r> for its own input: the exact
one, or Horovod's definition where it differs (allgather and broadcast average the
upstream gradients over ranks; reducescatter scales them, see docs/api.md).
Each collective's gradients are a named check (tests/worker_support.py), in CHECKS, run
by training_worker.py.
"""
from __future__ import annotations

import zlib

import torch

from worker_support import check, close  # noqa: E402

import horovodish.torch as hvd  # noqa: E402


def data(rank: int, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}/{rank}".encode()))
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def same(got: torch.Tensor | None, want: torch.Tensor, what: str) -> None:
    if check(got is not None, f"{what}: no gradient"):
        close(got, want, what, 1e-5, atol=1e-12)


def leaf(rank: int, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    return data(rank, name, shape).requires_grad_()


def allreduce_gradients(rank: int, size: int) -> None:
    for op, pre, post in [(hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Sum, 0.5, 3.0),
                          (hvd.Average, 2.0, 0.25)]:
        for name in (f"ar.{op}.{pre}", None):
            key = name or f"ar.unnamed.{op}.{pre}"
            x = leaf(rank, key + ".x", (3, 2))
            y = hvd.allreduce(x, name=name, op=op, prescale_factor=pre, postscale_factor=post)
            (y * data(rank, key + ".w", (3, 2))).sum().backward()
            want = sum(data(r, key + ".w", (3, 2)) for r in range(size)) * pre * post
            same(x.grad, want / size if op == hvd.Average else want, f"allreduce {key}")
    xs = [leaf(rank, f"gar.x{i}", (i + 1,)) for i in range(3)]
    ys = hvd.grouped_allreduce(xs, name="gar", op=hvd.Sum)
    # Only two outputs feed the loss: the third output's gradient is zeros on every rank.
    (ys[0] * data(rank, "gar.w0", (1,))).sum().add((ys[2] * 2).sum()).backward()
    same(xs[0].grad, sum(data(r, "gar.w0", (1,)) for r in range(size)), "grouped 0")
    same(xs[2].grad, torch.full((3,), 2.0 * size, dtype=torch.float64), "grouped 2")
    check(xs[1].grad is None or bool((xs[1].grad == 0).all()), "grouped 1 not zero")
    # Through a compression cast too.
    x = leaf(rank, "arc.x", (4,))
    y = hvd.allreduce(x, name="arc", op=hvd.Sum, compression=hvd.Compression.bf16)
    y.sum().backward()
    same(x.grad, torch.full((4,), float(size), dtype=torch.float64), "compressed allreduce")


def allgather_gradients(rank: int, size: int) -> None:
    rows = [r % 3 for r in range(size)]  # uneven, with a zero-row rank
    offsets = [sum(rows[:r]) for r in range(size)]
    total = sum(rows)
    for name in ("ag", None):
        key = name or "ag.unnamed"
        x = leaf(rank, key + ".x", (rows[rank], 2))
        y = hvd.allgather(x, name=name)
        check(y.shape == (total, 2), "allgather shape")
        (y * data(rank, key + ".w", (total, 2))).sum().backward()
        mean_w = sum(data(r, key + ".w", (total, 2)) for r in range(size)) / size
        same(x.grad, mean_w[offsets[rank]:offsets[rank] + rows[rank]], f"allgather {key}")


def grouped_allgather_gradients(rank: int, size: int) -> None:
    """Each tensor of the group gets its own allgather gradient (uneven rows, a rank
    with none), through one grouped collective each way."""
    rows = [[r % 3, (r + 1) % 2 + 1] for r in range(size)]  # rows[r][i]: tensor i on r
    totals = [sum(rows[r][i] for r in range(size)) for i in range(2)]
    xs = [leaf(rank, f"gag.x{i}", (rows[rank][i], 2)) for i in range(2)]
    ys = hvd.grouped_allgather(xs, name="gag")
    check([tuple(y.shape) for y in ys] == [(t, 2) for t in totals], "grouped allgather shapes")
    loss = sum((y * data(rank, f"gag.w{i}", (totals[i], 2))).sum() for i, y in enumerate(ys))
    loss.backward()
    for i in range(2):
        offset = sum(rows[r][i] for r in range(rank))
        mean_w = sum(data(r, f"gag.w{i}", (totals[i], 2)) for r in range(size)) / size
        same(xs[i].grad, mean_w[offset:offset + rows[rank][i]], f"grouped allgather {i}")


def grouped_reducescatter_gradients(rank: int, size: int) -> None:
    """Horovod's gradient (see reducescatter_gradients), per tensor of the group."""
    for op, pre, post in [(hvd.Sum, 1.0, 1.0), (hvd.Average, 2.0, 0.5)]:
        key = f"grs.{op}"
        shapes = [(2 * size + 1, 2), (size, 3)]
        xs = [leaf(rank, f"{key}.x{i}", shape) for i, shape in enumerate(shapes)]
        ys = hvd.grouped_reducescatter(xs, name=key, op=op, prescale_factor=pre,
                                       postscale_factor=post)
        counts = [[n // size + (1 if r < n % size else 0) for r in range(size)]
                  for n, _ in shapes]
        loss = sum((y * data(rank, f"{key}.w{i}", (counts[i][rank], shapes[i][1]))).sum()
                   for i, y in enumerate(ys))
        loss.backward()
        for i, (_, cols) in enumerate(shapes):
            want = torch.cat([data(r, f"{key}.w{i}", (counts[i][r], cols))
                              for r in range(size)]) * pre * post
            same(xs[i].grad, want * size if op == hvd.Sum else want,
                 f"grouped reducescatter {key} {i}")


def broadcast_gradients(rank: int, size: int) -> None:
    for root in range(size):
        x = leaf(rank, f"bc{root}.x", (2, 3))
        y = hvd.broadcast(x, root, name=f"bc{root}")
        same(y.detach(), data(root, f"bc{root}.x", (2, 3)), "broadcast forward")
        (y * data(rank, f"bc{root}.w", (2, 3))).sum().backward()
        want = sum(data(r, f"bc{root}.w", (2, 3)) for r in range(size)) / size
        same(x.grad, want if rank == root else torch.zeros_like(want), f"broadcast root {root}")


def alltoall_gradients(rank: int, size: int) -> None:
    # splits[src][dst]: rows src sends to dst.
    splits = [[(src + dst) % 3 for dst in range(size)] for src in range(size)]
    received = [splits[src][rank] for src in range(size)]
    x = leaf(rank, "a2a.x", (sum(splits[rank]), 2))
    y, got_splits = hvd.alltoall(x, splits=splits[rank], name="a2a")
    check(got_splits.tolist() == received, "alltoall received splits")
    (y * data(rank, "a2a.w", (sum(received), 2))).sum().backward()
    # Rows this rank sent to dst sit in dst's output after the rows of lower sources.
    parts = []
    for dst in range(size):
        start = sum(splits[src][dst] for src in range(rank))
        w = data(dst, "a2a.w", (sum(splits[src][dst] for src in range(size)), 2))
        parts.append(w[start:start + splits[rank][dst]])
    same(x.grad, torch.cat(parts), "alltoall with splits")
    # Even split without splits=: the forward returns one tensor.
    x = leaf(rank, "a2a.even.x", (2 * size, 1))
    y = hvd.alltoall(x)
    check(isinstance(y, torch.Tensor), "alltoall without splits returns a tensor")
    (y * (rank + 1)).sum().backward()
    same(x.grad, torch.cat([torch.full((2, 1), float(dst + 1), dtype=torch.float64)
                            for dst in range(size)]), "alltoall even")


def reducescatter_gradients(rank: int, size: int) -> None:
    rows = 2 * size + 1  # uneven: the first rank gets an extra row
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    for op, pre, post in [(hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Sum, 2.0, 0.5)]:
        key = f"rs.{op}.{pre}"
        x = leaf(rank, key + ".x", (rows, 2))
        y = hvd.reducescatter(x, name=key, op=op, prescale_factor=pre, postscale_factor=post)
        check(y.shape == (counts[rank], 2), f"reducescatter shape {tuple(y.shape)}")
        (y * data(rank, key + ".w", (counts[rank], 2))).sum().backward()
        want = torch.cat([data(r, key + ".w", (counts[r], 2)) for r in range(size)]) * pre * post
        # Horovod's gradient, not the exact one: the gathered upstream gradients times
        # the scale factors, and times size for Sum (the exact gradient has 1 and 1/size).
        same(x.grad, want * size if op == hvd.Sum else want, f"reducescatter {key}")


def no_grad_paths(rank: int, size: int) -> None:
    """Without requires_grad (or under no_grad) nothing is recorded."""
    x = leaf(rank, "ng.x", (2,))
    with torch.no_grad():
        y = hvd.allreduce(x, name="ng")
    check(not y.requires_grad, "no_grad allreduce recorded a graph")
    y = hvd.allgather(torch.ones(1, 2), name="ng.plain")
    check(not y.requires_grad and y.shape == (size, 2), "plain allgather")


CHECKS = [allreduce_gradients, allgather_gradients, grouped_allgather_gradients,
          broadcast_gradients, alltoall_gradients, reducescatter_gradients,
          grouped_reducescatter_gradients, no_grad_paths]
