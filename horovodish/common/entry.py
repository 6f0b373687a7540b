"""An entry: a request plus the tensor views it reads and writes; it is its own handle.

One object per submitted tensor rather than an entry pointing at a handle: a burst of
hundreds of small tensors pays every object and attribute hop per tensor.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .handles import Completions, Handle
from .messages import Request


class Entry(Handle):
    """What the runtime needs of a submitted tensor; the caller waits on it as a Handle.

    Known-shape outputs (allreduce, broadcast, reducescatter) are allocated at submit;
    allgather and alltoall learn their output shape from the response and ask
    ``allocate``. An allreduce, broadcast or reducescatter without an output, and an
    allgather without ``allocate``, get a view of a runtime-owned block (host memory).
    """

    # event: for CUDA views, the CUDA event recorded on the caller's stream at submit,
    # replaced at completion by the event that marks the result ready on the device
    # (the caller's stream waits on it in synchronize); None for host memory.
    __slots__ = ("request", "tensor", "output", "allocate", "event")

    def __init__(self, request: Request, tensor: np.ndarray | None, completions: Completions,
                 output: np.ndarray | None = None,
                 allocate: Callable[[tuple[int, ...]], np.ndarray] | None = None,
                 event: Any = None) -> None:
        # Handle's fields set here rather than through super().__init__: one call fewer.
        self.name = request.name
        self._completions = completions
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None
        self.request = request
        self.tensor = tensor
        self.output = output
        self.allocate = allocate
        self.event = event

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """Also drops the tensors: the caller may keep the handle long after.
        (finish_all inlines this for whole groups: keep the two in step.)"""
        self._result = result
        self._error = error
        self.tensor = self.output = self.allocate = None
        self._done = True


def finish_all(entries: list[Entry | None], results: list[Any]) -> None:
    """finish(result) for each entry of a group (None: a joined rank's), inlined: the
    method call is half the cost of finishing one of hundreds of small tensors."""
    for entry, result in zip(entries, results):
        if entry is not None:
            entry._result = result
            entry._error = None
            entry.tensor = entry.output = entry.allocate = None
            entry._done = True
