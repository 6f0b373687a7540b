"""DistributedOptimizer for optax: an ``optax.GradientTransformation`` whose ``update``
averages the gradient pytree across ranks (one collective per dtype, not one per leaf),
then runs the wrapped transformation's update (jitted).

Horovod's arguments: ``op`` (Average or Sum), ``gradient_predivide_factor`` (Average:
scale by 1/f before the sum and f/size after), ``backward_passes_per_step`` k (the
gradients of k calls are summed locally, not averaged, and reduced on the k-th; the
calls before it return zero updates, so ``optax.apply_updates`` leaves the parameters
as they are), ``compression`` (``Compression.fp16``/``.bf16``: cast before the
reduction, cast back after), ``process_set`` (a rank outside it keeps its own
gradients, as Horovod's optimizers do). ``update`` runs outside ``jax.jit``; jit the
gradient computation, as in the package docstring.
"""
from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ..common.api.process_sets import ProcessSet, global_process_set
from ..common.compression import CastCompressor, Compressor, Uncompressed
from ..common.messages import ReduceOp
from .trees import allreduce_tree

_created = itertools.count()  # optimizers made in the same order on every rank


class _LeafCast(CastCompressor):
    """One leaf's cast (common/compression.py's mechanism on JAX's primitives)."""

    @staticmethod
    def is_floating(dtype: Any) -> bool:
        return bool(jnp.issubdtype(dtype, jnp.floating))

    @staticmethod
    def cast(leaf: Any, dtype: Any) -> Any:
        return leaf.astype(dtype)


class _FP16Leaf(_LeafCast):
    wire_dtype = jnp.float16


class _BF16Leaf(_LeafCast):
    wire_dtype = jnp.bfloat16


class _Cast:
    """The gradient pytree compressed leaf by leaf with ``leaf``'s cast."""

    leaf: type[CastCompressor]  # each compressor names its leaf cast

    @classmethod
    def compress(cls, tree: Any) -> tuple[Any, Any]:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        packed = [cls.leaf.compress(leaf) for leaf in leaves]
        return treedef.unflatten([sent for sent, _ in packed]), [ctx for _, ctx in packed]

    @classmethod
    def decompress(cls, tree: Any, ctxs: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        return treedef.unflatten([cls.leaf.decompress(leaf, ctx)
                                  for leaf, ctx in zip(leaves, ctxs)])


class Compression:
    """Horovod's compression classes for the gradient pytree."""

    class none(Uncompressed):  # noqa: N801 (Horovod's name)
        """Send the gradients as they are."""

    class fp16(_Cast):  # noqa: N801
        """Half the bytes; float16's range."""
        leaf = _FP16Leaf

    class bf16(_Cast):  # noqa: N801
        """Half the bytes; float32's range, 8 bits of mantissa."""
        leaf = _BF16Leaf


class DistributedState(NamedTuple):
    inner: Any  # the wrapped transformation's state
    accumulated: Any  # gradients summed over this step's passes so far, or None
    passes: int  # passes accumulated


def DistributedOptimizer(optimizer: Any, op: ReduceOp = ReduceOp.AVERAGE,
                         gradient_predivide_factor: float = 1.0,
                         backward_passes_per_step: int = 1,
                         compression: Compressor = Compression.none,
                         process_set: ProcessSet = global_process_set,
                         name: str | None = None) -> Any:
    """Wrap an optax transformation so that its updates use gradients reduced over all
    ranks (see the module docstring for the contract)."""
    import optax
    op = ReduceOp(op)
    if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError(f"DistributedOptimizer supports op=Average or Sum, not "
                         f"{op.name.capitalize()}")
    if gradient_predivide_factor != 1.0 and op != ReduceOp.AVERAGE:
        raise ValueError("gradient_predivide_factor is only supported with op=Average")
    passes = int(backward_passes_per_step)
    if passes < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {passes}")
    factor = float(gradient_predivide_factor)
    prescale, postscale = (1.0 / factor, factor) if op == ReduceOp.AVERAGE else (1.0, 1.0)
    tag = name or f"DistributedOptimizer.{next(_created)}"
    inner_update = jax.jit(optimizer.update)

    def reduce(grads: Any) -> Any:
        if process_set.size() == 1 or not process_set.included():
            return grads  # nothing to reduce, or a rank outside the set (Horovod's rule)
        sent, ctx = compression.compress(grads)
        reduced = allreduce_tree(sent, op, f"{tag}.gradients", prescale, postscale,
                                 process_set).wait()
        return compression.decompress(reduced, ctx)

    def init_fn(params: Any) -> DistributedState:
        return DistributedState(optimizer.init(params), None, 0)

    def update_fn(grads: Any, state: DistributedState, params: Any = None
                  ) -> tuple[Any, DistributedState]:
        if passes > 1:
            summed = grads if state.accumulated is None else jax.tree_util.tree_map(
                jnp.add, state.accumulated, grads)
            if state.passes + 1 < passes:
                zeros = jax.tree_util.tree_map(jnp.zeros_like, grads)
                return zeros, DistributedState(state.inner, summed, state.passes + 1)
            grads = summed
        updates, inner = inner_update(reduce(grads), state.inner, params)
        return updates, DistributedState(inner, None, 0)

    return optax.GradientTransformation(init_fn, update_fn)


__all__ = ["Compression", "DistributedOptimizer", "DistributedState"]
