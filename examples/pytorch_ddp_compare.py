"""Training speed: horovodish's DistributedOptimizer against torch DDP (gloo), one job.

    horovodishrun -np 2 python examples/pytorch_ddp_compare.py

Both train the same MLP (784-1024-1024-1024-10, batch 64 per rank, SGD) from the same
weights on the same data, in alternating rounds so that neither gets a quieter machine.
DDP runs on torch.distributed's gloo backend over 127.0.0.1 (its CPU backend); world
size and rank come from horovodish. Prints steps/s of each (median over rounds), the
ratio (the median of per-round ratios), and how far the two models' weights ended apart
(they do identical updates).

    horovodishrun -np 2 python examples/pytorch_ddp_compare.py \
        --definition-order reversed --bucket-cap-mb 4

registers the layers in the opposite order of use: DDP buckets by reversed definition
order, so its first bucket then holds the gradients that are ready last; our buckets
follow the order learned on the first step, so the rate should not change.
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


class MLP(nn.Module):
    """784-1024-1024-1024-10 with ReLU. ``reversed_definition`` registers the layers in
    the opposite order of use (same weights, same function): named_parameters() then
    lists the last layer first, which is what bucketing by definition order gets wrong."""

    def __init__(self, reversed_definition: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        layers = [nn.Linear(784, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 1024),
                  nn.Linear(1024, 10)]
        self.use_order = [f"fc{i}" for i in range(len(layers))]
        for name, layer in (reversed if reversed_definition else iter)(
                list(zip(self.use_order, layers))):
            self.add_module(name, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.use_order[:-1]:
            x = F.relu(getattr(self, name)(x))
        return getattr(self, self.use_order[-1])(x)


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
                        help="bucket cap of both: DDP's, and DistributedOptimizer's "
                             "learned-order buckets (0: ours off, DDP's default)")
    parser.add_argument("--definition-order", choices=["use", "reversed", "both"],
                        default="use", help="register the layers in the order of use, the "
                        "opposite, or train both variants side by side")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads per rank (default: cores / ranks per host)")
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // hvd.local_size()))
    init_gloo()
    orders = ["use", "reversed"] if args.definition_order == "both" else [args.definition_order]
    contenders = []  # (key, model, optimizer), alternating DDP and ours per order
    for order in orders:
        # The same bucket cap for both (DDP's own default is 25 MB too).
        ddp_model = DistributedDataParallel(MLP(order == "reversed"),
                                            bucket_cap_mb=args.bucket_cap_mb or 25.0)
        contenders.append((f"ddp/{order}", ddp_model,
                           torch.optim.SGD(ddp_model.parameters(), lr=0.01)))
        hvd_model = MLP(order == "reversed")
        hvd_opt = hvd.DistributedOptimizer(
            torch.optim.SGD(hvd_model.parameters(), lr=0.01),
            named_parameters=[(f"{order}.{n}", p) for n, p in hvd_model.named_parameters()],
            bucket_cap_mb=args.bucket_cap_mb)
        contenders.append((f"horovodish/{order}", hvd_model, hvd_opt))
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

    for _, model, optimizer in contenders:
        run(model, optimizer, args.warmup)
    rates: dict[str, list[float]] = {key: [] for key, _, _ in contenders}
    for round_ in range(args.rounds):
        for key, model, optimizer in contenders[::1 if round_ % 2 == 0 else -1]:
            rates[key].append(run(model, optimizer, args.steps))
    with torch.no_grad():
        drift = max(float((a - b).abs().max())
                    for (_, ddp_model, _), (_, hvd_model, _) in zip(contenders[::2],
                                                                    contenders[1::2])
                    for a, b in zip(ddp_model.module.parameters(), hvd_model.parameters()))
    if hvd.rank() == 0:
        print(f"ranks: {hvd.size()}, threads per rank: {torch.get_num_threads()}, "
              f"batch {args.batch_size} per rank, bucket_cap_mb {args.bucket_cap_mb}",
              flush=True)
        for key, values in rates.items():
            label = ("DDP (gloo)" if key.startswith("ddp") else "horovodish (optimizer)") + \
                f", layers defined in {key.split('/')[1]} order:"
            print(f"{label:58s} {statistics.median(values):7.1f} steps/s  "
                  f"rounds {[round(r, 1) for r in values]}", flush=True)

        def ratio(a: str, b: str) -> float:
            """Median of per-round ratios: each round times every contender back to back,
            so this is robust to the machine speeding up or slowing down between rounds."""
            return statistics.median(x / y for x, y in zip(rates[a], rates[b]))
        for order in orders:
            print(f"ratio horovodish / DDP ({order} order): "
                  f"{ratio(f'horovodish/{order}', f'ddp/{order}'):.2f}x", flush=True)
        if len(orders) == 2:
            for who in ("horovodish", "ddp"):
                print(f"{who}: reversed / use definition order: "
                      f"{ratio(f'{who}/reversed', f'{who}/use'):.2f}x", flush=True)
        print(f"largest weight difference between DDP and horovodish: {drift:.2e} "
              "(identical updates)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
