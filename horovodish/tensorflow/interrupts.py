"""A Ctrl-C or a timeout alarm stops the collectives a graph is waiting in.

While a ``tf.compat.v1`` session.run (or a tf.function call) holds the main thread in
TensorFlow's C++ code, our op bodies wait for their collectives on TensorFlow's threads.
Python runs signal handlers on the main thread only, between bytecodes, so a Ctrl-C, or a
test runner's timeout alarm, waited for the collective, which waits for ranks that may
never come (one that failed a check and went elsewhere): the job hung for good.

So the first graph collective built on the main thread sets the signal module's wakeup fd
(unless the application set one), and a graph-mode wait looks at it between slices of
waiting: SIGINT or SIGALRM arriving meanwhile fails the op, TensorFlow returns to the
main thread, and its handler runs. (Not SIGTERM, whose handlers often only ask for a clean
stop after the current step, nor profilers' SIGPROF and SIGVTALRM.) The collective stays
submitted (its name in flight) and completes, unread, once every rank submits it. Waits
on the main thread itself are left alone: handlers run there anyway.
"""
from __future__ import annotations

import os
import signal
import threading

from ..common.handles import Handle

_STOPPING = frozenset({signal.SIGINT, signal.SIGALRM})
_SLICE = 0.2  # seconds between looks at the pipe; a collective that finishes wakes at once

_lock = threading.Lock()
_read_fd: int | None = None
_tried = False
_generation = 0  # stopping signals seen so far
_last: int | None = None


def install() -> None:
    """Point the wakeup fd at our pipe: once, from the main thread, if nobody else did."""
    global _read_fd, _tried
    if _tried or threading.current_thread() is not threading.main_thread():
        return
    _tried = True
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    if previous != -1:  # the application's (asyncio's, say): leave it be
        signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        return
    _read_fd = read_fd


def _drain() -> int:
    """Count the stopping signals written since the last look; the current generation."""
    global _generation, _last
    if _read_fd is None:
        return _generation
    with _lock:
        while True:
            try:
                data = os.read(_read_fd, 512)
            except BlockingIOError:
                break
            stopping = [s for s in data if s in _STOPPING]
            if stopping:
                _generation += len(stopping)
                _last = stopping[-1]
            if len(data) < 512:
                break
        return _generation


class Interrupted(RuntimeError):
    """A graph-mode wait gave up on a signal for the main thread (see above)."""


def wait(handle: Handle) -> object:
    """handle.wait(), failing if a stopping signal arrives meanwhile (see above)."""
    if _read_fd is None or threading.current_thread() is threading.main_thread():
        return handle.wait()
    start = _drain()  # signals from before this wait were handled already
    while True:
        try:
            return handle.wait(_SLICE)
        except TimeoutError:
            pass
        if _drain() != start:
            name = signal.Signals(_last).name if _last is not None else "a signal"
            raise Interrupted(
                f"stopped waiting for the collective on '{handle.name}': {name} arrived "
                "for the main thread while a TensorFlow graph waited in it. It stays "
                "submitted, and completes once every rank submits it.")
