"""broadcast_object / allgather_object for any framework: pickle to bytes, move bytes."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

try:  # lambdas and closures travel too; plain pickle where cloudpickle is missing
    import cloudpickle as _pickler
except ImportError:  # (a bare machine's own Python, such as the GPU machine's)
    import pickle as _pickler

from . import collectives
from .process_state import rank
from .process_sets import ProcessSet


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet | None = None) -> Any:
    """root_rank's obj on every rank (cloudpickle, so lambdas and closures travel too)."""
    process_set = collectives.resolve(process_set)
    name = name or collectives.auto_name("broadcast_object", process_set)
    is_root = rank() == root_rank
    payload = np.frombuffer(_pickler.dumps(obj), dtype=np.uint8) if is_root \
        else np.empty(0, dtype=np.uint8)
    length = np.array([payload.size], dtype=np.int64)
    collectives.broadcast_async(length, length, root_rank, f"{name}.size",
                                process_set=process_set).wait()
    data = payload.copy() if is_root else np.empty(int(length[0]), dtype=np.uint8)
    collectives.broadcast_async(data, data, root_rank, f"{name}.data",
                                process_set=process_set).wait()
    return obj if is_root else _pickler.loads(data.tobytes())


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet | None = None) -> list[Any]:
    """Every rank's obj, in rank order, on every rank (of the set)."""
    process_set = collectives.resolve(process_set)
    name = name or collectives.auto_name("allgather_object", process_set)
    payload = np.frombuffer(_pickler.dumps(obj), dtype=np.uint8)
    sizes = collectives.allgather_async(np.array([payload.size], dtype=np.int64),
                                        lambda shape: np.empty(shape, dtype=np.int64),
                                        f"{name}.size", process_set=process_set).wait()
    data = collectives.allgather_async(payload, lambda shape: np.empty(shape, dtype=np.uint8),
                                       f"{name}.data", process_set=process_set).wait()
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [_pickler.loads(data[offsets[i]:offsets[i + 1]].tobytes())
            for i in range(len(sizes))]


def check_same_layout(arrays: Sequence[Any], root_rank: int, what: str, name: str,
                      ready: bool = True, unit: tuple[str, str] = ("variable", "variables"),
                      fix: str = "the same model and optimizer") -> list[int]:
    """Collective: the ranks agree that their arrays (anything with ``shape`` and
    ``dtype``) line up with root_rank's (count, shapes, dtypes) before a broadcast, which
    with unequal lists would leave ranks waiting for good on broadcasts the root never
    makes. Returns the ranks that are not ``ready`` (then nothing is compared);
    otherwise raises a ValueError on every rank naming the first array that differs.
    ``unit`` (singular, plural) and ``fix`` are the adapter's words for them."""
    layout = [(tuple(a.shape), str(a.dtype)) for a in arrays]
    everyone = allgather_object((ready, layout), name)
    unready = [rank for rank, (is_ready, _) in enumerate(everyone) if not is_ready]
    if unready:
        return unready
    root = everyone[root_rank][1]
    for rank, (_, theirs) in enumerate(everyone):
        if theirs != root:
            first = next((i for i, (a, b) in enumerate(zip(root, theirs)) if a != b),
                         min(len(root), len(theirs)))
            raise ValueError(
                f"{what}: rank {root_rank} has {len(root)} {unit[1]}, rank {rank} has "
                f"{len(theirs)}; first difference at {unit[0]} {first}: "
                f"{root[first] if first < len(root) else 'none'} against "
                f"{theirs[first] if first < len(theirs) else 'none'}. Every rank must create "
                f"the same {unit[1]} ({fix}), in the same order.")
    return []
