"""PowerSGD against exact gradient averaging: step time of DistributedOptimizer, one job.

    horovodishrun -np 4 -H h1:2,h2:2 python examples/pytorch_powersgd_compare.py

Two models start from the same weights: one averages its gradients exactly, the other
through ``hvd.powersgd_hook`` (rank ``--rank`` approximations of the weight matrices,
the rest exact). Steps alternate between them in rounds (the order reversed every
other round, so neither gets a quieter link); printed: the median step time of each,
the range over rounds, the median of per-round ratios, and the gradient bytes each
step hands to the collectives (PowerSGD's own count against the exact gradients). Made for a slow link
(the emulated 1 Gbit/s cluster of tests/cluster, docs/tuning.md), where the bytes decide.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import horovodish.torch as hvd


def make_mlp(widths: list[int]) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(widths) - 2 else [])
    return nn.Sequential(*layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="1024,2048,2048,10")
    parser.add_argument("--rank", type=int, default=4, help="PowerSGD's approximation rank")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="per round and contender")
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    widths = [int(w) for w in args.widths.split(",")]
    data = torch.randn(args.batch_size, widths[0], generator=torch.Generator().manual_seed(
        1 + hvd.rank()))
    target = torch.randint(0, widths[-1], (args.batch_size,))
    contenders = {}
    powersgd_state = hvd.PowerSGDState(matrix_approximation_rank=args.rank,
                                       start_powerSGD_iter=2)
    for key in ("exact", f"powersgd-{args.rank}"):
        model = make_mlp(widths)
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.01),
            named_parameters=[(f"{key}.{n}", p) for n, p in model.named_parameters()])
        if key != "exact":
            # Start PowerSGD at once: the comparison is about its steady state.
            optimizer.register_comm_hook(powersgd_state, hvd.powersgd_hook)
        contenders[key] = (model, optimizer)

    def run(key: str, steps: int) -> float:
        model, optimizer = contenders[key]
        hvd.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()
        hvd.barrier()
        return (time.perf_counter() - start) / steps

    for key in contenders:
        run(key, 3)  # warm up (PowerSGD's first steps are exact)
    times: dict[str, list[float]] = {key: [] for key in contenders}
    sent_before, counted_steps = powersgd_state.bytes_sent, args.rounds * args.steps
    for round_ in range(args.rounds):
        for key in list(contenders)[::1 if round_ % 2 == 0 else -1]:
            times[key].append(run(key, args.steps))
    params = sum(p.numel() for p in contenders["exact"][0].parameters())
    compressed_bytes = (powersgd_state.bytes_sent - sent_before) / counted_steps
    if hvd.rank() == 0:
        print(f"ranks: {hvd.size()}, MLP {args.widths} ({params / 1e6:.1f}M parameters, "
              f"{params * 4 / 2 ** 20:.0f} MiB of float32 gradients), batch "
              f"{args.batch_size} per rank")
        for key, values in times.items():
            print(f"{key:12s} {statistics.median(values) * 1e3:9.1f} ms/step  rounds "
                  f"{min(values) * 1e3:.1f} to {max(values) * 1e3:.1f}")
        exact, compressed = times["exact"], times[f"powersgd-{args.rank}"]
        print(f"powersgd-{args.rank} / exact: "
              f"{statistics.median(c / e for c, e in zip(compressed, exact)):.3f}x step time")
        print(f"bytes a step per rank: exact {params * 4} ({params * 4 / 2 ** 20:.2f} MiB), "
              f"powersgd-{args.rank} {compressed_bytes:.0f} "
              f"({compressed_bytes / 2 ** 20:.3f} MiB, {params * 4 / compressed_bytes:.0f}x less)")


if __name__ == "__main__":
    main()
