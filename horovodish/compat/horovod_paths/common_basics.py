"""Horovod import path (a shim; nothing here is horovodish's own logic): Horovod's
``horovod.common.basics``: the object behind each framework's
``mpi_ops._basics``.

Horovod's own test suites read the process-set table through two of its private
methods; scripts that copied them keep working. Every public name (``size``, ``rank``,
``init``, ...) is the package API's.
"""
from __future__ import annotations

from typing import Any

from mpi4py import MPI

from ...common import api


class HorovodBasics:
    """Horovod's wrapper of its C library, here over horovodish's state."""

    def __init__(self, *library: Any) -> None:
        """Horovod's takes the path and name of its compiled library: ignored."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in api.__all__:
            raise AttributeError(name)
        return getattr(api, name)

    def _get_process_set_ids_and_ranks(self) -> dict[int, list[int]]:
        """{process set id: its world ranks} for every registered set, the global set
        (0) included, by id."""
        table = api.state().process_sets
        return {set_id: list(table[set_id].ranks) for set_id in sorted(table)}

    def _comm_process_set_id(self, comm: MPI.Comm) -> int:
        """The id of the registered set whose ranks are comm's."""
        state = api.state()
        ranks = sorted(MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())),
                                                 state.manage_comm.Get_group()))
        for set_id, process_set in state.process_sets.items():
            if process_set.ranks == ranks:
                return set_id
        raise ValueError(f"no registered process set has the ranks of this communicator "
                         f"({ranks}); register it with hvd.init(process_sets=...) first.")


_basics = HorovodBasics()
