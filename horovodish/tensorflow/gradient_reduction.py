"""Reducing a list of gradients in one submission, for DistributedGradientTape and Keras.

Dense gradients travel in flat buckets: the gradients of one dtype (within an explicit
group, if ``groups`` is given), up to 64 MiB, are concatenated into one flat tensor,
which is one entry for the core (one name, one response-cache bit, one negotiation
whatever the variable count), and split back afterwards; TensorFlow's concat and split
run as graph ops inside tf.function. All buckets go to the core together, so they
negotiate in one cycle. Names are positional (``<prefix>.<index>``, a bucket named after
its first member and its length): identical on every rank and every step, so the
response cache hits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Sequence

import numpy as np
import tensorflow as tf

from ..common.bucketing import consecutive_runs
from ..common.compression import Compressor
from ..common.messages import ReduceOp
from ..common.api.process_sets import ProcessSet, global_process_set
from . import errors
from .compression import Compression
from .mpi_ops import _allreduce, _sparse_allreduce
from .naming import positional_names


@dataclass(frozen=True)
class GradientReduction:
    """How gradients are combined across ranks (Horovod's optimizer/tape arguments)."""

    op: ReduceOp = ReduceOp.AVERAGE
    compression: Compressor = Compression.none
    sparse_as_dense: bool = False
    gradient_predivide_factor: float = 1.0
    groups: int | Sequence[Sequence[Any]] | None = None
    process_set: ProcessSet = global_process_set
    prefix: str = "DistributedGradientTape"
    # Gradients of local variables (see __call__) are divided by the set's size.
    scale_local_gradients: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", ReduceOp(self.op))
        if self.gradient_predivide_factor != 1.0 and self.op != ReduceOp.AVERAGE:
            raise ValueError("gradient_predivide_factor is only defined for op=Average, "
                             f"not {self.op.name.capitalize()}")
        if isinstance(self.groups, int) and self.groups < 0:
            raise ValueError(f"groups must be a non-negative integer, got {self.groups}")

    def __call__(self, grads: Sequence[Any], variables: Sequence[Any] | None = None,
                 local: Collection[int] = (), agree_on_overflow: bool = False) -> list[Any]:
        """Reduced gradients, in order; None stays None (a variable with no gradient).

        local: ids of variables whose gradients stay on this rank (Horovod's local
        layers): not reduced, divided by the set's size if ``scale_local_gradients``
        (as Horovod does, whatever the op). Every rank must name the same positions.
        agree_on_overflow (for a loss scaler's check, which follows): if any rank's
        local gradients are not finite, every rank's become NaN, so that every rank
        skips the step together; one scalar rides along with the reduction for it."""
        results = [tf.convert_to_tensor(g) if self.sparse_as_dense and
                   isinstance(g, tf.IndexedSlices) else g for g in grads]
        # A set of one reduces nothing, and a rank outside the set keeps its gradients
        # (Horovod's identity branch, on every rank outside it: its tests run the
        # optimizer of a set on every rank).
        if self.process_set.size() == 1:
            return results
        kept = _local_positions(results, variables, local)
        if kept and self.scale_local_gradients:
            for i in kept:
                results[i] = _divide(results[i], self.process_set.size())
        if not self.process_set.included():
            return results
        process_set = errors.resolve(self.process_set)
        names = positional_names(self.prefix, len(results))
        # Average with a predivide factor: scale by 1/f before the sum, f/size after.
        prescale = 1.0 / self.gradient_predivide_factor
        postscale = self.gradient_predivide_factor
        dense = []
        for i, grad in enumerate(results):
            if i in kept:
                continue
            if isinstance(grad, tf.IndexedSlices):
                results[i] = _sparse_allreduce(grad, self.op, prescale, postscale, names[i],
                                               process_set)
            elif grad is not None:
                results[i] = tf.convert_to_tensor(grad)
                dense.append(i)
        # Adasum combines each tensor's whole vector: its gradients go one by one.
        buckets = [[i] for i in dense] if self.op == ReduceOp.ADASUM else \
            _buckets(dense, results, self._group_positions(dense, variables))
        flats = [_flatten([results[i] for i in bucket]) for bucket in buckets]
        packed = [self.compression.compress(flat) for flat in flats]
        tensors = [p[0] for p in packed]
        tensor_names = [names[b[0]] if len(b) == 1 else f"{names[b[0]]}+{len(b)}"
                        for b in buckets]
        agree = bool(kept) and agree_on_overflow and self.op != ReduceOp.ADASUM
        if agree:  # in the same call as the gradients: one submission, one order
            tensors.append(_overflow_marker([results[i] for i in sorted(kept)]))
            tensor_names.append(f"{self.prefix}.local_overflow")
        # Differentiable: an outer tape can take second-order gradients through it.
        reduced = _allreduce(tensors, self.op, prescale, postscale, tensor_names,
                             process_set) if tensors else []
        for bucket, out, (_, ctx) in zip(buckets, reduced, packed):
            out = self.compression.decompress(out, ctx)
            for i, grad in zip(bucket, _unflatten(out, [results[i] for i in bucket])):
                results[i] = grad
        if agree:
            marker = reduced[-1]  # 0 on every rank, or NaN on every rank
            for i in kept:
                results[i] = _add_marker(results[i], marker)
        return results

    def _group_positions(self, dense: list[int],
                         variables: Sequence[Any] | None) -> list[list[int]] | None:
        """Positions in ``dense`` per submission; None: one submission for all."""
        if not self.groups or not dense:
            return None
        if isinstance(self.groups, int):
            return [list(part) for part in np.array_split(np.arange(len(dense)), self.groups)
                    if len(part)]
        if variables is None:
            raise ValueError("groups given as lists of variables need the variables the "
                             "gradients belong to")
        position = {id(variables[i]): p for p, i in enumerate(dense)}
        grouped, seen = [], set()
        for group in self.groups:
            members = [position[id(v)] for v in group if id(v) in position]
            seen.update(members)
            if members:
                grouped.append(members)
        # Horovod: a variable in no list forms a group of its own.
        return grouped + [[p] for p in range(len(dense)) if p not in seen]


_BUCKET_BYTES = 64 << 20


def _buckets(dense: list[int], grads: list[Any], groups: list[list[int]] | None
             ) -> list[list[int]]:
    """Positions in ``grads`` per flat bucket: consecutive gradients of one dtype within
    a group (``groups``: positions in ``dense``; None: one group), up to 64 MiB."""
    buckets: list[list[int]] = []
    for group in groups if groups is not None else [range(len(dense))]:
        buckets += consecutive_runs(
            (dense[position] for position in group), lambda index: grads[index].dtype,
            lambda index: (grads[index].shape.num_elements() or 0) * grads[index].dtype.size,
            _BUCKET_BYTES)
    return buckets


def _flatten(grads: list[Any]) -> Any:
    if len(grads) == 1:
        return grads[0]
    return tf.concat([tf.reshape(g, [-1]) for g in grads], 0)


def _unflatten(flat: Any, like: list[Any]) -> list[Any]:
    """flat cut into tensors shaped as ``like`` (static shapes where known)."""
    if len(like) == 1:
        return [flat]
    static = all(g.shape.is_fully_defined() for g in like)
    sizes = [g.shape.num_elements() for g in like] if static else \
        tf.stack([tf.size(g) for g in like])
    parts = tf.split(flat, sizes, 0)
    return [tf.reshape(part, g.shape if static else tf.shape(g))
            for part, g in zip(parts, like)]


def _local_positions(grads: list[Any], variables: Sequence[Any] | None,
                     local: Collection[int]) -> set[int]:
    """Positions of the gradients that belong to local variables (and exist)."""
    if not local:
        return set()
    if variables is None:
        raise ValueError("local variables need the variables the gradients belong to")
    return {i for i, (grad, variable) in enumerate(zip(grads, variables))
            if grad is not None and id(variable) in local}


def _overflow_marker(grads: list[Any]) -> tf.Tensor:
    """0.0, or NaN when some gradient has an inf or a NaN (0 * inf is NaN); reduced with
    any op but Adasum, a NaN on one rank is a NaN on all."""
    parts = [tf.reduce_sum(tf.cast(g.values if isinstance(g, tf.IndexedSlices) else g,
                                   tf.float32) * 0.0) for g in grads]
    return tf.reshape(tf.add_n(parts), [1])


def _add_marker(grad: Any, marker: tf.Tensor) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values + tf.cast(marker[0], grad.values.dtype),
                                grad.indices, grad.dense_shape)
    return grad + tf.cast(marker[0], grad.dtype)


def _divide(grad: Any, size: int) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / size, grad.indices, grad.dense_shape)
    return grad / size
