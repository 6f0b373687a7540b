"""Handles: what an async collective returns, completed by the runtime thread."""
from __future__ import annotations

import threading
from typing import Any, Callable


class Handle:
    """Completion of one submitted tensor. ``wait()`` returns the result or raises.

    A bare lock, held until finish(), is the cheapest cross-thread signal Python has
    (an Event adds a Condition); it keeps the small-tensor latency down.
    """

    __slots__ = ("name", "_lock", "_done", "_result", "_error", "_on_wait")

    def __init__(self, name: str, on_wait: Callable[[], None] | None = None) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._lock.acquire()
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._on_wait = on_wait

    def done(self) -> bool:
        return self._done

    def wait(self, timeout: float | None = None) -> Any:
        if not self._done:
            if self._on_wait is not None:
                self._on_wait()  # the caller is blocked now: no point batching longer
            if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
                raise TimeoutError(f"collective on '{self.name}' did not finish in {timeout} s")
            self._lock.release()  # let other waiters through too
        if self._error is not None:
            raise self._error
        return self._result

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result = result
        self._error = error
        self._done = True
        self._lock.release()
