"""Gradients that live in flat buckets: each bucket is one tensor, and the ``.grad`` of
each of its parameters is a view of it, so autograd accumulates in place and the
collective reduces the bucket where it lies (no pack before it, no unpack after).

Knowing when a bucket is final costs one Python call per bucket, not per gradient: a
hook on the member that arrives last (on this rank) compares the bucket's version
counter, which every in-place accumulation into any of its views advances by one, with
what a complete bucket shows. A count that falls short (a parameter that got no
gradient, an order that changed, a gradient that someone replaced) leaves the bucket for
``synchronize()``, which repairs what was replaced and submits it: slower, never wrong.
"""
from __future__ import annotations

import zlib
from typing import Sequence

import torch


class FlatBucket:
    """One bucket: parameters of one dtype and device, laid out in the agreed order.

    packed: the gradients stay tensors of their own (freed after each step, as the
    sharded optimizer's stage 2 wants), are complete when all are present, and are
    concatenated into one tensor when the bucket is sent (one C++ call)."""

    def __init__(self, index: int, params: Sequence[torch.Tensor], names: Sequence[str],
                 packed: bool = False) -> None:
        self.index = index
        self.params = list(params)
        self.names = list(names)
        self.packed = packed
        self.trigger = self.params[-1]  # the member that arrives last on this rank
        numels = [p.numel() for p in self.params]
        self.flat = torch.zeros(0 if packed else sum(numels), dtype=self.params[0].dtype,
                                device=self.params[0].device)
        self.views: list[torch.Tensor] = []
        offset = 0
        for param, numel in zip(self.params, numels if not packed else ()):
            self.views.append(self.flat[offset:offset + numel].view(param.shape))
            offset += numel
        # One name per layout: a rank whose bucket differs negotiates another tensor.
        digest = zlib.crc32("\0".join(self.names).encode()) & 0xFFFFFFFF
        self.name = f"bucket.{self.names[0]}.{len(self.params)}.{digest:08x}"
        self.passes = 0  # trigger hooks this step
        self.submitted = False
        self.base = 0  # the version counter when the bucket last held no pending work
        self.sent_version = 0

    def adopt(self) -> None:
        """Make each parameter's gradient a view of the bucket, keeping its values."""
        if self.packed:
            return
        with torch.no_grad():
            for param, view in zip(self.params, self.views):
                grad = param.grad
                if grad is None:
                    view.zero_()
                elif grad is not view:
                    view.copy_(grad.to_dense() if grad.is_sparse else grad)
                param.grad = view
        self.rebase()

    def rebase(self) -> None:
        self.base = self.flat._version

    def arrived(self) -> int:
        """In-place accumulations into the bucket since the last rebase."""
        return self.flat._version - self.base

    def attached(self) -> bool:
        """Whether every member's gradient is still its view (``p.grad = None`` or
        ``model.zero_grad()`` detach them; autograd then makes fresh tensors)."""
        return all(p.grad is v for p, v in zip(self.params, self.views))

    def complete(self, passes: int) -> bool:
        """Every member accumulated ``passes`` times (views), or is present (packed);
        gradients that someone detached are taken back into the bucket."""
        if self.packed:
            return all(p.grad is not None for p in self.params)
        if self.arrived() == len(self.params) * passes and self.attached():
            return True
        if self.detached_all_present():  # model.zero_grad() set them to None
            self.adopt()
            return True
        return False

    def source(self) -> torch.Tensor:
        """The tensor the collective reads: the bucket itself, or (packed) the
        gradients concatenated, with zeros for a member that has none."""
        if not self.packed:
            return self.flat
        grads = [p.grad for p in self.params]
        if any(g is None or g.is_sparse for g in grads):
            grads = [torch.zeros_like(p) if g is None else g.to_dense() if g.is_sparse
                     else g for p, g in zip(self.params, grads)]
        return torch._C._nn.flatten_dense_tensors(grads)

    def detached_all_present(self) -> bool:
        """Every member holds a fresh gradient of its own (``model.zero_grad()`` set them
        to None, and autograd made new ones this step): all arrived."""
        return all(p.grad is not None and p.grad is not v
                   for p, v in zip(self.params, self.views))

    def reset_step(self) -> None:
        self.passes = 0
        self.submitted = False
        self.rebase()


def zero(buckets: Sequence[FlatBucket]) -> None:
    """zero_grad for bucketed parameters: one fill per bucket, views kept."""
    viewed = [b for b in buckets if not b.packed]
    if viewed:
        torch._foreach_zero_([b.flat for b in viewed])
        for bucket in viewed:
            bucket.rebase()


# On host memory a flat bucket costs two extra passes over its gradients (the zeroing,
# and accumulating in place instead of taking autograd's tensor), while it saves Python
# per tensor. Past this mean size per parameter the passes cost more (an MLP of 1-4 MB
# weights on 2 ranks: 15.2 ms a step flat, 13.8 ms per tensor; 16 KiB to 256 KiB
# weights: flat as fast or faster); device memory is fast enough for any size.
HOST_MEAN_BYTES = 256 << 10


def plan(buckets: Sequence[Sequence[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """The flat buckets the agreed buckets give: each splits where dtype or device
    changes; members a flat view cannot stand for (not contiguous) stay out, and so do
    host buckets of large parameters (HOST_MEAN_BYTES)."""
    flat: list[list[torch.Tensor]] = []
    for bucket in buckets:
        runs: list[list[torch.Tensor]] = []
        for param in bucket:
            if not param.is_contiguous():
                continue
            if runs and runs[-1][0].dtype == param.dtype and \
                    runs[-1][0].device == param.device:
                runs[-1].append(param)
            else:
                runs.append([param])
        flat.extend(run for run in runs if run[0].device.type != "cpu" or sum(
            p.numel() * p.element_size() for p in run) <= HOST_MEAN_BYTES * len(run))
    return flat
