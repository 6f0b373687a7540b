"""Pytrees: ``broadcast_parameters``, and a pytree reduced as one operation per dtype: its leaves of each dtype are laid end
to end in one flat buffer (one copy), which the core negotiates as one tensor (one name,
one response-cache bit), and the results are cut back into the tree's shapes.

Each leaf starts on an ALIGN boundary of the flat buffer (the gaps are zeros, reduced
with the rest): its part of the result is then memory JAX adopts as it is, with no
copy out (handles.jax_array)."""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from ..common.api import collectives as core
from ..common.api.process_sets import ProcessSet, global_process_set
from ..common.execution.fusion import ALIGN
from ..common.messages import ReduceOp
from .handles import Handle, host_array, host_empty, jax_array


def _layout(arrays: list[np.ndarray], members: list[int], itemsize: int
            ) -> tuple[list[int], int]:
    """Each member's offset in the flat buffer (in elements, ALIGN-aligned) and its size."""
    step = max(1, ALIGN // itemsize)
    offsets, end = [], 0
    for index in members:
        start = -(-end // step) * step
        offsets.append(start)
        end = start + arrays[index].size
    return offsets, end


def allreduce_tree(tree: Any, op: ReduceOp, name: str | None, prescale: float,
                   postscale: float, process_set: ProcessSet,
                   host_array: Callable[[Any, str], np.ndarray], handle: Callable) -> Any:
    """Submit the tree's reduction; ``handle(core_handles, finish)`` is what returns."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    arrays = [host_array(leaf, "allreduce") for leaf in leaves]
    by_dtype: dict[np.dtype, list[int]] = {}
    for index, array in enumerate(arrays):
        by_dtype.setdefault(array.dtype, []).append(index)
    base = name if name is not None else core.auto_name("allreduce", process_set)
    flats, outputs, names, layouts = [], [], [], []
    for dtype, members in by_dtype.items():
        offsets, total = _layout(arrays, members, dtype.itemsize)
        if len(members) == 1:  # one leaf: reduced from its own memory, into a new array
            flat = arrays[members[0]].reshape(-1)
            output = host_empty((total,), dtype)
        else:  # a fresh concatenation: reduced in place
            flat = output = host_empty((total,), dtype)
            end = 0
            for index, offset in zip(members, offsets):
                flat[end:offset] = 0
                end = offset + arrays[index].size
                flat[offset:end] = arrays[index].reshape(-1)
        flats.append(flat)
        outputs.append(output)
        names.append(f"{base}.{np.dtype(dtype).name}")
        layouts.append(offsets)
    handles = core.grouped_allreduce_async(flats, outputs, names, op, float(prescale),
                                           float(postscale), "cpu", process_set) \
        if flats else []

    def finish(results: list[np.ndarray]) -> Any:
        out: list[Any] = [None] * len(arrays)
        for members, offsets, result in zip(by_dtype.values(), layouts, results):
            for index, offset in zip(members, offsets):
                shape, size = arrays[index].shape, arrays[index].size
                out[index] = jax_array(result[offset:offset + size].reshape(shape))
        return jax.tree_util.tree_unflatten(treedef, out)
    return handle(handles, finish)


def broadcast_parameters(params: Any, root_rank: int = 0,
                         process_set: ProcessSet = global_process_set) -> Any:
    """The root's pytree on every rank (one broadcast per leaf, in one submission)."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    arrays = [host_array(leaf, "broadcast_parameters") for leaf in leaves]
    handles = [core.broadcast_async(array, host_empty(array.shape, array.dtype), root_rank,
                                    f"broadcast_parameters.{i}", "cpu", process_set)
               for i, array in enumerate(arrays)]
    results = Handle(handles, lambda results: results).wait()
    return jax.tree_util.tree_unflatten(treedef, [jax_array(r) for r in results])
