"""Training speed: horovodish's DistributedOptimizer against torch DDP (gloo), one job.

    horovodishrun -np 2 python examples/pytorch_ddp_compare.py

Both train the same MLP (784-1024-1024-1024-10, batch 64 per rank, SGD) from the same
weights on the same data, in alternating rounds so that neither gets a quieter machine.
DDP runs on torch.distributed's gloo backend over 127.0.0.1 (its CPU backend); world
size and rank come from horovodish. Prints steps/s of each (median over rounds), the
ratio (the median of per-round ratios), and how far the two models' weights ended apart
(they do identical updates).
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import horovodish.torch as hvd


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_gloo() -> None:
    port = hvd.broadcast_object(free_port() if hvd.rank() == 0 else None, root_rank=0)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=hvd.rank(), world_size=hvd.size())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--steps", type=int, default=15, help="per round and contender")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0,
                        help="DistributedOptimizer's learned-order bucket cap (0: off)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads per rank (default: cores / ranks per host)")
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // hvd.local_size()))
    init_gloo()
    ddp_model = DistributedDataParallel(mlp())
    ddp_opt = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    hvd_model = mlp()
    hvd_opt = hvd.DistributedOptimizer(torch.optim.SGD(hvd_model.parameters(), lr=0.01),
                                       named_parameters=hvd_model.named_parameters(),
                                       bucket_cap_mb=args.bucket_cap_mb)
    gen = torch.Generator().manual_seed(1 + hvd.rank())
    data = torch.randn(args.batch_size, 784, generator=gen)
    target = torch.randint(0, 10, (args.batch_size,), generator=gen)

    def run(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> float:
        """Steps per second, measured between two barriers so all ranks agree."""
        hvd.barrier()
        started = time.perf_counter()
        for _ in range(steps):
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()
        hvd.barrier()
        return steps / (time.perf_counter() - started)

    run(ddp_model, ddp_opt, args.warmup)
    run(hvd_model, hvd_opt, args.warmup)
    rates: dict[str, list[float]] = {"ddp": [], "horovodish": []}
    for round_ in range(args.rounds):
        contenders = [("ddp", ddp_model, ddp_opt), ("horovodish", hvd_model, hvd_opt)]
        for key, model, optimizer in contenders[::1 if round_ % 2 == 0 else -1]:
            rates[key].append(run(model, optimizer, args.steps))
    with torch.no_grad():
        drift = max(float((a - b).abs().max()) for a, b in
                    zip(ddp_model.module.parameters(), hvd_model.parameters()))
    if hvd.rank() == 0:
        ddp, ours = statistics.median(rates["ddp"]), statistics.median(rates["horovodish"])
        print(f"ranks: {hvd.size()}, threads per rank: {torch.get_num_threads()}, "
              f"batch {args.batch_size} per rank", flush=True)
        print(f"DDP (gloo):             {ddp:7.1f} steps/s  "
              f"rounds {[round(r, 1) for r in rates['ddp']]}", flush=True)
        print(f"horovodish (optimizer): {ours:7.1f} steps/s  "
              f"rounds {[round(r, 1) for r in rates['horovodish']]}", flush=True)
        # Each round times both back to back: the median of per-round ratios is robust
        # to the machine speeding up or slowing down between rounds.
        ratio = statistics.median(a / b for a, b in zip(rates["horovodish"], rates["ddp"]))
        print(f"ratio horovodish / DDP: {ratio:.2f}x (median of per-round ratios); "
              f"largest weight difference between the two models: {drift:.2e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
