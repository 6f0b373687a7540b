"""Which gradients DistributedOptimizer submits together, and when.

Learned order (beyond Horovod): on the first step every gradient is submitted the moment
its hook fires, and the firing order is recorded. The optimizer then agrees on one order
across ranks (rank 0's), and from the second step on parameters are grouped into buckets
of consecutive parameters in that order, one dtype each, up to a byte cap. A gradient is
held until its whole bucket is ready and the bucket goes to the core in one submission,
so fusion follows execution order and a step costs a few negotiation cycles instead of
one per gradient arrival. Once the order is agreed, the Reducer turns these buckets
into flat ones (flat_buckets.py) and holds here only what stays per tensor.

Explicit groups (Horovod's ``groups=``) use the same holding logic with the user's
buckets and learn nothing.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..common.bucketing import consecutive_runs


class GradientBuckets:
    def __init__(self, cap_bytes: float, groups: Sequence[Sequence[torch.Tensor]] | None = None
                 ) -> None:
        self._cap = cap_bytes
        self._learns = groups is None and cap_bytes > 0
        # Parameters in hook order while learning (first step), else None.
        self._order: list[torch.Tensor] | None = [] if self._learns else None
        self._buckets: list[list[torch.Tensor]] = []
        self._bucket_of: dict[torch.Tensor, int] = {}
        self._held: dict[int, list[torch.Tensor]] = {}
        if groups is not None:
            self._set(groups)

    @property
    def buckets(self) -> list[list[torch.Tensor]]:
        return self._buckets

    @property
    def learning(self) -> bool:
        return self._order is not None

    def index(self, param: torch.Tensor) -> int | None:
        return self._bucket_of.get(param)

    def ready(self, param: torch.Tensor) -> list[torch.Tensor]:
        """param's gradient is final for this step: what to submit now (param alone, its
        completed bucket, or nothing while the bucket waits for other members)."""
        index = self._bucket_of.get(param)
        if index is None:
            if self._order is not None:
                self._order.append(param)
            return [param]
        held = self._held.setdefault(index, [])
        held.append(param)
        if len(held) < len(self._buckets[index]):
            return []
        del self._held[index]
        return self._buckets[index]

    def end_step(self) -> None:
        """Forget what is held: the caller submitted it."""
        self._held.clear()

    def abandon_step(self) -> None:
        """A step that failed: forget what is held, and a first step's partial order."""
        self._held.clear()
        self.forget_order()

    def relearn(self) -> None:
        """Back to the first step's per-gradient submissions, recording the order anew."""
        if self._learns:
            self._order = []
            self._set([])
            self._held.clear()

    def forget_order(self) -> None:
        """Keep learning: record the order afresh on the next step."""
        if self._order is not None:
            self._order.clear()

    def keep_only(self, params: set[torch.Tensor]) -> None:
        """Hold only these parameters (the others went into flat buckets)."""
        self._set([[p for p in bucket if p in params] for bucket in self._buckets])

    def recorded(self, unseen: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """This rank's first-step order: hook order, then parameters that got no hook."""
        return [*(self._order or []), *unseen]

    def learn(self, order: Sequence[torch.Tensor]) -> None:
        """Stop learning; bucket ``order`` (the same on every rank) by dtype and cap."""
        self._order = None
        self._set(consecutive_runs(order, _dtype, _nbytes, self._cap))

    def _set(self, buckets: Sequence[Sequence[torch.Tensor]]) -> None:
        self._buckets = [list(b) for b in buckets if len(b) > 0]
        self._bucket_of = {p: i for i, b in enumerate(self._buckets) for p in b}


def _dtype(param: torch.Tensor) -> torch.dtype:
    return param.dtype


def _nbytes(param: torch.Tensor) -> int:
    return param.numel() * param.element_size()
