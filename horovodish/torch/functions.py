"""Object collectives for torch users (same names as Horovod's)."""
from __future__ import annotations

from typing import Any

from ..common import objects
from ..common.process_sets import ProcessSet, global_process_set


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    return objects.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    return objects.allgather_object(obj, name, process_set)
