"""Sharded optimizer state against replicated, torch's ZeroRedundancyOptimizer, and
torch.compile, side by side in one job:

    horovodishrun -np 2 python examples/pytorch_zero_compare.py

Contenders, all Adam on the same ~25M-parameter MLP (1024-4096-4096-1024-10, batch 32
per rank) from the same weights on the same data:

* ``replicated``: ``hvd.DistributedOptimizer`` (every rank holds all of Adam's state);
* ``sharded``: ``hvd.DistributedOptimizer(shard_optimizer_state=True)`` (ZeRO stage 2);
* ``sharded-lazy``: the same with ``defer_parameter_gather(model)`` (each layer's
  forward waits for its own updated parameters, so allgathers overlap the forward);
* ``torch-zero``: torch's ``DistributedDataParallel`` on gloo with
  ``torch.distributed.optim.ZeroRedundancyOptimizer`` (torch's ZeRO stage 1);
* ``compiled`` (with ``--compile``): ``replicated`` on ``torch.compile(model)``.

First each contender alone, in a fresh state, runs a few steps while the resident memory
of the process is sampled (after forward, backward and the step): its peak increase
over the memory before it was built is what that contender costs a rank. Then all are
built and timed in alternating rounds (the order reversed every other round, so none
gets a quieter machine); printed: median step time, range over rounds, and the median
of per-round ratios to ``replicated``.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import os
import socket
import statistics
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import horovodish.torch as hvd

WIDTHS = [1024, 4096, 4096, 1024, 10]


def make_mlp(widths: list[int] = WIDTHS) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(widths) - 2 else [])
    return nn.Sequential(*layers)


def init_gloo() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    port = hvd.broadcast_object(port if hvd.rank() == 0 else None, root_rank=0)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=hvd.rank(), world_size=hvd.size())


def build(kind: str, lr: float, widths: list[int]) -> tuple[nn.Module, Callable[[], Any], Any]:
    """(model to read weights from, callable to run forward on, optimizer)."""
    model = make_mlp(widths)
    if kind == "torch-zero":
        ddp = DistributedDataParallel(model)
        return model, ddp, ZeroRedundancyOptimizer(ddp.parameters(),
                                                   optimizer_class=torch.optim.Adam, lr=lr)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=lr),
                                   named_parameters=[(f"{kind}.{n}", p)
                                                     for n, p in model.named_parameters()],
                                   shard_optimizer_state=kind.startswith("sharded"))
    if kind == "sharded-lazy":
        opt.defer_parameter_gather(model)
    forward = torch.compile(model) if kind == "compiled" else model
    return model, forward, opt


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def release() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # give freed heap pages back
    except OSError:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--steps", type=int, default=3, help="per round and contender")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--compile", action="store_true",
                        help="also time replicated on torch.compile(model)")
    parser.add_argument("--widths", default=",".join(map(str, WIDTHS)),
                        help="the MLP's layer widths")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads per rank (default: cores / ranks per host)")
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]

    hvd.init()
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // hvd.local_size()))
    init_gloo()
    kinds = ["replicated", "sharded", "torch-zero", "sharded-lazy"] + (
        ["compiled"] if args.compile else [])
    gen = torch.Generator().manual_seed(1 + hvd.rank())
    data = torch.randn(args.batch_size, widths[0], generator=gen)
    target = torch.randint(0, widths[-1], (args.batch_size,), generator=gen)

    def step(forward: Any, optimizer: Any, sample: Callable[[], None] = lambda: None) -> None:
        optimizer.zero_grad()
        loss = F.cross_entropy(forward(data), target)
        sample()
        loss.backward()
        sample()
        optimizer.step()
        sample()

    peaks = {}
    for kind in kinds[:3]:  # memory: each alone, fresh
        release()
        before = peak = rss()

        def sample() -> None:
            nonlocal peak
            peak = max(peak, rss())
        model, forward, optimizer = build(kind, 1e-4, widths)
        for _ in range(3):
            step(forward, optimizer, sample)
        peaks[kind] = peak - before
        del model, forward, optimizer
    release()

    contenders = {kind: build(kind, 1e-4, widths) for kind in kinds}

    def run(kind: str, steps: int) -> float:
        """Seconds per step, between two barriers so that all ranks agree."""
        _, forward, optimizer = contenders[kind]
        hvd.barrier()
        started = time.perf_counter()
        for _ in range(steps):
            step(forward, optimizer)
        hvd.barrier()
        return (time.perf_counter() - started) / steps

    for kind in kinds:
        run(kind, args.warmup)
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for round_ in range(args.rounds):
        for kind in kinds[::1 if round_ % 2 == 0 else -1]:
            times[kind].append(run(kind, args.steps))
    with torch.no_grad():
        drift = max(float((a - b).abs().max()) for a, b in zip(
            contenders["replicated"][0].parameters(), contenders["sharded"][0].parameters()))
    peaks_all = hvd.allgather_object(peaks)
    if hvd.rank() == 0:
        params = sum(p.numel() for p in contenders["replicated"][0].parameters())
        print(f"ranks: {hvd.size()}, threads per rank: {torch.get_num_threads()}, "
              f"MLP {'-'.join(map(str, widths))} ({params / 1e6:.1f}M parameters), Adam, "
              f"batch {args.batch_size} per rank, {args.rounds} rounds of {args.steps} steps",
              flush=True)
        for kind in kinds:
            values = times[kind]
            ratio = statistics.median(t / r for t, r in zip(values, times["replicated"]))
            memory = "peak memory per rank " + ", ".join(
                f"{p[kind] / 2 ** 20:.0f}" for p in peaks_all) + " MiB" \
                if kind in peaks else "memory not measured"
            print(f"{kind:12s} step {statistics.median(values) * 1e3:7.1f} ms "
                  f"(rounds {min(values) * 1e3:.1f} to {max(values) * 1e3:.1f}), "
                  f"{ratio:.2f}x replicated's time; {memory}", flush=True)
        print(f"largest weight difference, replicated vs sharded: {drift:.2e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
