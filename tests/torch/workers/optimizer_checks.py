"""DistributedOptimizer, broadcast_parameters and broadcast_optimizer_state on real ranks.

The reference for every training check is plain torch in this same process on the whole
batch (every rank can build every rank's shard: the data is a pure function of the step),
so N ranks with 1/N of the batch each must land on the reference's weights.
Named checks (tests/worker_support.py), in CHECKS, run by training_worker.py: a failure
is reported, and the next check runs.
"""
from __future__ import annotations

import os
import sys
import time
import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from worker_support import check, close, expect_error  # noqa: E402

import horovodish.torch as hvd  # noqa: E402
from horovodish.torch import mpi_ops  # noqa: E402

BATCH = 24  # divisible by 1, 2, 3, 4 and 6 ranks, and by 2 micro-batches on each
STEPS = 15


def same_weights(model: nn.Module, reference: nn.Module, tol: float, what: str) -> None:
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        diff = float((got.detach() - want.detach()).abs().max())
        check(diff <= tol, f"{what}: parameter {name} differs from the reference by {diff}")


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, 8, generator=gen), torch.randn(BATCH, 4, generator=gen)


def shard(t: torch.Tensor, rank: int | None = None) -> torch.Tensor:
    rank = hvd.rank() if rank is None else rank
    per = t.shape[0] // hvd.size()
    return t[rank * per:(rank + 1) * per]


def train(make_opt: Callable, steps: int = STEPS, passes: int = 1, clip: bool = False,
          model: nn.Module | None = None, loss_fn: Callable | None = None,
          **kwargs: Any) -> tuple[nn.Module, Any]:
    """Distributed run; non-root ranks start from different weights and get root's."""
    model = model or make_model()
    if hvd.rank() != 0:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **kwargs)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    loss_fn = loss_fn or (lambda m, x, y, r: F.mse_loss(m(x), y))
    for step in range(steps):
        x, y = (shard(t) for t in batch(step))
        opt.zero_grad()
        for xs, ys in zip(x.chunk(passes), y.chunk(passes)):
            (loss_fn(model, xs, ys, hvd.rank()) / passes).backward()
        if clip:
            opt.synchronize()
            nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    return model, opt


def reference(make_opt: Callable, steps: int = STEPS, scale: float = 1.0, clip: bool = False,
              model: nn.Module | None = None, loss_fn: Callable | None = None) -> nn.Module:
    """Plain torch on the whole batch: the mean over ranks of each rank's loss."""
    model = model or make_model()
    opt = make_opt(model.parameters())
    loss_fn = loss_fn or (lambda m, x, y, r: F.mse_loss(m(x), y))
    size = hvd.size()
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        loss = sum(loss_fn(model, shard(x, r), shard(y, r), r) for r in range(size)) / size
        (loss * scale).backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
    return model


SGD = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
ADAM = lambda p: torch.optim.Adam(p, lr=0.01)  # noqa: E731
ADAMW = lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)  # noqa: E731


def equivalence(rank: int, size: int) -> None:
    for label, make_opt in [("SGD momentum", SGD), ("Adam", ADAM), ("AdamW", ADAMW)]:
        model, opt = train(make_opt)
        check(isinstance(opt, type(make_opt([torch.zeros(1, requires_grad=True)]))),
              f"{label}: wrapper is not an instance of the wrapped class")
        same_weights(model, reference(make_opt), 1e-5, label)
    ref = reference(SGD)
    same_weights(train(SGD, passes=2)[0], ref, 1e-5, "backward_passes_per_step=2")
    same_weights(train(SGD, gradient_predivide_factor=2.0)[0], ref, 1e-5, "predivide factor 2")
    same_weights(train(SGD, groups=2)[0], ref, 1e-5, "groups=2")
    model = make_model()
    params = list(model.parameters())
    same_weights(train(SGD, model=model, groups=[params[:2], params[3:]])[0], ref, 1e-5,
                 "groups as lists")
    same_weights(train(SGD, bucket_cap_mb=0)[0], ref, 1e-5, "without learned order")
    same_weights(train(SGD, bucket_cap_mb=0.0005)[0], ref, 1e-5, "many small buckets")
    same_weights(train(SGD, op=hvd.Sum)[0], reference(SGD, scale=hvd.size()), 1e-5, "op=Sum")
    same_weights(train(SGD, clip=True)[0], reference(SGD, clip=True), 1e-5, "synchronize+clip")
    for compression, tol in [(hvd.Compression.fp16, 2e-3), (hvd.Compression.bf16, 2e-2)]:
        same_weights(train(SGD, compression=compression)[0], ref, tol, f"{compression.__name__}")
    same_weights(train(ADAM, gradient_as_bucket_view=False)[0], reference(ADAM), 1e-5,
                 "gradients reduced in place")
    same_weights(train(SGD, gradient_as_bucket_view=False,
                       compression=hvd.Compression.fp16)[0], ref, 2e-3,
                 "in place with fp16 compression")


def gradient_identity(rank: int, size: int) -> None:
    """Horovod's in-place semantics, with or without gradient_as_bucket_view: the tensor
    in param.grad before step() is the one that holds the reduced gradient after it. The
    default reduces the first step's gradients (while the order is learned) where
    autograd made them, then makes each a view of its flat bucket (same values, another
    tensor), and from the second step on reduces the buckets in place. Ranks' inputs
    differ, so a tensor left with this rank's gradient would not hold the mean."""
    for as_view in (True, False):
        model = nn.Linear(5, 3)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                       named_parameters=[(f"identity{as_view}.{n}", p) for n, p
                                                         in model.named_parameters()],
                                       gradient_as_bucket_view=as_view)
        for step in range(3):
            opt.zero_grad()
            inputs = [torch.full((2, 5), float(r + step)) for r in range(hvd.size())]
            model(inputs[hvd.rank()]).sum().backward()
            before = model.weight.grad
            opt.synchronize()
            want = (sum(x.sum(0) for x in inputs) / hvd.size()).expand(3, 5)  # d sum / dW
            close(model.weight.grad, want, f"as_view={as_view}: the mean", 1e-5, atol=1e-8)
            check(model.weight.grad is before or (as_view and step == 0),
                  f"as_view={as_view}, step {step}: param.grad is another tensor")
            close(model.weight.grad, before, f"as_view={as_view}: param.grad after", 0.0)
            close(before, want, f"as_view={as_view}: the tensor held before", 1e-5, atol=1e-8)
            with opt.skip_synchronize():
                opt.step()


class Branchy(nn.Module):
    """A head that only rank 0 uses: other ranks must reduce zeros for it, not stall."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.trunk = nn.Linear(8, 4)
        self.branch = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, use_branch: bool) -> torch.Tensor:
        h = self.trunk(x)
        return h + self.branch(h) if use_branch else h


def branch_on_one_rank(rank: int, size: int) -> None:
    loss_fn = lambda m, x, y, r: F.mse_loss(m(x, r == 0), y)  # noqa: E731
    model, _ = train(ADAM, model=Branchy(), loss_fn=loss_fn)
    same_weights(model, reference(ADAM, model=Branchy(), loss_fn=loss_fn), 1e-5,
                 "branch on rank 0")


class Embedder(nn.Module):
    """An embedding (sparse gradients, or dense for the reference), skipped when asked."""

    def __init__(self, sparse: bool) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.embedding = nn.Embedding(30, 4, sparse=sparse)
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, use_embedding: bool = True) -> torch.Tensor:
        if not use_embedding:
            return self.head(x[:, :4])
        ids = (x.abs() * 10).long().clamp(max=29)[:, :3]
        return self.head(self.embedding(ids).mean(1))


def sparse(rank: int, size: int) -> None:
    plain = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
    loss_fn = lambda m, x, y, r: F.mse_loss(m(x), y)  # noqa: E731
    want = reference(plain, model=Embedder(sparse=False), loss_fn=loss_fn)
    for as_dense in (True, False):
        model, _ = train(plain, model=Embedder(sparse=True), loss_fn=loss_fn,
                         sparse_as_dense=as_dense)
        same_weights(model, want, 1e-5, f"sparse gradients, sparse_as_dense={as_dense}")


class EmbeddingOnly(nn.Module):
    """Only sparse gradients: what SparseAdam takes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.embedding = nn.Embedding(30, 4, sparse=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embedding((x.abs() * 10).long().clamp(max=29)[:, :3]).mean(1)


def sparse_adam(rank: int, size: int) -> None:
    """The reduced gradient reaches the optimizer sparse, whether it travelled sparse or
    dense (sparse_as_dense, Horovod's rule): SparseAdam refuses dense gradients. Against
    SparseAdam on the whole batch."""
    sparse_adam = lambda p: torch.optim.SparseAdam(list(p), lr=0.05)  # noqa: E731
    loss_fn = lambda m, x, y, r: F.mse_loss(m(x), y)  # noqa: E731
    want = reference(sparse_adam, model=EmbeddingOnly(), loss_fn=loss_fn)
    for as_dense in (True, False):
        for in_place in (True, False):
            model, _ = train(sparse_adam, model=EmbeddingOnly(), loss_fn=loss_fn,
                             sparse_as_dense=as_dense, gradient_as_bucket_view=in_place)
            same_weights(model, want, 1e-5, f"SparseAdam, sparse_as_dense={as_dense}, "
                         f"gradient_as_bucket_view={in_place}")


def sparse_on_some_ranks_in_the_first_step(rank: int, size: int) -> None:
    """Step 1: only rank 0 has the sparse gradient. The others must send an empty sparse
    one under the same names, not dense zeros under another (that stalled)."""
    def first_step_on_rank_0() -> Callable:
        calls: dict[int, int] = {}

        def loss_fn(m: nn.Module, x: torch.Tensor, y: torch.Tensor, r: int) -> torch.Tensor:
            calls[r] = calls.get(r, 0) + 1
            return F.mse_loss(m(x, use_embedding=r == 0 or calls[r] > 1), y)
        return loss_fn
    plain = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
    want = reference(plain, steps=4, model=Embedder(sparse=False),
                     loss_fn=first_step_on_rank_0())
    for cap in (25.0, 0.0):
        model, _ = train(plain, steps=4, model=Embedder(sparse=True),
                         loss_fn=first_step_on_rank_0(), bucket_cap_mb=cap)
        same_weights(model, want, 1e-5,
                     f"sparse gradient on rank 0 alone in step 1, cap {cap}")


def sgd_pair(cap: float, reverse: bool = False) -> tuple[nn.Module, Any, nn.Module, Any]:
    """A model with a DistributedOptimizer (plain SGD; parameters listed in reverse when
    asked) and a reference model with plain torch's."""
    model, want = make_model(), make_model()
    named = list(model.named_parameters())
    named = named[::-1] if reverse else named
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in named], lr=0.1),
                                   named_parameters=named, bucket_cap_mb=cap)
    return model, opt, want, torch.optim.SGD(want.parameters(), lr=0.1)


def lockstep(index: int, model: nn.Module, opt: Any, want: nn.Module, want_opt: Any,
             ranks: range | None = None) -> None:
    """One step of batch(index) on the ranks in ``ranks`` (default all; the others
    contribute zeros, having joined), and the reference's step on their shards."""
    size = hvd.size()
    ranks = range(size) if ranks is None else ranks
    x, y = batch(index)
    want_opt.zero_grad()
    (sum(F.mse_loss(want(shard(x, r)), shard(y, r)) for r in ranks) / size).backward()
    want_opt.step()
    if hvd.rank() in ranks:
        opt.zero_grad()
        F.mse_loss(model(shard(x)), shard(y)).backward()
        opt.step()


def parameter_order_differs_between_ranks(rank: int, size: int) -> None:
    """named_parameters matches parameters by name, so ranks may list them in different
    orders; the first-step agreement goes by name too (it went by position: a stall)."""
    model, opt, want, want_opt = sgd_pair(25.0, reverse=hvd.rank() % 2 == 1)
    for index in range(3):
        lockstep(index, model, opt, want, want_opt)
    same_weights(model, want, 1e-5, "parameters listed in another order on odd ranks")


def rebuilt_optimizer_on_one_rank(rank: int, size: int) -> None:
    """A rank that rebuilds its model and optimizer mid-training (a worker joining an
    elastic job) agrees afresh with the others once broadcast_optimizer_state has run on
    every rank (the others never made the agreement again: a stall)."""
    for cap in (25.0, 0.0):
        model, opt, want, want_opt = sgd_pair(cap)
        for index in range(3):
            lockstep(index, model, opt, want, want_opt)
        if hvd.rank() == hvd.size() - 1:
            model, opt, _, _ = sgd_pair(cap)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        for index in range(3, 6):
            lockstep(index, model, opt, want, want_opt)
        same_weights(model, want, 1e-5, f"one rank rebuilt its optimizer, cap {cap}")


def join_before_the_first_step(rank: int, size: int) -> None:
    """Rank 0 has no batches in the first epoch and joins at once: the others train with
    its zeros (Average still divides by size), then every rank trains; buckets are
    learned at the first step all ranks make (the order exchange once failed: an
    allgather while a rank had joined)."""
    for cap in (25.0, 0.0):
        model, opt, want, want_opt = sgd_pair(cap)
        for index in range(3):
            lockstep(index, model, opt, want, want_opt, range(1, size))
        last = hvd.join()
        check(0 < last < size, f"join() returned {last}; rank 0 joined first")
        hvd.broadcast_parameters(model.state_dict(), root_rank=1)  # rank 0 missed updates
        for index in range(3, 6):
            lockstep(index, model, opt, want, want_opt, range(size))
        same_weights(model, want, 1e-5, f"joined before the first step, cap {cap}")
        stats = opt.negotiation_stats()
        if cap:
            check([s["submissions"] for s in stats[-2:]] == [1, 1],
                  f"no buckets learned once every rank stepped: {stats}")


def muon(rank: int, size: int) -> None:
    if not hasattr(torch.optim, "Muon"):
        return
    make = lambda p: torch.optim.Muon([q for q in p if q.dim() == 2], lr=0.02)  # noqa: E731
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.Tanh(), nn.Linear(16, 4, bias=False))
    opt = hvd.DistributedOptimizer(make(model.parameters()),
                                   named_parameters=model.named_parameters())
    check(isinstance(opt, torch.optim.Muon), "Muon wrapper is not a Muon")
    for step in range(5):
        x, y = (shard(t) for t in batch(step))
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat.unsqueeze(0), name="muon.params")
    check(bool((gathered == flat).all()), "Muon: ranks' weights differ")


def errors(rank: int, size: int) -> None:
    model = make_model()
    make = lambda: torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: E731
    named = list(model.named_parameters())
    expect_error(lambda: hvd.DistributedOptimizer(
        make(), named_parameters=[("w", named[0][1]), ("w", named[1][1]), *named[2:]]),
        ValueError, "unique", "w", what="a duplicate name")
    expect_error(lambda: hvd.DistributedOptimizer(make(), named_parameters=named[:2]),
                 ValueError, "does not name every parameter", what="names for some parameters")
    expect_error(lambda: hvd.DistributedOptimizer(make(), op=hvd.Adasum,
                                                  backward_passes_per_step=2),
                 ValueError, "Adasum", "backward_passes_per_step",
                 what="Adasum with backward_passes_per_step")
    expect_error(lambda: hvd.DistributedOptimizer(make(), op=hvd.Sum,
                                                  gradient_predivide_factor=2.0),
                 ValueError, "predivide", what="Sum with a predivide factor")
    expect_error(lambda: hvd.DistributedOptimizer(make(), op=hvd.Adasum,
                                                  gradient_predivide_factor=2.0),
                 ValueError, "predivide", what="Adasum with a predivide factor")
    expect_error(lambda: hvd.DistributedOptimizer(make(), op=hvd.Adasum, groups=2,
                                                  sparse_as_dense=True),
                 ValueError, "Adasum", "groups, sparse_as_dense",
                 what="Adasum with groups and sparse_as_dense")
    opt = hvd.DistributedOptimizer(make(), named_parameters=named)
    expect_error(lambda: hvd.DistributedOptimizer(opt), ValueError, "already",
                 what="wrapping twice")
    x, y = (shard(t) for t in batch(0))
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    expect_error(opt.zero_grad, AssertionError, "zero_grad", "pending",
                 what="zero_grad() with reductions pending")
    expect_error(lambda: F.mse_loss(model(x), y).backward(), AssertionError,
                 "more than backward_passes_per_step", what="a second backward")
    opt.step()
    opt.zero_grad()  # fine once the step is done
    # state_dict round trip through the wrapper.
    state = opt.state_dict()
    opt.load_state_dict(state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        F.mse_loss(model(x), y).backward()
        opt.synchronize()
        opt.step()
    check(any("skip_synchronize" in str(w.message) for w in caught),
          "step() after synchronize() did not warn")


def parameter_names(rank: int, size: int) -> None:
    """Horovod's ``_parameter_names`` (parameter -> name), which scripts read: the given
    names, else Horovod's defaults, distinct and the same on every rank."""
    model = make_model()
    named = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
    check(named._parameter_names == {p: n for n, p in model.named_parameters()},
          f"_parameter_names with names given: {list(named._parameter_names.values())}")
    groups = lambda: [{"params": model[0].parameters()},  # noqa: E731
                      {"params": model[2].parameters()}]
    unnamed = hvd.DistributedOptimizer(torch.optim.SGD(groups(), lr=0.1))
    want = {p: f"allreduce.noname.{i}.{j}"
            for i, layer in enumerate((model[0], model[2]))
            for j, p in enumerate(layer.parameters())}
    check(unnamed._parameter_names == want,
          f"default _parameter_names: {list(unnamed._parameter_names.values())}")
    everyone = hvd.allgather_object(sorted(unnamed._parameter_names.values()))
    check(all(names == everyone[0] for names in everyone), f"names differ: {everyone}")
    if hvd.size() & (hvd.size() - 1) == 0:  # Adasum runs on a power of two only
        adasum = hvd.DistributedOptimizer(torch.optim.SGD(groups(), lr=0.1), op=hvd.Adasum)
        check(adasum._parameter_names == want, "Adasum _parameter_names")


def one_runtime_attribute(rank: int, size: int) -> None:
    """Whichever optimizer DistributedOptimizer builds (replicated, sharded, Adasum), it
    adds one attribute of the runtime's to the user's optimizer, beside Horovod's
    ``backward_passes_per_step`` and ``_parameter_names``; it is an instance of the
    wrapped class, refuses to be wrapped again, and steps like plain torch."""
    kinds = {"replicated": {}, "sharded": {"shard_optimizer_state": True},
             "sharded stage 1": {"shard_optimizer_state": True, "zero_stage": 1}}
    if size & (size - 1) == 0:
        kinds["adasum"] = {"op": hvd.Adasum}
    allowed = {"_horovodish", "backward_passes_per_step", "_parameter_names"}
    for kind, options in kinds.items():
        model, want = make_model(), make_model()
        plain = torch.optim.SGD(model.parameters(), lr=0.1)
        before = set(plain.__dict__)
        opt = hvd.DistributedOptimizer(plain, named_parameters=model.named_parameters(),
                                       **options)
        added = set(opt.__dict__) - before
        check(added <= allowed, f"{kind}: attributes added {sorted(added - allowed)}")
        check(isinstance(opt, torch.optim.SGD), f"{kind}: not an SGD")
        expect_error(lambda: hvd.DistributedOptimizer(opt), ValueError, "already a "
                     "DistributedOptimizer", what=f"{kind}: wrapped twice")
        want_opt = torch.optim.SGD(want.parameters(), lr=0.1)
        x, y = batch(0)
        opt.zero_grad()
        F.mse_loss(model(shard(x)), shard(y)).backward()
        opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
        want_opt.zero_grad()
        (sum(F.mse_loss(want(shard(x, r)), shard(y, r)) for r in range(size))
         / size).backward()
        want_opt.step()
        if kind != "adasum":  # its delta rule: adasum_optimizer_worker.py
            same_weights(model, want, 1e-5, f"{kind}: one step")


def untracked_parameters(rank: int, size: int) -> None:
    """A parameter frozen when the optimizer was wrapped and unfrozen later, or added with
    add_param_group: its gradient would not be reduced, so step() refuses, on every rank,
    naming it (the replicas drifted apart silently)."""
    model = make_model()
    model[0].weight.requires_grad_(False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model[0].weight.requires_grad_(True)
    x, y = (shard(t) for t in batch(0))
    F.mse_loss(model(x), y).backward()
    expect_error(opt.step, ValueError, "parameter '0.weight'", "not reduced across ranks",
                 what="step() with a parameter unfrozen after wrapping")
    opt.zero_grad()
    extra = nn.Linear(4, 4)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    opt.add_param_group({"params": extra.parameters()})
    F.mse_loss(extra(model(x)), y).backward()
    expect_error(opt.step, ValueError, "param_groups[1]['params'][0]", "add_param_group",
                 what="step() with a parameter group added after wrapping")
    opt.zero_grad()


def broadcast_optimizer_state(rank: int, size: int) -> None:

    def stepped(r: int, steps: int) -> torch.optim.Optimizer:
        """Rank r's optimizer after its own rank-dependent local steps."""
        model = make_model()
        opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1), betas=(0.9, 0.99 - r / 100))
        gen = torch.Generator().manual_seed(50 + r)
        for _ in range(steps):
            opt.zero_grad()
            F.mse_loss(model(torch.randn(5, 8, generator=gen)), torch.zeros(5, 4)).backward()
            opt.step()
        return opt

    for root in range(size):
        mine, want = stepped(rank, 2 + rank), stepped(root, 2 + root).state_dict()
        hvd.broadcast_optimizer_state(mine, root_rank=root)
        got = mine.state_dict()
        check(got["param_groups"][0]["lr"] == want["param_groups"][0]["lr"], "lr not root's")
        check(tuple(got["param_groups"][0]["betas"]) == tuple(want["param_groups"][0]["betas"]),
              "betas not root's")
        check(set(got["state"]) == set(want["state"]), "state keys not root's")
        for key, entries in want["state"].items():
            for field, value in entries.items():
                check(torch.equal(got["state"][key][field], value),
                      f"root {root}: state {key}.{field} not root's")
    # Root with empty state: every rank's state becomes empty; root's lr everywhere.
    if rank == 0:
        fresh = torch.optim.SGD(make_model().parameters(), lr=0.5, momentum=0.9)
    else:
        fresh = torch.optim.SGD(make_model().parameters(), lr=0.1 * rank, momentum=0.5)
        fresh.state[fresh.param_groups[0]["params"][0]]["momentum_buffer"] = torch.ones(16, 8)
    hvd.broadcast_optimizer_state(fresh, root_rank=0)
    check(len(fresh.state_dict()["state"]) == 0, "state not emptied like root's")
    check(fresh.param_groups[0]["lr"] == 0.5 and fresh.param_groups[0]["momentum"] == 0.9,
          "hyper-parameters not root's")
    # A rank with empty state receives root's (Adam, wrapped in DistributedOptimizer).
    opt = stepped(0, 3) if rank == 0 else torch.optim.Adam(make_model().parameters())
    want = stepped(0, 3).state_dict()
    wrapped = hvd.DistributedOptimizer(opt)
    hvd.broadcast_optimizer_state(wrapped, root_rank=0)
    got = wrapped.state_dict()
    for key, entries in want["state"].items():
        for field, value in entries.items():
            check(torch.equal(got["state"][key][field], value), f"empty rank: {field} not root's")
    # Optimizers over parameters of other shapes: every rank raises, naming both shapes
    # (root's state would land on the wrong parameters, and fail later on one rank alone).
    layers = make_model()
    last = size - 1
    built = torch.optim.Adam((layers[2] if rank == last else layers[0]).parameters())
    expect_error(lambda: hvd.broadcast_optimizer_state(built, root_rank=0), ValueError,
                 "broadcast_optimizer_state", "shape [16, 8] on rank 0", f"[4, 16] on rank {last}",
                 what="parameters of other shapes")
    groups = [{"params": [p]} for p in layers.parameters()]
    built = torch.optim.SGD(groups[:2] if rank == last else groups, lr=0.1)
    expect_error(lambda: hvd.broadcast_optimizer_state(built, root_rank=0), ValueError,
                 "4 param groups", f"rank {last} 2", what="another number of param groups")
    hvd.broadcast_optimizer_state(torch.optim.SGD(layers.parameters(), lr=0.1), root_rank=0)
    # What Horovod's state-creating step leaves behind, which scripts read: on a rank with
    # no state yet, zero gradients where there were none (not for a frozen parameter, and
    # a gradient already there is kept); empty sparse ones for a sparse embedding of
    # model=. No step is taken: the weights stay root's.
    model = nn.Sequential(nn.Embedding(6, 2, sparse=True), nn.Linear(2, 2), nn.Linear(2, 1))
    model[2].weight.requires_grad_(False)
    model[1].bias.grad = torch.full((2,), 7.0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    before = [p.detach().clone() for p in model.parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9,
                                                   weight_decay=0.1))
    hvd.broadcast_optimizer_state(opt, root_rank=0, model=model)
    embedding, weight, bias = model[0].weight, model[1].weight, model[1].bias
    check(embedding.grad is not None and embedding.grad.is_sparse
          and embedding.grad._nnz() == 0, f"sparse embedding's gradient: {embedding.grad}")
    check(weight.grad is not None and not weight.grad.is_sparse
          and bool((weight.grad == 0).all()), f"zero gradient: {weight.grad}")
    check(torch.equal(bias.grad, torch.full((2,), 7.0)), "an existing gradient was replaced")
    check(model[2].weight.grad is None, "a frozen parameter got a gradient")
    check(all(torch.equal(a, b) for a, b in zip(before, model.parameters())),
          "broadcast_optimizer_state changed the weights")
    check(len(opt.state_dict()["state"]) == 0, "a step created state")
    sparse_adam = torch.optim.SparseAdam([nn.Embedding(4, 2, sparse=True).weight])
    hvd.broadcast_optimizer_state(sparse_adam, root_rank=0)
    check(sparse_adam.param_groups[0]["params"][0].grad.is_sparse, "SparseAdam: not sparse")
    opt.zero_grad()


def scheduler_built_before_wrapping(rank: int, size: int) -> None:
    """An LR scheduler built on the plain optimizer, which the DistributedOptimizer wraps
    (sharing its param groups), keeps setting the lr the wrapper uses, after
    broadcast_optimizer_state and after a load_state_dict (both replaced the group dicts
    in torch's way, and the lr stayed 1.0 for good)."""
    model = make_model()
    plain = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(plain, step_size=1, gamma=0.1)
    opt = hvd.DistributedOptimizer(plain, named_parameters=model.named_parameters())
    group = opt.param_groups[0]
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    seen = []
    for step in range(3):
        if step == 2:
            opt.load_state_dict(opt.state_dict())
        x, y = (shard(t) for t in batch(step))
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        scheduler.step()
        seen.append(opt.param_groups[0]["lr"])
    check(all(abs(a - b) < 1e-12 for a, b in zip(seen, [0.1, 0.01, 0.001])),
          f"the wrapper's lr after each scheduler step: {seen}")
    check(opt.param_groups[0] is group and opt.param_groups is plain.param_groups and
          opt.state is plain.state, "param groups or state no longer shared")
    check(len(opt.state) == 4, f"momentum state lost: {len(opt.state)} entries")


class _SlowBackward(torch.autograd.Function):
    """Identity whose backward takes a while, so gradients arrive spread out in time."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        time.sleep(0.004)
        return grad


class SlowNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = _SlowBackward.apply(torch.tanh(layer(x)))
        return x


def slow_model_and_optimizer(prefix: str, cap: float) -> tuple[SlowNet, Any]:
    model = SlowNet()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=[(f"{prefix}{cap}.{n}", p) for n, p in
                                                     model.named_parameters()],
                                   bucket_cap_mb=cap)
    return model, opt


def learned_order(rank: int, size: int) -> None:
    """After the first step gradients go out bucketed in hook order: fewer cycles."""
    medians = {}
    for cap in (25.0, 0.0):
        model, opt = slow_model_and_optimizer("slow", cap)
        x = torch.randn(16, 32)
        for _ in range(8):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        stats = opt.negotiation_stats()
        later = sorted(s["cycles"] for s in stats[1:])
        medians[cap] = later[len(later) // 2]
        sys.stdout.write(f"rank {hvd.rank()} bucket_cap_mb={cap}: first step {stats[0]}, "
                         f"later cycles {[s['cycles'] for s in stats[1:]]}\n")
        check(stats[0]["slow_cycles"] >= 1, "first step negotiated nothing on the slow path")
        # The first bucketed step negotiates each bucket's name once.
        check(all(s["slow_cycles"] == 0 for s in stats[2:]), "later steps missed the cache")
        if cap:
            check(all(s["submissions"] == 1 for s in stats[1:]),
                  f"learned order did not submit one bucket per step: {stats}")
            check(medians[cap] < stats[0]["cycles"],
                  f"later steps need no fewer cycles than the first: {stats}")
    check(medians[25.0] < medians[0.0],
          f"learned order needs no fewer cycles than per-gradient submission: {medians}")


class ChainNet(nn.Module):
    """Six equal bias-free layers used in order 0..5 but registered (defined) in ``defined``
    order, so named_parameters() lists them in that order. Weights depend on the use index
    only: every definition order computes the same function. One equal-sized gradient
    per layer keeps the bucket boundaries independent of the order."""

    def __init__(self, defined: list[int]) -> None:
        super().__init__()
        self.use_order = sorted(defined)
        for index in defined:
            torch.manual_seed(100 + index)
            self.add_module(f"layer{index}", nn.Linear(32, 32, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index in self.use_order:
            x = torch.tanh(getattr(self, f"layer{index}")(x))
        return x


def learned_order_follows_use(rank: int, size: int) -> None:
    """Buckets follow the order gradients become ready, not the order layers were defined:
    a model defined in use order, in the opposite order and shuffled submits each bucket
    the moment its last gradient arrives ([2, 4, 6]: three buckets of two layers), and
    all three train to the weights of plain torch on the whole batch. Bucketing by
    definition order would submit the shuffled model's buckets late ([4, 5, 6])."""
    layer_bytes = 32 * 32 * 4
    cap_mb = 2.5 * layer_bytes / 2 ** 20  # two layers per bucket
    shards = [torch.randn(8, 32, generator=torch.Generator().manual_seed(7 + r))
              for r in range(hvd.size())]
    x, whole = shards[hvd.rank()], torch.cat(shards)  # equal shards: mean of means
    reference = ChainNet(list(range(6)))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for variant, defined in [("use", [0, 1, 2, 3, 4, 5]), ("reversed", [5, 4, 3, 2, 1, 0]),
                             ("shuffled", [0, 3, 1, 4, 2, 5])]:
        model = ChainNet(defined)
        check([n.split(".")[0] for n, _ in model.named_parameters()] ==
              [f"layer{i}" for i in defined], "definition order not as intended")
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=[(f"chain.{variant}.{n}", p) for n, p
                                                         in model.named_parameters()],
                                       bucket_cap_mb=cap_mb)
        for step in range(5):
            opt.zero_grad(set_to_none=variant != "shuffled")
            model(x).pow(2).mean().backward()
            held = {n: p.grad for n, p in model.named_parameters()}
            opt.step()
            # Every step reduces the gradients where they lie (the first step the tensors
            # autograd made, then copied into the flat buckets; later ones each bucket),
            # so the tensor held before step() holds what param.grad holds after it, and
            # from the second step on it is param.grad. (A copy taken after backward may
            # already hold the mean: a bucket is reduced as soon as its hook sends it.)
            after = {n: p.grad for n, p in model.named_parameters()}
            check(all(torch.equal(held[n], after[n]) for n in held),
                  f"{variant}, step {step}: a gradient held across step() is not the mean")
            check(step == 0 or all(held[n] is after[n] for n in held),
                  f"{variant}, step {step}: a gradient changed identity across step()")
        stats = opt.negotiation_stats()
        check(stats[0]["submitted_after"] == list(range(1, 7)),
              f"{variant}: the first step should submit each gradient on arrival: {stats[0]}")
        for s in stats[1:]:
            check(s["gradients"] == 6 and s["submitted_after"] == [2, 4, 6],
                  f"{variant} (defined {defined}): buckets do not follow use order: {s}")
        if variant == "use":
            for _ in range(5):
                ref_opt.zero_grad()
                reference(whole).pow(2).mean().backward()
                ref_opt.step()
        for index in range(6):
            ours, theirs = getattr(model, f"layer{index}"), getattr(reference, f"layer{index}")
            close(ours.weight, theirs.weight,
                  f"{variant}: layer{index} against plain torch on the whole batch", 1e-5,
                  atol=1e-6)


def overlap_with_backward(rank: int, size: int) -> None:
    """Reductions run while backward is still computing: with per-gradient submission
    (bucket_cap_mb=0), and with learned buckets of two layers each, gradients of the
    last layers are already reduced by the time loss.backward() returns, before step()."""
    layer_mb = (32 * 32 + 32) * 4 / 2 ** 20
    for cap in (0.0, 2.5 * layer_mb):
        model, opt = slow_model_and_optimizer("overlap", cap)
        x = torch.randn(16, 32)
        finished_early, submitted = [], []
        for _ in range(4):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            handles = [pending.wait for pending in opt._horovodish.reducer.pending]
            finished_early.append(sum(mpi_ops.poll(h) for h in handles))
            submitted.append(len(handles))
            opt.step()
        sys.stdout.write(f"rank {hvd.rank()} bucket_cap_mb={cap:.4f}: submissions done when "
                         f"backward returned: {finished_early} of {submitted}\n")
        check(max(finished_early[1:]) >= (2 if cap == 0 else 1),
              f"bucket_cap_mb={cap}: no reduction finished during backward: {finished_early}")
        if cap:
            check(all(n >= 3 for n in submitted[1:]), f"expected several buckets: {submitted}")


class Switchable(nn.Module):
    """Four 6-wide layers: branches ``a`` and ``b`` (unless skipped) side by side on the
    input, ``c`` on their sum, and ``d`` on top only when used. ``swap`` computes ``b``
    before ``a``, which reverses the order their gradients arrive in (autograd runs the
    later-made nodes first)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.a, self.b, self.c, self.d = (nn.Linear(6, 6) for _ in range(4))

    def forward(self, x: torch.Tensor, use_b: bool = True, use_d: bool = False,
                swap: bool = False) -> torch.Tensor:
        if swap:
            g = torch.tanh(self.b(x))
            h = torch.tanh(self.a(x)) + g
        else:
            h = torch.tanh(self.a(x))
            h = h + torch.tanh(self.b(x)) if use_b else h
        h = self.c(h)
        return self.d(h) if use_d else h


def switchable_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2000 + step)
    return torch.randn(BATCH, 6, generator=gen), torch.randn(BATCH, 6, generator=gen)


def run_switchable(schedule: Callable[[int], dict], steps: int, cap_mb: float,
                   zero: Callable[[nn.Module, Any], None] | None = None
                   ) -> tuple[nn.Module, Any, nn.Module]:
    """Our optimizer and plain torch on the whole batch, both SGD with momentum, through
    the same schedule of which layers are used. A parameter without a gradient on every
    rank is reduced as zeros (Horovod's rule), so the reference steps it with zeros."""
    model, want = Switchable(), Switchable()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   bucket_cap_mb=cap_mb)
    want_opt = torch.optim.SGD(want.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = switchable_batch(step)
        use = schedule(step)
        (zero or (lambda m, o: o.zero_grad()))(model, opt)
        F.mse_loss(model(shard(x), **use), shard(y)).backward()
        opt.step()
        want_opt.zero_grad()
        size = hvd.size()
        (sum(F.mse_loss(want(shard(x, r), **use), shard(y, r)) for r in range(size))
         / size).backward()
        for param in want.parameters():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        want_opt.step()
    return model, opt, want


def one_layer_a_bucket() -> float:
    return 1.5 * (6 * 6 + 6) * 4 / 2 ** 20  # a layer's weight and bias, not two layers


def flat_bucket_views(rank: int, size: int) -> None:
    """From the second step on, every gradient is a view of its flat bucket: the same
    tensor across steps, reduced in place, with no copy, pack or concatenation of a
    tensor while synchronize() runs, one submission per bucket, each sent by its hook.
    zero_grad(), with or without set_to_none, zeroes the buckets and keeps the views."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    model, want = Switchable(), Switchable()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   bucket_cap_mb=one_layer_a_bucket())
    want_opt = torch.optim.SGD(want.parameters(), lr=0.1, momentum=0.9)
    first: dict[str, torch.Tensor] = {}
    for step in range(6):
        x, y = switchable_batch(step)
        opt.zero_grad(set_to_none=step % 2 == 0)
        if step > 1:
            check(all(p.grad is first[n] and not p.grad.any()
                      for n, p in model.named_parameters()),
                  f"step {step}: zero_grad() did not zero the bucket views in place")
        F.mse_loss(model(shard(x), use_d=True), shard(y)).backward()
        ops = Ops()
        with ops:
            opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
        want_opt.zero_grad()
        (sum(F.mse_loss(want(shard(x, r), use_d=True), shard(y, r)) for r in range(size))
         / size).backward()
        want_opt.step()
        if step == 0:
            continue
        flats = [bucket.flat for bucket in opt._horovodish.reducer.flat]
        check(len(flats) == 4, f"expected a flat bucket per layer, got {len(flats)}")
        for name, param in model.named_parameters():
            check(any(param.grad.untyped_storage().data_ptr() == flat.data_ptr()
                      for flat in flats), f"step {step}: {name}.grad is not a bucket view")
            if step == 1:
                first[name] = param.grad
            check(param.grad is first[name], f"step {step}: {name}.grad changed identity")
            close(param.grad, dict(want.named_parameters())[name].grad,
                  f"step {step}: {name}.grad against plain torch", 1e-5, atol=1e-7)
        copies = [op for op in ops.seen if "copy" in op or "cat" in op or "clone" in op]
        staged = os.environ.get("STAGE_THROUGH_HOST")  # a CUDA tensor's host copies
        check(not copies or staged, f"step {step}: synchronize() copied tensors: {copies}")
        stats = opt.negotiation_stats()[-1]
        check(stats["submissions"] == 4 and stats["buckets_at_synchronize"] == 0,
              f"step {step}: one submission per bucket, each by its hook: {stats}")
    same_weights(model, want, 1e-5, "flat buckets")


def changed_graph(rank: int, size: int) -> None:
    """A parameter that stops getting gradients at step 5 (layer b, skipped) and comes
    back at step 8, and one that starts at step 5 (layer d, unused before): every step
    equals plain torch on the whole batch; a bucket that cannot be complete at its hook
    is sent by synchronize(), and once the graph is stable again hooks send them all."""
    schedule = lambda s: {"use_b": not 5 <= s < 8, "use_d": s >= 5}  # noqa: E731
    model, opt, want = run_switchable(schedule, 12, one_layer_a_bucket())
    same_weights(model, want, 1e-5, "b stops at step 5 and returns at 8, d starts at 5")
    late = [s["buckets_at_synchronize"] for s in opt.negotiation_stats()]
    check(late[1:5] == [1, 1, 1, 1] and late[5] >= 1 and late[-1] == 0,
          f"buckets sent by synchronize() per step: {late} (d's bucket until step 5, "
          "then b's while it is skipped, none at the end)")


def reordered_backward(rank: int, size: int) -> None:
    """Gradients that arrive in a new order from step 4 on (two branches summed the
    other way round): the buckets whose trigger now comes early are sent by
    synchronize() at step 4, the next step watches the new order with a hook per
    parameter, and from then on one hook per bucket sends each again; weights equal
    plain torch's throughout. model.zero_grad() (gradients set to None, so autograd
    makes new tensors that are no views) costs a copy into the bucket and nothing else."""
    schedule = lambda s: {"swap": s >= 4, "use_d": True}  # noqa: E731
    cap = 4 * one_layer_a_bucket()  # every layer in one bucket
    model, opt, want = run_switchable(schedule, 9, cap)
    same_weights(model, want, 1e-5, "order of backward reversed at step 4")
    late = [s["buckets_at_synchronize"] for s in opt.negotiation_stats()]
    check(late[4] >= 1 and late[6:] == [0, 0, 0],
          f"buckets sent by synchronize() per step: {late}")
    model, opt, want = run_switchable(lambda s: {"use_d": True}, 5, cap,
                                      zero=lambda m, o: m.zero_grad(set_to_none=True))
    same_weights(model, want, 1e-5, "model.zero_grad() instead of optimizer.zero_grad()")
    late = [s["buckets_at_synchronize"] for s in opt.negotiation_stats()]
    check(late[1:] == [0, 0, 0, 0], f"model.zero_grad(): buckets sent late {late}")
    flats = [bucket.flat for bucket in opt._horovodish.reducer.flat]
    check(all(any(p.grad.untyped_storage().data_ptr() == f.data_ptr() for f in flats)
              for p in model.parameters()), "model.zero_grad(): gradients are no views")


def backward_twice_before_step(rank: int, size: int) -> None:
    """A second backward pass before step() adds into a bucket whose allreduce is
    running: it raises at the bucket's hook, naming a parameter, synchronize() then
    refuses the bucket it changed (every rank alike: each rank raises), and the next
    steps are right."""
    model, want = Switchable(), Switchable()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    want_opt = torch.optim.SGD(want.parameters(), lr=0.1)
    for step in range(4):
        x, y = switchable_batch(step)
        opt.zero_grad()
        F.mse_loss(model(shard(x), use_d=True), shard(y)).backward()
        if step == 2:
            expect_error(lambda: F.mse_loss(model(shard(x), use_d=True), shard(y)).backward(),
                         AssertionError, "computed more than backward_passes_per_step=1",
                         what="second backward before step()")
            expect_error(opt.synchronize, RuntimeError, "changed while the bucket was being "
                         "reduced", what="synchronize() after a second backward")
            continue
        opt.step()
        want_opt.zero_grad()
        (sum(F.mse_loss(want(shard(x, r), use_d=True), shard(y, r)) for r in range(size))
         / size).backward()
        want_opt.step()
    same_weights(model, want, 1e-5, "after a refused second backward")


CHECKS = [equivalence, gradient_identity, branch_on_one_rank, sparse, sparse_adam,
          sparse_on_some_ranks_in_the_first_step, join_before_the_first_step,
          parameter_order_differs_between_ranks, rebuilt_optimizer_on_one_rank, muon,
          errors, parameter_names, one_runtime_attribute, untracked_parameters,
          broadcast_optimizer_state,
          scheduler_built_before_wrapping, learned_order, learned_order_follows_use,
          overlap_with_backward, flat_bucket_views, changed_graph, reordered_backward,
          backward_twice_before_step]
