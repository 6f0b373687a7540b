"""Gradient buckets as every adapter forms them: consecutive tensors of one dtype, up to a
byte cap. torch's replicated and sharded optimizers and TensorFlow's gradient reduction
all bucket this way, so one function does it (the fusion planner, which groups ready
responses rather than a model's parameters, has rules of its own: execution/fusion.py).
"""
from __future__ import annotations

from typing import Callable, Hashable, Iterable, TypeVar

T = TypeVar("T")


def consecutive_runs(items: Iterable[T], key: Callable[[T], Hashable],
                     nbytes: Callable[[T], float], cap: float) -> list[list[T]]:
    """items in order, cut into runs of one key each, each run at most cap bytes (a
    tensor larger than cap is a run of its own)."""
    runs: list[list[T]] = []
    size = 0.0
    current: Hashable = None
    for item in items:
        item_key, item_bytes = key(item), nbytes(item)
        if runs and item_key == current and size + item_bytes <= cap:
            runs[-1].append(item)
            size += item_bytes
        else:
            runs.append([item])
            size, current = item_bytes, item_key
    return runs
