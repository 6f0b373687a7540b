"""Process sets. Only the global set exists so far (Horovod's default for every call)."""
from __future__ import annotations


class ProcessSet:
    """A group of ranks that runs collectives among themselves."""

    def __init__(self, ranks: list[int] | None = None) -> None:
        self.ranks = ranks

    def __repr__(self) -> str:
        return f"ProcessSet(ranks={self.ranks})"


global_process_set = ProcessSet(None)


def check_process_set(process_set: ProcessSet) -> None:
    if process_set is not global_process_set:
        raise NotImplementedError("process sets other than global_process_set are not supported yet")
