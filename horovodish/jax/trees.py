"""A pytree reduced as one operation per dtype: its leaves of each dtype are laid end
to end in one flat buffer (one copy), which the core negotiates as one tensor (one name,
one response-cache bit), and the results are cut back into the tree's shapes."""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..common.api import collectives as core
from ..common.api.process_sets import ProcessSet
from ..common.messages import ReduceOp


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
    flats, outputs, names = [], [], []
    for dtype, members in by_dtype.items():
        if len(members) == 1:  # one leaf: reduced from its own memory, into a new array
            flat = arrays[members[0]].reshape(-1)
            output = np.empty_like(flat)
        else:  # a fresh concatenation: reduced in place
            flat = output = np.concatenate([arrays[i].reshape(-1) for i in members])
        flats.append(flat)
        outputs.append(output)
        names.append(f"{base}.{np.dtype(dtype).name}")
    handles = core.grouped_allreduce_async(flats, outputs, names, op, float(prescale),
                                           float(postscale), "cpu", process_set) \
        if flats else []

    def finish(results: list[np.ndarray]) -> Any:
        out: list[Any] = [None] * len(arrays)
        for members, result in zip(by_dtype.values(), results):
            offset = 0
            for index in members:
                shape, size = arrays[index].shape, arrays[index].size
                out[index] = jnp.asarray(result[offset:offset + size].reshape(shape))
                offset += size
        return jax.tree_util.tree_unflatten(treedef, out)
    return handle(handles, finish)
