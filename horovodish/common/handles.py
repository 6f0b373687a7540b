"""Handles: what an async collective returns, completed by the runtime thread.

A burst of small tensors creates and finishes hundreds of handles per cycle, so a handle
holds no lock of its own: the runtime thread finishes handles by setting fields and then
notifies the shared ``Completions`` once per group, and only a caller that actually has
to block waits on its condition. (A lock per handle cost ~1 us to create, acquire and
release per tensor; 256 tensors pay that twice over.)
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable


class Completions:
    """One per runtime: the condition that blocked callers wait on.

    Ordering argument (no lost wake-up): a finisher sets ``_done`` and only then reads
    ``waiters``; a waiter registers in ``waiters`` under the lock and only then tests
    ``_done``. Either the waiter sees the flag, or the finisher sees the waiter and
    notifies under the lock, which it can only take once the waiter is waiting.
    """

    __slots__ = ("_lock", "_cv", "waiters", "_on_wait")

    def __init__(self, on_wait: Callable[[Handle, float | None], None] | None = None) -> None:
        # Entered as the lock itself: its C-level with cannot be torn by a Ctrl-C the
        # way Condition's Python-level __enter__ can (the lock would stay held).
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self.waiters = 0
        self._on_wait = on_wait

    def wait(self, handle: Handle, timeout: float | None) -> bool:
        if self._on_wait is not None:
            # The caller is blocked now: no point batching longer (the runtime may run
            # the cycles on this thread, see Runtime._help).
            start = time.monotonic()
            self._on_wait(handle, timeout)
            if handle._done:
                return True
            if timeout is not None:
                timeout = max(0.0, timeout - (time.monotonic() - start))
        with self._lock:
            self.waiters += 1
            try:
                return self._cv.wait_for(handle.done, timeout)
            finally:
                self.waiters -= 1

    def notify(self) -> None:
        """Call after finishing handles (once for a whole group is enough)."""
        if self.waiters:
            with self._lock:
                self._cv.notify_all()


class Handle:
    """Completion of one submitted tensor. ``wait()`` returns the result or raises."""

    __slots__ = ("name", "_completions", "_done", "_result", "_error")

    def __init__(self, name: str, completions: Completions) -> None:
        self.name = name
        self._completions = completions
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._done

    def wait(self, timeout: float | None = None) -> Any:
        if not self._done and not self._completions.wait(self, timeout):
            raise TimeoutError(f"collective on '{self.name}' did not finish in {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """Set the outcome; the caller then calls ``Completions.notify()``."""
        self._result = result
        self._error = error
        self._done = True
