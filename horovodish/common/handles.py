"""Handles: what an async collective returns, completed by the runtime thread.

A burst of small tensors creates and finishes hundreds of handles per cycle, so a handle
holds no lock of its own: the runtime thread finishes handles by setting fields and then
notifies the shared ``Completions`` once per group, and only a caller that actually has
to block waits there. (A lock per handle, created, acquired and released per
tensor, was a measurable share of a burst of small tensors.)
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable


class Completions:
    """One per runtime: where callers that have to block on a handle wait.

    Each blocked caller waits on a lock of its own, held by it while it is on the list;
    a finisher takes the whole list and releases every lock on it. The shared lock only
    guards the list, and is only ever entered by C-level ``with``. (A Condition drops
    and re-takes the shared lock in Python code inside its wait: a KeyboardInterrupt
    landing between the two, from an application's SIGINT handler say, made the
    caller's ``with`` release a lock it no longer held, or one the runtime thread held.)

    No lost wake-up: a finisher sets ``_done`` and only then looks at the list; a
    waiter puts itself on the list and only then tests ``_done``. Either the waiter
    sees the flag, or the finisher sees the waiter and releases its lock, which a lock
    remembers even when the waiter has not blocked on it yet. A waiter whose clean-up
    is cut short by a Ctrl-C stays on the list only until the next notify.
    """

    __slots__ = ("_lock", "_waiters", "_on_wait")

    def __init__(self, on_wait: Callable[[Handle, float | None], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._waiters: list[threading.Lock] = []  # each held by its blocked caller
        self._on_wait = on_wait

    @property
    def waiters(self) -> int:
        """Callers blocked right now (or cut short since the last notify)."""
        return len(self._waiters)

    def wait(self, handle: Handle, timeout: float | None) -> bool:
        if self._on_wait is not None:
            # The caller is blocked now: no point batching longer (the runtime may run
            # the cycles on this thread, see Runtime._drive_while_waiting).
            start = time.monotonic()
            self._on_wait(handle, timeout)
            if handle._done:
                return True
            if timeout is not None:
                timeout = max(0.0, timeout - (time.monotonic() - start))
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = threading.Lock()
        waiter.acquire()
        try:
            while True:
                with self._lock:
                    self._waiters.append(waiter)
                if handle._done:
                    return True
                if deadline is None:
                    waiter.acquire()  # re-held once released: ready for the next round
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not waiter.acquire(True, remaining):
                        return handle._done
        finally:
            with self._lock:
                if waiter in self._waiters:  # not taken off by a notify
                    self._waiters.remove(waiter)

    def notify(self) -> None:
        """Call after finishing handles (once for a whole group is enough)."""
        if self._waiters:
            with self._lock:
                woken, self._waiters = self._waiters, []
            for waiter in woken:
                waiter.release()


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


def _wait(handle: Any) -> Any:
    return handle.wait()


def wait_all(handles: Iterable[Any], wait: Callable[[Any], Any] = _wait,
             stop_on: tuple[type[BaseException], ...] = ()) -> list[Any]:
    """Every handle's result, in order: each handle is waited for before the first error
    is raised, so that no name is still in flight when the caller retries or moves on.
    ``wait`` replaces ``handle.wait()`` (an adapter's interruptible wait, say); an
    exception of a type in ``stop_on`` is raised at once (the caller is to stop
    waiting)."""
    results: list[Any] = []
    error: Exception | None = None
    for handle in handles:
        try:
            results.append(wait(handle))
        except stop_on:
            raise
        except Exception as exc:  # noqa: BLE001 - raised once every handle is waited
            results.append(None)
            error = error or exc
    if error is not None:
        raise error
    return results
