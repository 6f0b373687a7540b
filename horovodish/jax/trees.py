"""Pytrees: ``broadcast_parameters``, and a pytree reduced as one operation per dtype:
its leaves of each dtype are laid end to end in one flat buffer (one copy), which the
core negotiates as one tensor (one name, one response-cache bit), and the results are
cut back into the tree's shapes.

In host memory each leaf starts on an ALIGN boundary of the flat buffer (the gaps are
zeros, reduced with the rest): its part of the result is then memory JAX adopts as it
is, with no copy out (views.jax_array). Leaves on a CUDA device are concatenated there
(by JAX) and their parts sliced there."""
from __future__ import annotations

from itertools import accumulate
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..common.api import collectives as core
from ..common.api.process_sets import ProcessSet, global_process_set
from ..common.execution.buffers import ALIGN
from ..common.messages import ReduceOp, RequestType
from .handles import Handle
from .views import View, host_empty, view


def _host_offsets(views: list[View], members: list[int], itemsize: int
                  ) -> tuple[list[int], int]:
    """Each member's offset in the flat buffer (in elements, ALIGN-aligned) and its size."""
    step = max(1, ALIGN // itemsize)
    offsets, end = [], 0
    for index in members:
        start = -(-end // step) * step
        offsets.append(start)
        end = start + views[index].array.size
    return offsets, end


def _pack(leaves: list[Any], views: list[View], members: list[int]
          ) -> tuple[View, Any, Any, list[int]]:
    """The flat input of one group of leaves (same dtype and memory), its output, and
    each member's offset in it."""
    if views[members[0]].on_device:
        offsets = list(accumulate((views[i].array.size for i in members[:-1]), initial=0))
        if len(members) == 1:
            flat = views[members[0]]
        else:
            flat = view(jnp.concatenate([jnp.ravel(leaves[i]) for i in members]),
                        "allreduce", RequestType.ALLREDUCE)
        return flat, flat.array, flat.empty(flat.array.shape), offsets
    dtype = views[members[0]].array.dtype
    offsets, total = _host_offsets(views, members, dtype.itemsize)
    if len(members) == 1:  # one leaf: reduced from its own memory, into a new array
        first = views[members[0]]
        return first, first.array.reshape(-1), host_empty((total,), dtype), offsets
    flat = output = host_empty((total,), dtype)  # a fresh concatenation: reduced in place
    end = 0
    for index, offset in zip(members, offsets):
        flat[end:offset] = 0
        end = offset + views[index].array.size
        flat[offset:end] = views[index].array.reshape(-1)
    return views[members[0]], flat, output, offsets


def allreduce_tree(tree: Any, op: ReduceOp, name: str | None, prescale: float,
                   postscale: float, process_set: ProcessSet) -> Handle:
    """Submit the tree's reduction; the handle returns the reduced tree."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    views = [view(leaf, "allreduce", RequestType.ALLREDUCE, op) for leaf in leaves]
    groups: dict[tuple[np.dtype, str], list[int]] = {}
    for index, leaf_view in enumerate(views):
        groups.setdefault((leaf_view.array.dtype, leaf_view.device), []).append(index)
    base = name if name is not None else core.auto_name("allreduce", process_set)
    packed, submits = [], {}
    for number, ((_, device), members) in enumerate(groups.items()):
        like, flat, output, offsets = _pack(leaves, views, members)
        # Named by number, not dtype: a dtype that differs between ranks is then a
        # mismatch every rank reports, not two names that never meet.
        entry = f"{base}.{number}"
        packed.append((members, offsets, like, entry))
        submit = submits.setdefault(device, ([], [], []))
        for part, item in zip(submit, (flat, output, entry)):
            part.append(item)
    handles = {}  # one submission per memory: the group's tensors negotiate together
    for device, (flats, outputs, names) in submits.items():
        handles.update(zip(names, core.grouped_allreduce_async(
            flats, outputs, names, op, float(prescale), float(postscale), device,
            process_set)))

    def finish(results: list[Any]) -> Any:
        out: list[Any] = [None] * len(leaves)
        for (members, offsets, like, _), result in zip(packed, results):
            if like.on_device:  # one import of the flat result, sliced on the device
                whole = like.result(result).reshape(-1)
                for index, offset in zip(members, offsets):
                    shape, size = views[index].array.shape, views[index].array.size
                    out[index] = whole[offset:offset + size].reshape(shape)
                continue
            for index, offset in zip(members, offsets):
                shape, size = views[index].array.shape, views[index].array.size
                out[index] = views[index].result(result[offset:offset + size].reshape(shape))
        return jax.tree_util.tree_unflatten(treedef, out)
    return Handle([handles[entry] for *_, entry in packed], finish)


def broadcast_parameters(params: Any, root_rank: int = 0,
                         process_set: ProcessSet = global_process_set) -> Any:
    """The root's pytree on every rank (one broadcast per leaf, in one submission)."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    views = [view(leaf, "broadcast_parameters", RequestType.BROADCAST) for leaf in leaves]
    handles = [core.broadcast_async(v.array, v.empty(v.array.shape), root_rank,
                                    f"broadcast_parameters.{i}", v.device, process_set)
               for i, v in enumerate(views)]
    results = Handle(handles, lambda results: results).wait()
    return jax.tree_util.tree_unflatten(treedef, [v.result(r) for v, r in zip(views, results)])
