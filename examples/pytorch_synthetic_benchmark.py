"""Synthetic training throughput, as Horovod's pytorch_synthetic_benchmark.py reports it.

    horovodishrun -np 2 python examples/pytorch_synthetic_benchmark.py --model mlp

Random data, a model defined here (no download): ``resnet``, a small residual CNN on
3x32x32 images, or ``mlp``, 784-1024-1024-1024-10. Prints img/sec per rank and in total.
"""
from __future__ import annotations

import argparse
import os
import timeit

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import horovodish.torch as hvd


class Block(nn.Module):
    def __init__(self, channels: int, stride: int = 1) -> None:
        super().__init__()
        out = channels * stride
        self.conv1 = nn.Conv2d(channels, out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.shortcut = nn.Sequential() if stride == 1 else nn.Sequential(
            nn.Conv2d(channels, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


def resnet(classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                         Block(32), Block(32, 2), Block(64), Block(64, 2), Block(128),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, classes))


def mlp(classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, classes))


MODELS = {"resnet": (resnet, (3, 32, 32)), "mlp": (mlp, (784,))}


def default_threads() -> int:
    """Split the machine's cores between the ranks on it (oversubscribing hurts both)."""
    return max(1, (os.cpu_count() or 1) // hvd.local_size())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--num-warmup-batches", type=int, default=10)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--fp16-allreduce", action="store_true",
                        help="send gradients as float16")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads per rank (default: cores / ranks per host)")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads or default_threads())
    build, shape = MODELS[args.model]
    model = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    data = torch.randn(args.batch_size, *shape)
    target = torch.randint(0, 10, (args.batch_size,))

    def benchmark_step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    def log(text: str) -> None:
        if hvd.rank() == 0:
            print(text, flush=True)

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of CPUs: {hvd.size()} ranks x {torch.get_num_threads()} threads")
    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    log("Running benchmark...")
    img_secs = []
    for i in range(args.num_iters):
        elapsed = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / elapsed
        log(f"Iter #{i}: {img_sec:.1f} img/sec per CPU")
        img_secs.append(img_sec)
    mean, conf = float(np.mean(img_secs)), float(1.96 * np.std(img_secs))
    log(f"Img/sec per CPU: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")


if __name__ == "__main__":
    main()
