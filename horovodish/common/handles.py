"""Handles: what an async collective returns, completed by the runtime thread."""
from __future__ import annotations

import threading
from typing import Any, Callable


class Handle:
    """Completion of one submitted tensor. ``wait()`` returns the result or raises."""

    __slots__ = ("name", "_event", "_result", "_error", "_on_wait")

    def __init__(self, name: str, on_wait: Callable[[], None] | None = None) -> None:
        self.name = name
        self._event = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self._on_wait = on_wait

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        if not self._event.is_set():
            if self._on_wait is not None:
                self._on_wait()  # the caller is blocked now: no point batching longer
            if not self._event.wait(timeout):
                raise TimeoutError(f"collective on '{self.name}' did not finish in {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result = result
        self._error = error
        self._event.set()
