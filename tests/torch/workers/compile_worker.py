"""DistributedOptimizer with torch.compile on real ranks: compiled models end on the eager
model's weights (inductor's default and reduce-overhead modes, the bucketed backend, the
sharded optimizer); with hvd.compile_backend reductions finish while the compiled
backward still runs; collectives inside compiled functions run eagerly, or fail under
fullgraph=True with dynamo's error naming them."""
from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from worker_support import check, close, expect_error, run_checks  # noqa: E402

import horovodish.torch as hvd  # noqa: E402
from horovodish.torch import mpi_ops  # noqa: E402

BATCH = 12
STEPS = 10


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()


def train(compile_kwargs: dict[str, Any] | None, **opt_kwargs: Any) -> nn.Module:
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(), **opt_kwargs)
    run = torch.compile(model, **compile_kwargs) if compile_kwargs is not None else model
    per = BATCH // hvd.size()
    mine = slice(hvd.rank() * per, (hvd.rank() + 1) * per)
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(BATCH, 5, generator=gen, dtype=torch.float64)
        y = torch.randn(BATCH, 3, generator=gen, dtype=torch.float64)
        opt.zero_grad()
        F.mse_loss(run(x[mine]), y[mine]).backward()
        opt.step()
    return model


def compiled_equals_eager(rank: int, size: int) -> None:
    eager = train(None)
    # Inductor needs a C++ compiler; without one the test says so and uses aot_eager.
    inductor = {} if os.environ.get("COMPILE_BACKEND", "inductor") == "inductor" \
        else {"backend": "aot_eager"}
    for what, compile_kwargs, opt_kwargs in (
            ("inductor", inductor, {}),
            ("inductor, mode=reduce-overhead", dict(inductor, mode="reduce-overhead")
             if not inductor else inductor, {}),
            ("compile_backend(aot_eager)", {"backend": hvd.compile_backend(
                bucket_cap_mb=0.0002, backend="aot_eager")}, {}),
            ("inductor, sharded optimizer", inductor, {"shard_optimizer_state": True})):
        compiled = train(compile_kwargs, **opt_kwargs)
        for (name, got), want in zip(compiled.named_parameters(), eager.parameters()):
            close(got, want, f"{what}: {name}", 1e-9)


@torch.library.custom_op("hvdtest::pause", mutates_args=())
def pause(x: torch.Tensor) -> torch.Tensor:
    """x, after 4 ms of sleep: a slow layer that leaves the CPU to the runtime threads
    (as the eager overlap test's), and that a compiled graph calls as it is."""
    time.sleep(0.004)
    return x.clone()


@pause.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


pause.register_autograd(lambda ctx, grad: pause(grad))


def overlap_with_compiled_backward(rank: int, size: int) -> None:
    """Eight layers whose backward takes 4 ms each; the bucketed backend cuts the graph
    at each layer, so the last layers' reductions finish before backward returns (with
    the whole model in one graph every gradient is final only at its end)."""
    width, layers = 32, 8
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh(), Pause())
                            for _ in range(layers)]).double()
    layer_mb = (width * width + width) * 8 / 2 ** 20
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.001),
                                   named_parameters=model.named_parameters(),
                                   bucket_cap_mb=1.1 * layer_mb)
    run = torch.compile(model, backend=hvd.compile_backend(bucket_cap_mb=1.1 * layer_mb,
                                                           backend="aot_eager"))
    x = torch.randn(16, width, dtype=torch.float64)
    finished, submitted = [], []
    for _ in range(5):
        opt.zero_grad()
        run(x).pow(2).mean().backward()
        handles = [pending.wait for pending in opt._horovodish.reducer.pending]
        finished.append(sum(mpi_ops.poll(h) for h in handles))
        submitted.append(len(handles))
        opt.step()
    sys.stdout.write(f"rank {rank}: reductions done when the compiled backward returned: "
                     f"{finished} of {submitted}\n")
    check(max(finished[2:]) >= 2, f"no reduction finished during backward: {finished}")
    check(all(n == layers for n in submitted[2:]), f"expected a bucket a layer: {submitted}")


class Pause(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return pause(x)


def collectives_inside_compiled_functions(rank: int, size: int) -> None:
    def reduce_twice(x: torch.Tensor) -> torch.Tensor:
        y = hvd.allreduce(x * 2, name="compiled.sum", op=hvd.Sum)
        handle = hvd.allreduce_async(y + 1, name="compiled.async", op=hvd.Average)
        return hvd.synchronize(handle) * 3

    x = torch.full((3,), float(rank + 1))
    want = (2 * sum(range(1, size + 1)) + 1) * 3
    close(torch.compile(reduce_twice, backend="aot_eager")(x), torch.full((3,), float(want)),
          "collectives in a compiled function (graph breaks)")
    counters = torch._dynamo.utils.counters["graph_break"]
    check(all("horovodish" in reason or "skipped" in reason for reason in counters),
          f"breaks elsewhere than at the collectives: {list(counters)}")

    def in_full_graph(x: torch.Tensor) -> torch.Tensor:
        return hvd.allreduce(x, name="compiled.full")
    expect_error(lambda: torch.compile(in_full_graph, backend="aot_eager",
                                       fullgraph=True)(x),
                 Exception, "allreduce", "skipped", what="fullgraph=True")
    # SyncBatchNorm inside a compiled model: its collectives run eagerly
    torch.manual_seed(0)
    bn = hvd.SyncBatchNorm(4).double()
    data = torch.randn(2 * size, 4, dtype=torch.float64)
    out = torch.compile(bn, backend="aot_eager")(data[2 * rank:2 * rank + 2])
    reference = nn.BatchNorm1d(4).double()(data)[2 * rank:2 * rank + 2]
    close(out, reference, "SyncBatchNorm in a compiled model", 1e-9)


if __name__ == "__main__":
    hvd.init()
    torch.set_num_threads(1)
    import torch._inductor.config as inductor_config
    inductor_config.compile_threads = 1  # no compile worker pool on 2 shared cores
    checks = [compiled_equals_eager, overlap_with_compiled_backward,
              collectives_inside_compiled_functions]
    chosen = sys.argv[1:]
    run_checks([c for c in checks if not chosen or c.__name__ in chosen], hvd.rank(),
               hvd.size())
