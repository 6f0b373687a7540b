"""broadcast_object / allgather_object for any framework: pickle to bytes, move bytes."""
from __future__ import annotations

from typing import Any

import cloudpickle
import numpy as np

from . import basics, collectives


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    """root_rank's obj on every rank (cloudpickle, so lambdas and closures travel too)."""
    name = name or collectives.auto_name("broadcast_object")
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8) \
        if basics.rank() == root_rank else np.empty(0, dtype=np.uint8)
    length = np.array([payload.size], dtype=np.int64)
    collectives.broadcast_async(length, length, root_rank, f"{name}.size").wait()
    data = np.empty(int(length[0]), dtype=np.uint8)
    if basics.rank() == root_rank:
        data[:] = payload
    collectives.broadcast_async(data, data, root_rank, f"{name}.data").wait()
    return obj if basics.rank() == root_rank else cloudpickle.loads(data.tobytes())


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:
    """Every rank's obj, in rank order, on every rank."""
    name = name or collectives.auto_name("allgather_object")
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    sizes = collectives.allgather_async(np.array([payload.size], dtype=np.int64),
                                        lambda shape: np.empty(shape, dtype=np.int64),
                                        f"{name}.size").wait()
    data = collectives.allgather_async(payload, lambda shape: np.empty(shape, dtype=np.uint8),
                                       f"{name}.data").wait()
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [cloudpickle.loads(data[offsets[i]:offsets[i + 1]].tobytes())
            for i in range(len(sizes))]
