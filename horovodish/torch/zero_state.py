"""State dicts of a sharded optimizer (ZeRO): this rank's shards, and the consolidated
form that a plain torch optimizer over the same parameters would produce.

A shard is the range ``[start, start + count)`` of one bucket's flat parameters. Its
optimizer state is a 1-D tensor of ``count`` values per elementwise entry (``exp_avg``,
``momentum_buffer``, ...) and plain values for the rest (``step``). Consolidating
concatenates the ranks' pieces of each bucket and cuts them back into parameters, so
checkpoints move between world sizes (save on 2 ranks, load on 3) and between sharded
and plain optimizers. Pure functions: unit-testable in one process.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

SHARDED_KEY = "zero"  # marks a sharded state dict; holds its layout


def bucket_layout(params: Sequence[int], shapes: Sequence[Sequence[int]], start: int,
                  count: int) -> dict[str, Any]:
    """How one bucket is laid out (stored in sharded state dicts): its parameters (by
    index in the optimizer, as torch's state dicts number them), their shapes, and this
    rank's range of the flat bucket."""
    return {"params": list(params), "shapes": [list(s) for s in shapes], "start": start,
            "count": count}


def _numel(shape: Sequence[int]) -> int:
    total = 1
    for dim in shape:
        total *= int(dim)
    return total


def _elementwise(value: Any, count: int) -> bool:
    """A shard's per-element state entry (one value per element of the shard)."""
    return isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == count


def consolidate(sharded: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's sharded state dict (in any order) -> the consolidated state dict,
    in torch's format: ``state`` keyed by parameter index, tensors shaped as the
    parameters."""
    if not sharded:
        raise ValueError("consolidate: no sharded state dicts given")
    metas = [sd.get(SHARDED_KEY) for sd in sharded]
    if any(meta is None for meta in metas):
        raise ValueError("consolidate: every state dict must be a sharded one (from a "
                         "DistributedOptimizer(shard_optimizer_state=True).state_dict())")
    world = metas[0]["world_size"]
    ranks = sorted(meta["rank"] for meta in metas)
    if ranks != list(range(world)):
        raise ValueError(f"consolidate: need the state dicts of ranks 0..{world - 1} of one "
                         f"job, got ranks {ranks}")
    by_rank = sorted(zip(metas, sharded), key=lambda pair: pair[0]["rank"])
    state: dict[int, dict[str, Any]] = {}
    for index, layout in enumerate(metas[0]["buckets"]):
        pieces = [(meta["buckets"][index], sd["state"].get(index, {})) for meta, sd in by_rank]
        state.update(_consolidate_bucket(layout, pieces))
    return {"state": state, "param_groups": sharded[0]["param_groups"]}


def _consolidate_bucket(layout: dict[str, Any], pieces: list[tuple[dict[str, Any], dict]]
                        ) -> dict[int, dict[str, Any]]:
    keys: list[str] = []
    for _, entries in pieces:
        keys += [k for k in entries if k not in keys]
    if not keys:
        return {}
    sizes = [_numel(s) for s in layout["shapes"]]
    total = sum(sizes)
    whole: dict[str, Any] = {}
    elementwise: set[str] = set()
    for key in keys:
        parts = [(piece["count"], entries.get(key)) for piece, entries in pieces
                 if piece["count"] > 0]
        values = [v for _, v in parts if v is not None]
        if len(values) == len(parts) and all(_elementwise(v, c) for c, v in parts):
            flat = torch.cat([v.detach() for v in values])
            if flat.numel() != total:
                raise ValueError(f"consolidate: the shards of '{key}' hold {flat.numel()} "
                                 f"values for a bucket of {total}")
            whole[key] = flat
            elementwise.add(key)
        else:
            whole[key] = values[0]
    state: dict[int, dict[str, Any]] = {}
    offset = 0
    for index, shape, size in zip(layout["params"], layout["shapes"], sizes):
        # Every tensor its own (a plain optimizer updates "step" in place, per parameter).
        state[index] = {key: whole[key][offset:offset + size].clone().view(shape)
                        if key in elementwise else _copy(value) for key, value in whole.items()}
        offset += size
    return state


def shard_of(consolidated: dict[str, Any], layout: dict[str, Any],
             names: Sequence[str]) -> dict[str, Any]:
    """This rank's shard state of one bucket, cut out of a consolidated state dict.
    ``names``: the bucket's parameter names, for errors."""
    state = consolidated["state"]
    start, count = layout["start"], layout["count"]
    have = [index in state and bool(state[index]) for index in layout["params"]]
    if not any(have):
        return {}
    if not all(have):
        missing = [n for n, h in zip(names, have) if not h]
        raise ValueError(f"load_state_dict: parameters {missing} have no optimizer state "
                         "while others of the same shard do; a sharded optimizer steps every "
                         "parameter together (train the plain optimizer one step on every "
                         "parameter, or start without state).")
    shard: dict[str, Any] = {}
    pieces: dict[str, list[torch.Tensor]] = {}
    offset = 0
    for index, shape, name in zip(layout["params"], layout["shapes"], names):
        size = _numel(shape)
        lo, hi = max(start, offset), min(start + count, offset + size)
        for key, value in state[index].items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.numel() == size:
                if list(value.shape) != list(shape):
                    raise ValueError(f"load_state_dict: state '{key}' of parameter '{name}' "
                                     f"has shape {list(value.shape)}, the parameter "
                                     f"{list(shape)}")
                if lo < hi:
                    pieces.setdefault(key, []).append(
                        value.detach().reshape(-1)[lo - offset:hi - offset])
            elif key in shard and not _same(shard[key], value):
                raise ValueError(f"load_state_dict: state '{key}' differs between parameters "
                                 f"of one shard ({name}); a sharded optimizer keeps one value "
                                 "per shard")
            else:
                shard[key] = _copy(value)
        offset += size
    shard.update({key: torch.cat(parts).clone() for key, parts in pieces.items()})
    return shard


def _copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and bool(torch.equal(a, b))
    return a == b


def state_bytes(state: dict[Any, dict[str, Any]]) -> int:
    """Bytes of every tensor in an optimizer's state (to compare sharded and plain)."""
    return sum(v.numel() * v.element_size() for entries in state.values()
               for v in entries.values() if isinstance(v, torch.Tensor))
