"""Sharded optimizer state (DistributedOptimizer(shard_optimizer_state=True)) on real ranks.

The reference for every training check is plain torch in this process on the whole
batch (the data is a pure function of the step), and the replicated DistributedOptimizer
on the same shards: after 20 float64 steps the sharded model must match both to 1e-6.
The model's sizes do not divide by 2, 3 or 4 ranks, and with one parameter per bucket
the last bias (3 values) leaves an empty shard on a fourth rank.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from worker_support import check, close, expect_error, run_checks  # noqa: E402

import horovodish.torch as hvd  # noqa: E402
from horovodish.torch import mpi_ops  # noqa: E402
from horovodish.torch.zero_state import state_bytes  # noqa: E402

BATCH = 24  # divisible by 1 to 4 ranks and by 2 micro-batches on each
STEPS = 20
TOL = 1e-6
# bucket_cap_mb values: 0 (a bucket a parameter: uneven and empty shards) and the default
CAPS = [float(c) for c in os.environ.get("ZERO_BUCKET_CAPS", "0,25").split(",")]

OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd_momentum": lambda groups: torch.optim.SGD(groups, lr=0.05, momentum=0.9),
    "adam": lambda groups: torch.optim.Adam(groups, lr=0.01),
    "adamw": lambda groups: torch.optim.AdamW(groups, lr=0.01, weight_decay=0.1),
    "adagrad": lambda groups: torch.optim.Adagrad(groups, lr=0.05),
}


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()


def groups_of(model: nn.Module) -> list[dict[str, Any]]:
    """Two param groups with their own hyper-parameters."""
    return [{"params": list(model[0].parameters())},
            {"params": list(model[2].parameters()), "lr": 0.02, "weight_decay": 0.01}]


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    return (torch.randn(BATCH, 5, generator=gen, dtype=torch.float64),
            torch.randn(BATCH, 3, generator=gen, dtype=torch.float64))


def mine(t: torch.Tensor) -> torch.Tensor:
    per = t.shape[0] // hvd.size()
    return t[hvd.rank() * per:(hvd.rank() + 1) * per]


def reference(make_opt: Callable, steps: int, clip: float | None = None,
              model: nn.Module | None = None, opt: Any = None,
              first: int = 0) -> tuple[nn.Module, Any]:
    """Plain torch, one process, the whole batch."""
    model = model or make_model()
    opt = opt or make_opt(groups_of(model))
    for step in range(first, first + steps):
        x, y = batch(step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return model, opt


def distributed(make_opt: Callable, steps: int, passes: int = 1, clip: float | None = None,
                first: int = 0, model: nn.Module | None = None, opt: Any = None,
                torch_clip: bool = False, **kwargs: Any) -> tuple[nn.Module, Any]:
    """N ranks on 1/N of the batch each; non-root ranks start from other weights and
    get root's by broadcast (after the optimizer moved the parameters into flat
    buckets)."""
    if model is None:
        model = make_model(seed=hvd.rank())
        opt = hvd.DistributedOptimizer(make_opt(groups_of(model)),
                                       named_parameters=model.named_parameters(),
                                       backward_passes_per_step=passes, **kwargs)
        root = make_model(seed=0)
        if hvd.rank() == 0:
            check(all(torch.equal(a, b) for a, b in zip(model.parameters(),
                                                        root.parameters())), "root's start")
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    for step in range(first, first + steps):
        x, y = (mine(t) for t in batch(step))
        opt.zero_grad()
        for xs, ys in zip(x.chunk(passes), y.chunk(passes)):
            (F.mse_loss(model(xs), ys) / passes).backward()
        if clip is not None:
            opt.synchronize()
            if torch_clip:  # param.grad holds the averaged gradients
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            else:
                opt.clip_grad_norm_(clip)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    return model, opt


def same_weights(model: nn.Module, want: nn.Module, what: str, tol: float = TOL) -> None:
    for (name, got), expected in zip(model.named_parameters(), want.parameters()):
        close(got, expected, f"{what}: {name}", tol)


def sharded_matches_replicated(rank: int, size: int) -> None:
    """Each optimizer, two param groups, one parameter per bucket (an empty shard on 4
    ranks) and the default 25 MB buckets (one bucket per group)."""
    for name, make_opt in OPTIMIZERS.items():
        want, _ = reference(make_opt, STEPS)
        replicated, _ = distributed(make_opt, STEPS)
        same_weights(replicated, want, f"{name} replicated")
        for cap in CAPS:
            sharded, opt = distributed(make_opt, STEPS, shard_optimizer_state=True,
                                       bucket_cap_mb=cap)
            check(len(opt._horovodish.buckets) == (4 if cap == 0 else 2),
                  f"{name}: {len(opt._horovodish.buckets)} buckets")
            same_weights(sharded, want, f"{name} sharded, bucket_cap_mb={cap}")
            same_weights(sharded, replicated, f"{name} sharded vs replicated, cap={cap}")


def stage_one_accumulation_and_clipping(rank: int, size: int) -> None:
    """Stage 1 (param.grad is the averaged gradient), backward_passes_per_step=2, global
    norm clipping across shards, Sum with a loss scaled for it, predivide."""
    adam = OPTIMIZERS["adam"]
    want, _ = reference(adam, STEPS)
    model, opt = distributed(adam, STEPS, shard_optimizer_state=True, zero_stage=1)
    same_weights(model, want, "stage 1")
    check(all(p.grad is not None for p in model.parameters()), "stage 1 keeps param.grad")
    model, _ = distributed(adam, STEPS, passes=2, shard_optimizer_state=True)
    same_weights(model, want, "backward_passes_per_step=2")
    model, _ = distributed(adam, STEPS, shard_optimizer_state=True,
                           gradient_predivide_factor=2.0)
    same_weights(model, want, "gradient_predivide_factor=2")
    clipped, _ = reference(adam, STEPS, clip=0.05)
    for stage, torch_clip in ((1, False), (2, False), (1, True)):
        # stage 1: torch's clipping of param.grad works too (the shards are views of it)
        model, opt = distributed(adam, STEPS, clip=0.05, shard_optimizer_state=True,
                                 zero_stage=stage, bucket_cap_mb=0, torch_clip=torch_clip)
        same_weights(model, clipped, f"clipped, stage {stage}, torch's clip {torch_clip}")
    sgd = OPTIMIZERS["sgd_momentum"]
    want, _ = reference(sgd, STEPS)
    model = make_model()
    opt = hvd.DistributedOptimizer(sgd(groups_of(model)), op=hvd.Sum,
                                   named_parameters=model.named_parameters(),
                                   shard_optimizer_state=True)
    for step in range(STEPS):
        x, y = (mine(t) for t in batch(step))
        opt.zero_grad()
        (F.mse_loss(model(x), y) / size).backward()  # Sum of per-rank means / size
        opt.step()
    same_weights(model, want, "op=Sum")
    check(all(p.grad is None for p in model.parameters()), "stage 2 frees param.grad")


def state_memory(rank: int, size: int) -> None:
    """Bytes of optimizer state tensors per rank: 1/N of the replicated optimizer's
    within 5% plus one bucket."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(61, 47), nn.ReLU(), nn.Linear(47, 29), nn.ReLU(),
                          nn.Linear(29, 3))
    plain = torch.optim.Adam(nn.Sequential(nn.Linear(61, 47), nn.ReLU(), nn.Linear(47, 29),
                                           nn.ReLU(), nn.Linear(29, 3)).parameters())
    cap_mb = 0.004  # about 1000 float32 values: several buckets
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters()), shard_optimizer_state=True,
                                   named_parameters=model.named_parameters(),
                                   bucket_cap_mb=cap_mb)
    x = torch.randn(8, 61)
    for optimizer, net in ((opt, model), (plain, None)):
        if net is None:
            for p in plain.param_groups[0]["params"]:
                p.grad = torch.ones_like(p)
        else:
            optimizer.zero_grad()
            net(x).sum().backward()
        optimizer.step()
    full = state_bytes(plain.state)
    shards = sum(state_bytes(b.optimizer.state) for b in opt._horovodish.buckets
                 if b.optimizer is not None)
    check(shards == opt.shard_state_bytes(), "shard_state_bytes() counts the shards' state")
    biggest = max(sum(b.numels) for b in opt._horovodish.buckets) * 4 * 2  # exp_avg, exp_avg_sq
    sys.stdout.write(f"rank {rank}: optimizer state {shards} bytes, replicated {full} "
                     f"({shards * size / full:.3f} x 1/{size}); {len(opt._horovodish.buckets)} "
                     "buckets\n")
    check(abs(shards - full / size) <= 0.05 * full / size + biggest,
          f"state {shards} bytes, want {full / size:.0f} +- 5% + {biggest}")
    # Together the shards hold the elementwise state once; each its own scalar step.
    everyone = hvd.allreduce(torch.tensor(shards), op=hvd.Sum, name="zero.state_bytes")
    check(full - 6 * 4 <= int(everyone) <= full - 6 * 4 + 4 * len(opt._horovodish.buckets) * size,
          f"the shards hold the whole state once: {int(everyone)} bytes, plain {full}")


def state_dicts_and_broadcast(rank: int, size: int) -> None:
    """This rank's sharded state dict and the consolidated one reload into a fresh
    optimizer and continue as if uninterrupted; the consolidated one loads into a plain
    torch optimizer; root alone loads a checkpoint and broadcast_optimizer_state sends it."""
    adamw = OPTIMIZERS["adamw"]
    want, _ = reference(adamw, 2 * 10)
    model, opt = distributed(adamw, 10, shard_optimizer_state=True)  # 2 params a bucket
    sharded = opt.state_dict()
    check("zero" in sharded and sharded["zero"]["rank"] == rank, "a sharded state dict")
    full = opt.consolidate_state_dict(to=0)
    check((full is not None) == (rank == 0), "consolidated on rank 0 only")
    everywhere = opt.consolidate_state_dict(to=None)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    plain_model, plain_opt = reference(adamw, 10)
    for key, entries in plain_opt.state_dict()["state"].items():
        for field, value in entries.items():
            close(everywhere["state"][key][field], value, f"consolidated {key}.{field}", TOL)

    def resume(state: Any, only_root: bool = False) -> nn.Module:
        model = make_model(seed=rank + 7)
        opt = hvd.DistributedOptimizer(adamw(groups_of(model)), shard_optimizer_state=True,
                                       named_parameters=model.named_parameters())
        model.load_state_dict(weights)
        if not only_root or rank == 0:
            opt.load_state_dict(state)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        return distributed(adamw, 10, first=10, model=model, opt=opt)[0]

    same_weights(resume(sharded), want, "resumed from this rank's sharded state dict")
    same_weights(resume(everywhere), want, "resumed from the consolidated state dict")
    same_weights(resume(full, only_root=True), want,
                 "rank 0 loads, broadcast_optimizer_state sends")
    # the plain optimizer continues from the consolidated state on the whole batch
    plain_opt.load_state_dict(everywhere)
    plain_model.load_state_dict(weights)
    reference(adamw, 10, model=plain_model, opt=plain_opt, first=10)
    same_weights(plain_model, want, "a plain optimizer from the consolidated state")
    # the optimizer of a plain checkpoint, wrapped: its state becomes the shards'
    model, plain = reference(adamw, 10)
    opt = hvd.DistributedOptimizer(plain, shard_optimizer_state=True,
                                   named_parameters=model.named_parameters())
    check(not opt.state, "the wrapper keeps no replicated state")
    same_weights(distributed(adamw, 10, first=10, model=model, opt=opt)[0], want,
                 "wrapping an optimizer that has state")


def overlap_and_storage(rank: int, size: int) -> None:
    """Reductions finish while backward still runs (8 slow layers, one per bucket); a
    parameter whose .data is replaced is taken back into its bucket."""
    class Slow(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            time.sleep(0.004)
            return grad

    class SlowNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = Slow.apply(torch.tanh(layer(x)))
            return x

    model = SlowNet()
    layer_mb = (32 * 32 + 32) * 4 / 2 ** 20
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(),
                                   shard_optimizer_state=True, bucket_cap_mb=1.5 * layer_mb)
    x = torch.randn(16, 32)
    finished = []
    for _ in range(4):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        finished.append(sum(mpi_ops.poll(p.wait) for p in opt._horovodish.reducer.pending))
        opt.step()
    sys.stdout.write(f"rank {rank}: reduce-scatters done when backward returned: {finished} "
                     f"of {len(opt._horovodish.buckets)}\n")
    check(max(finished) >= 1, f"no reduction finished during backward: {finished}")
    # .data replaced (a script that re-initialises a layer): the new values are trained
    with torch.no_grad():
        model.layers[0].weight.data = torch.full((32, 32), 0.01)
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    weight = model.layers[0].weight
    bucket = opt._horovodish.bucket_of[weight]
    check(weight.data_ptr() == bucket.views[bucket.params.index(weight)].data_ptr(),
          "the parameter is back in its bucket")
    check(float((weight.detach() - 0.01).abs().max()) < 0.01,
          "the replaced values were the ones trained")


def deferred_parameter_gather(rank: int, size: int) -> None:
    """defer_parameter_gather: step() returns with allgathers running, each layer's
    forward waits for its own; the weights are the reference's, every gather has been
    waited for once forward is done, and a checkpoint taken in between waits too."""
    adam = OPTIMIZERS["adam"]
    want, _ = reference(adam, STEPS)
    model = make_model()
    opt = hvd.DistributedOptimizer(adam(groups_of(model)), shard_optimizer_state=True,
                                   named_parameters=model.named_parameters(),
                                   bucket_cap_mb=0)
    opt.defer_parameter_gather(model)
    running = []
    for step in range(STEPS):
        x, y = (mine(t) for t in batch(step))
        opt.zero_grad()
        out = model(x)
        check(not opt._horovodish.gathering, f"step {step}: forward left gathers running")
        F.mse_loss(out, y).backward()
        opt.step()
        running.append(sum(not mpi_ops.poll(h) for h in opt._horovodish.gathering.values()))
        if step == STEPS // 2:
            opt.state_dict()  # waits
            check(not opt._horovodish.gathering, "state_dict() did not wait for the gathers")
    sys.stdout.write(f"rank {rank}: allgathers still running when step() returned: "
                     f"{running}\n")
    check(len(opt._horovodish.gathering) == len(opt._horovodish.buckets), "step() waited for gathers")
    opt.wait_for_parameters()
    same_weights(model, want, "deferred parameter gather")


def checkpoint_dir() -> Path:
    return Path(os.environ["ZERO_CHECKPOINT_DIR"])


def checkpoint_save(rank: int, size: int) -> None:
    """Train 10 steps, save the model, the consolidated state and every rank's shards
    (loaded by checkpoint_load on another number of ranks)."""
    model, opt = distributed(OPTIMIZERS["adam"], 10, shard_optimizer_state=True,
                             bucket_cap_mb=0)
    full = opt.consolidate_state_dict(to=0)
    torch.save(opt.state_dict(), checkpoint_dir() / f"optimizer.rank{rank}.pt")
    if rank == 0:
        torch.save(model.state_dict(), checkpoint_dir() / "model.pt")
        torch.save(full, checkpoint_dir() / "optimizer.pt")
    hvd.barrier()


def checkpoint_load(rank: int, size: int) -> None:
    """Continue checkpoint_save's run (made on another number of ranks) for 10 steps from
    its consolidated state (rank 0 loads, then broadcasts) and from the list of its
    ranks' shards (every rank loads): both end on the reference's 20 steps."""
    want, _ = reference(OPTIMIZERS["adam"], 20)
    saved = sorted(checkpoint_dir().glob("optimizer.rank*.pt"))
    check(len(saved) not in (0, size), f"saved on {len(saved)} ranks, loading on {size}")
    for source in ("consolidated", "shards"):
        model = make_model(seed=rank + 3)
        opt = hvd.DistributedOptimizer(OPTIMIZERS["adam"](groups_of(model)),
                                       named_parameters=model.named_parameters(),
                                       shard_optimizer_state=True, bucket_cap_mb=0)
        if source == "shards":
            model.load_state_dict(torch.load(checkpoint_dir() / "model.pt"))
            opt.load_state_dict([torch.load(path) for path in saved])
        elif rank == 0:
            model.load_state_dict(torch.load(checkpoint_dir() / "model.pt"))
            opt.load_state_dict(torch.load(checkpoint_dir() / "optimizer.pt"))
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        model, _ = distributed(OPTIMIZERS["adam"], 10, first=10, model=model, opt=opt)
        same_weights(model, want, f"saved on {len(saved)} ranks, loaded on {size} from "
                                  f"the {source} state")


def errors(rank: int, size: int) -> None:
    model = make_model()
    refused = [torch.optim.LBFGS(model.parameters())]
    if hasattr(torch.optim, "Adafactor"):  # torch 2.5
        refused.append(torch.optim.Adafactor(model.parameters()))
    for opt, needle in ((opt, "elementwise") for opt in refused):
        expect_error(lambda: hvd.DistributedOptimizer(opt, shard_optimizer_state=True),
                     ValueError, needle, what=type(opt).__name__)
    expect_error(lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1),
                                                  shard_optimizer_state=True, groups=2),
                 ValueError, "bucket_cap_mb", what="groups")
    expect_error(lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1),
                                                  shard_optimizer_state=True, op=hvd.Adasum),
                 ValueError, "Average or Sum", what="Adasum")
    expect_error(lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1),
                                                  zero_stage=1), ValueError,
                 "shard_optimizer_state", what="zero_stage alone")
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   shard_optimizer_state=True)
    F.mse_loss(model(mine(batch(0)[0])), mine(batch(0)[1])).backward()
    expect_error(opt.zero_grad, AssertionError, "before optimizer.step()", what="zero_grad")
    expect_error(lambda: opt.clip_grad_norm_(1.0), RuntimeError, "synchronize()",
                 what="clip before synchronize")
    opt.step()
    if size > 1:
        other = dict(opt.state_dict())
        other["zero"] = dict(other["zero"], rank=(rank + 1) % size)
        expect_error(lambda: opt.load_state_dict(other), ValueError,
                     "list of every rank's sharded state dicts", what="another rank's shards")


if __name__ == "__main__":
    hvd.init()
    torch.set_num_threads(1)
    checks = [sharded_matches_replicated, stage_one_accumulation_and_clipping,
              state_memory, state_dicts_and_broadcast, overlap_and_storage,
              deferred_parameter_gather, errors,
              checkpoint_save, checkpoint_load]
    chosen = sys.argv[1:]  # names of the checks to run (default: all)
    run_checks([c for c in checks if not chosen or c.__name__ in chosen], hvd.rank(),
               hvd.size())
