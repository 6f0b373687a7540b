"""The collectives that carry no tensor: barrier, and join (a rank with no more data)."""
from __future__ import annotations

from ...common.api import collectives as core
from ...common.api.process_sets import ProcessSet, global_process_set


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank (of the set) reaches the barrier."""
    core.barrier_async(process_set).wait()


def join(device: int = -1) -> int:
    """Signal that this rank has no more data; allreduces of the others continue with this
    rank contributing zeros. Returns the rank that joined last, once all have joined."""
    return int(core.join_async().wait())
