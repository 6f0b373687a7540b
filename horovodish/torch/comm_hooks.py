"""Communication hooks: change what DistributedOptimizer sends for each bucket of
gradients, as DDP's ``register_comm_hook`` does (beyond Horovod).

    state = hvd.PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=10)
    optimizer.register_comm_hook(state, hvd.powersgd_hook)

A hook is ``hook(state, bucket) -> finish``: called on the training thread as soon as a
bucket's gradients are final (while backward goes on), it starts collectives (the
``*_async`` ones) and returns a function that ``synchronize()`` calls to get the reduced
gradients: one flat tensor of ``bucket.buffer()``'s size, or one tensor per gradient.
DDP's hooks return a ``torch.futures.Future`` instead; here the collectives run in the
runtime meanwhile, and ``finish`` is where a hook waits and does its later phases.
Every rank must register the same hook; a hook's collectives must carry names that
are the same on every rank (``bucket.name`` is).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence, Union

import torch

from ..common.api.process_sets import ProcessSet
from ..common.compression import Compressor
from ..common.messages import ReduceOp
from . import mpi_ops
from .compression import Compression

Finish = Callable[[], Union[torch.Tensor, Sequence[torch.Tensor]]]
CommHook = Callable[[Any, "GradBucket"], Finish]


class GradBucket:
    """One bucket of gradients, as DDP's ``GradBucket``: ``buffer()`` is their flat
    concatenation and ``gradients()`` are views of it, so a hook may work on either and
    return ``buffer()``. ``name`` is the same on every rank (prefix the hook's
    collectives with it); ``op`` (Average or Sum) and ``prescale``/``postscale``
    (``gradient_predivide_factor``) are what the reduction must apply; ``step`` counts
    the optimizer's synchronized steps before this one."""

    def __init__(self, index: int, parameters: Sequence[torch.Tensor], names: Sequence[str],
                 gradients: Sequence[torch.Tensor], op: ReduceOp, prescale: float,
                 postscale: float, process_set: ProcessSet, step: int,
                 buffer: torch.Tensor | None = None) -> None:
        self._index = index
        self._parameters = list(parameters)
        self._names = list(names)
        self._gradients = list(gradients)
        # A flat bucket's tensor, whose views the gradients are; else built on demand.
        self._buffer = buffer
        self.op, self.prescale, self.postscale = op, prescale, postscale
        self.process_set, self.step = process_set, step
        self.name = f"{self._names[0]}.{len(self._names)}"
        self.key = tuple(self._names)  # identifies the bucket across steps

    def index(self) -> int:
        """Position of this bucket among the step's submissions."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The gradients, flattened and concatenated (a new tensor, built once)."""
        if self._buffer is None:
            self._buffer = torch.cat([g.reshape(-1) for g in self._gradients])
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        """Views of ``buffer()`` shaped as the gradients."""
        if self._buffer is not None and self._gradients and \
                self._gradients[0].data_ptr() == self._buffer.data_ptr():
            return list(self._gradients)
        buffer, views, offset = self.buffer(), [], 0
        for grad in self._gradients:
            views.append(buffer[offset:offset + grad.numel()].view(grad.shape))
            offset += grad.numel()
        return views

    def parameters(self) -> list[torch.Tensor]:
        return list(self._parameters)

    def names(self) -> list[str]:
        return list(self._names)

    def scale(self) -> float:
        """Factor from a plain sum over ranks to what the reduction must give."""
        size = self.process_set.size() if self.process_set.size() else 1
        average = 1.0 / size if self.op == ReduceOp.AVERAGE else 1.0
        return self.prescale * self.postscale * average


def allreduce_hook(process_set: Any, bucket: GradBucket) -> Finish:
    """What DistributedOptimizer does without a hook: the bucket, exactly reduced (in one
    flat allreduce). ``process_set`` is ignored (the optimizer's is used)."""
    handle = mpi_ops.allreduce_async(bucket.buffer(), name=f"hook.{bucket.name}",
                                     op=bucket.op, prescale_factor=bucket.prescale,
                                     postscale_factor=bucket.postscale,
                                     process_set=bucket.process_set)
    return lambda: mpi_ops.synchronize(handle)


def _cast_hook(compression: Compressor) -> CommHook:
    def hook(process_set: Any, bucket: GradBucket) -> Finish:
        compressed, ctx = compression.compress(bucket.buffer())
        handle = mpi_ops.allreduce_async(compressed, name=f"hook.{bucket.name}", op=bucket.op,
                                         prescale_factor=bucket.prescale,
                                         postscale_factor=bucket.postscale,
                                         process_set=bucket.process_set)
        return lambda: compression.decompress(mpi_ops.synchronize(handle), ctx)
    return hook


fp16_compress_hook = _cast_hook(Compression.fp16)
fp16_compress_hook.__doc__ = ("Send float16 (Compression.fp16 as a hook): half the bytes; "
                              "float16's range (about 6e-5 to 65504).")
bf16_compress_hook = _cast_hook(Compression.bf16)
bf16_compress_hook.__doc__ = ("Send bfloat16 (Compression.bf16 as a hook): half the bytes, "
                              "float32's range, 8 bits of mantissa.")
