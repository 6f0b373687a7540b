"""Handles of the JAX adapter's asynchronous collectives: ``synchronize(handle)`` returns
the result as JAX arrays."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ..common.handles import Handle as _CoreHandle, wait_all
from .views import wait_for_device


class Handle:
    """An asynchronous collective's completion: ``synchronize(handle)`` returns its
    result as JAX arrays (or raises the error the negotiation or backend produced)."""

    def __init__(self, handles: Sequence[_CoreHandle], finish: Callable[[list], Any]) -> None:
        self._handles, self._finish = list(handles), finish

    def done(self) -> bool:
        return all(h.done() for h in self._handles)

    def wait(self) -> Any:
        results = wait_all(self._handles)  # every one waited: no name stays in flight
        wait_for_device(self._handles)  # results in device memory: JAX reads them next
        return self._finish(results)
