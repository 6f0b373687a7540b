"""Waking the runtime thread at a set time, without waking it now.

Why not a Condition: every wake-up of the runtime thread costs the thread that runs the
collective a GIL hand-off each way, and on a small VM a futex wake is slow. A
submit used to wake the idle thread at once so that it could wait out the cycle time
(work nobody waits on must still start within it); in a submit-and-wait loop the
caller then takes the work itself, and the woken thread only fought it for the GIL (a
small allreduce took half as long again: docs/tuning.md). With a kernel timer (Linux
timerfd, through ctypes: no compiler) a submit only says when the thread must look, a
caller that took the work moves that time on, and the thread sleeps through it all.

Where timerfd is missing, ``ConditionAlarm`` does the same with a Condition: correct,
but each earlier time wakes the thread to re-time its wait, as before.

Protocol: the owner changes the state the thread looks at and calls ``wake_by`` /
``set`` under one lock of its own, and the thread computes its next time from that state
under the same lock, calls ``set``, leaves the lock, and calls ``wait``. So the time
armed always reflects the latest state; a wait may return early (a stale expiry), never
late, and the thread then simply looks again.
"""
from __future__ import annotations

import ctypes
import math
import os
import threading
import time

_CLOCK_MONOTONIC = 1  # time.monotonic's clock on Linux
_TFD_CLOEXEC = 0o2000000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _load_timerfd():
    """libc's timerfd_create and timerfd_settime, or None where there are none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        create, settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    create.argtypes = [ctypes.c_int, ctypes.c_int]
    settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                        ctypes.c_void_p]
    return create, settime


_TIMERFD = _load_timerfd()


class TimerfdAlarm:
    """A kernel timer the thread blocks on in ``os.read`` (the GIL released)."""

    def __init__(self) -> None:
        create, self._settime = _TIMERFD
        fd = create(_CLOCK_MONOTONIC, _TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self._fd = fd
        self._spec = _Itimerspec()
        self._spec_ref = ctypes.byref(self._spec)
        self.deadline = math.inf  # time.monotonic() of the armed expiry

    def wake_by(self, deadline: float) -> None:
        """The thread must look by deadline (time.monotonic()); never later than armed."""
        if deadline < self.deadline:
            self._arm(deadline)

    def set(self, deadline: float) -> None:
        """The thread has nothing to do before deadline: arm exactly that (later too).
        Always armed anew: an expiry already read leaves nothing to wait for."""
        self._arm(deadline)

    def _arm(self, deadline: float) -> None:
        if self._fd < 0:  # closed: the thread has exited
            return
        # The time recorded is never earlier than the one armed, whatever this is
        # interrupted by (a Ctrl-C is raised after a call returns): at worst a later
        # wake_by arms again for nothing, never skips an arming it needed.
        self.deadline = max(self.deadline, deadline)
        # Relative, at least 1 ns: an all-zero value would disarm the timer.
        delay = min(max(deadline - time.monotonic(), 1e-9), 3600.0)
        seconds = int(delay)
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = seconds, max(1, int((delay - seconds) * 1e9))
        if self._settime(self._fd, 0, self._spec_ref, None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self.deadline = deadline

    def wait(self) -> None:
        """Block until the armed time (at once if it passed since it was armed)."""
        os.read(self._fd, 8)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class ConditionAlarm:
    """The portable fallback: a Condition the thread waits on until the armed time."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self.deadline = math.inf

    def wake_by(self, deadline: float) -> None:
        if deadline < self.deadline:
            with self._cv:
                self.deadline = deadline
                self._cv.notify()

    def set(self, deadline: float) -> None:
        if deadline < self.deadline:
            self.wake_by(deadline)
        else:  # later: the thread wakes at the earlier time and looks again
            self.deadline = deadline

    def wait(self) -> None:
        with self._cv:
            while (remaining := self.deadline - time.monotonic()) > 0:
                self._cv.wait(remaining)

    def close(self) -> None:
        pass


def make_alarm() -> TimerfdAlarm | ConditionAlarm:
    """A timerfd alarm where the kernel has timerfd, else the Condition fallback."""
    if _TIMERFD is not None:
        try:
            return TimerfdAlarm()
        except OSError:
            pass
    return ConditionAlarm()
