"""PowerSGD gradient compression as a communication hook (beyond Horovod): DDP's
``powerSGD_hook`` algorithm (Vogels et al., 2019, https://arxiv.org/abs/1905.13727).

Each gradient of a bucket is viewed as a matrix M (n rows, m = the rest). Where a rank-r
approximation saves enough bytes (``(n + m) * r * min_compression_rate < n * m``), the
ranks exchange P = M Q (n x r) and Q = M^T P (m x r) instead of M: P is summed,
orthogonalised, Q computed from it and summed, and M is replaced by P Q^T / size. The
rest (biases, small matrices) is allreduced exactly. Error feedback adds what the
approximation lost on this rank to its next gradient; warm start reuses the last Q.
Before ``start_powerSGD_iter`` steps the bucket is allreduced exactly.

    optimizer.register_comm_hook(hvd.PowerSGDState(matrix_approximation_rank=2,
                                                   start_powerSGD_iter=10),
                                 hvd.powersgd_hook)

``bytes_sent`` / ``bytes_uncompressed`` count what this rank handed to the collectives
and what an exact allreduce would have, from the first compressed step on.
"""
from __future__ import annotations

import numpy as np
import torch

from ..common.api.process_sets import ProcessSet, global_process_set
from ..common.messages import ReduceOp
from . import mpi_ops
from .comm_hooks import Finish, GradBucket, allreduce_hook


class PowerSGDState:
    """PowerSGD's settings and memory (error feedback, warm-start Qs), DDP's arguments:
    tune ``matrix_approximation_rank`` (1, 2, 4, ...) and ``start_powerSGD_iter``
    (about 10% of the steps); ``min_compression_rate`` skips matrices that would not
    shrink by that factor; ``orthogonalization_epsilon`` guards all-zero columns."""

    def __init__(self, process_set: ProcessSet | None = None,
                 matrix_approximation_rank: int = 1, start_powerSGD_iter: int = 1_000,
                 min_compression_rate: float = 2, use_error_feedback: bool = True,
                 warm_start: bool = True, orthogonalization_epsilon: float = 0,
                 random_seed: int = 0) -> None:
        if matrix_approximation_rank < 1:
            raise ValueError(f"matrix_approximation_rank must be >= 1, got "
                             f"{matrix_approximation_rank}")
        self.process_set = process_set or global_process_set  # informational
        self.matrix_approximation_rank = int(matrix_approximation_rank)
        self.start_powerSGD_iter = int(start_powerSGD_iter)
        self.min_compression_rate = float(min_compression_rate)
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.orthogonalization_epsilon = float(orthogonalization_epsilon)
        self.rng = np.random.RandomState(random_seed)  # DDP's, drawn the same way
        self.error_dict: dict[tuple[str, ...], torch.Tensor] = {}
        self.q_memory_dict: dict[tuple[str, ...], list[torch.Tensor]] = {}
        self.iter = 0
        self.bytes_sent = 0
        self.bytes_uncompressed = 0

    def compression_stats(self) -> tuple[float, int, int]:
        """(rate, bytes an exact allreduce would send, bytes sent), compressed steps."""
        rate = self.bytes_uncompressed / self.bytes_sent if self.bytes_sent else 0.0
        return rate, self.bytes_uncompressed, self.bytes_sent


def _should_compress(rows: int, cols: int, rank: int, min_rate: float) -> bool:
    return (rows + cols) * rank * min_rate < rows * cols


def _orthogonalize(matrix: torch.Tensor, epsilon: float) -> None:
    """Orthonormal columns, in place: Gram-Schmidt up to rank 2 (and for half types),
    else QR, as DDP does."""
    if matrix.shape[1] <= 2 or matrix.dtype in (torch.float16, torch.bfloat16):
        for i in range(matrix.shape[1]):
            col = matrix[:, i:i + 1]
            col /= torch.linalg.vector_norm(col) + epsilon
            if i + 1 < matrix.shape[1]:
                rest = matrix[:, i + 1:]
                rest -= (col * rest).sum(0, keepdim=True) * col
    else:
        matrix.copy_(torch.linalg.qr(matrix).Q)


def powersgd_hook(state: PowerSGDState, bucket: GradBucket) -> Finish:
    """The PowerSGD communication hook (see the module docstring)."""
    state.iter = max(state.iter, bucket.step)
    if bucket.step < state.start_powerSGD_iter:
        return allreduce_hook(None, bucket)
    buffer = bucket.buffer()
    key = bucket.key
    if state.use_error_feedback:
        error = state.error_dict.get(key)
        if error is not None:
            buffer.add_(error)
        local = buffer.clone()
    by_shape: dict[torch.Size, list[torch.Tensor]] = {}
    plain = []
    for grad in bucket.gradients():
        if grad.dim() == 0:
            plain.append(grad)
            continue
        matrix = grad.view(grad.shape[0], -1)
        rank = min(*matrix.shape, state.matrix_approximation_rank)
        if _should_compress(*matrix.shape, rank, state.min_compression_rate):
            by_shape.setdefault(matrix.shape, []).append(matrix)
        else:
            plain.append(matrix)
    matrices = [m for same in by_shape.values() for m in same]  # DDP's order
    qs = state.q_memory_dict.get(key) if state.warm_start else None
    if qs is None:
        # DDP's draw (so results match its hook's): one seed from the state's generator
        # per bucket that starts afresh, every rank alike as long as buckets start in
        # the same order on every rank (they do when every rank runs the same graph).
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(state.rng.randint(1_000_000_000))
            qs = [torch.randn(m.shape[1], min(*m.shape, state.matrix_approximation_rank),
                              dtype=m.dtype) for m in matrices]
    for q in qs:
        _orthogonalize(q, state.orthogonalization_epsilon)
    name = f"powersgd.{bucket.name}"
    flat_plain = torch.cat([t.reshape(-1) for t in plain]) if plain \
        else buffer.new_empty(0)
    plain_handle = mpi_ops.allreduce_async(flat_plain, name=f"{name}.exact", op=bucket.op,
                                           prescale_factor=bucket.prescale,
                                           postscale_factor=bucket.postscale,
                                           process_set=bucket.process_set) if plain else None
    ps = [m @ q for m, q in zip(matrices, qs)]
    p_handle = mpi_ops.grouped_allreduce_async(ps, name=f"{name}.P", op=ReduceOp.SUM,
                                               process_set=bucket.process_set) if ps else None
    item = buffer.element_size()
    state.bytes_sent += item * (flat_plain.numel() + sum(p.numel() for p in ps)
                                + sum(q.numel() for q in qs))
    state.bytes_uncompressed += item * buffer.numel()

    def finish() -> torch.Tensor:
        if plain_handle is not None:
            reduced, offset = mpi_ops.synchronize(plain_handle), 0
            for tensor in plain:
                tensor.copy_(reduced[offset:offset + tensor.numel()].view(tensor.shape))
                offset += tensor.numel()
        if p_handle is not None:
            summed = mpi_ops.synchronize(p_handle)
            for p in summed:
                _orthogonalize(p, state.orthogonalization_epsilon)
            new_qs = [m.t() @ p for m, p in zip(matrices, summed)]
            new_qs = mpi_ops.synchronize(mpi_ops.grouped_allreduce_async(
                new_qs, name=f"{name}.Q", op=ReduceOp.SUM, process_set=bucket.process_set))
            scale = bucket.scale()
            for matrix, p, q in zip(matrices, summed, new_qs):
                q.mul_(scale)
                torch.matmul(p, q.t(), out=matrix)
            if state.warm_start:
                state.q_memory_dict[key] = [q.clone() for q in new_qs]
        if state.use_error_feedback:
            state.error_dict[key] = local - buffer
        return buffer
    return finish
