"""The runtime thread's alarm (alarm.py): both kinds wake at the time armed, earlier
when asked, later when moved on, and do nothing once closed."""
from __future__ import annotations

import threading
import time

import pytest

from horovodish.common.runtime.alarm import ConditionAlarm, TimerfdAlarm, _TIMERFD, make_alarm

KINDS = [ConditionAlarm] + ([TimerfdAlarm] if _TIMERFD is not None else [])


def _waited(alarm) -> float:
    start = time.monotonic()
    alarm.wait()
    return time.monotonic() - start


@pytest.mark.parametrize("kind", KINDS)
def test_wakes_at_the_time_set(kind):
    alarm = kind()
    alarm.set(time.monotonic() + 0.03)
    assert 0.028 <= _waited(alarm) < 0.5
    alarm.close()


@pytest.mark.parametrize("kind", KINDS)
def test_wake_by_from_another_thread_brings_it_forward_but_never_back(kind):
    alarm = kind()
    alarm.set(time.monotonic() + 5.0)
    timer = threading.Timer(0.02, lambda: alarm.wake_by(time.monotonic() + 0.01))
    start = time.monotonic()  # before the timer starts: a loaded machine may delay what
    timer.start()             # follows, never the timer's 0.02 s plus 0.01
    alarm.wait()
    assert 0.028 <= time.monotonic() - start < 1.0  # not 5 s
    alarm.set(time.monotonic() + 0.03)
    alarm.wake_by(time.monotonic() + 2.0)  # later than armed: ignored
    assert _waited(alarm) < 1.0
    alarm.close()


@pytest.mark.parametrize("kind", KINDS)
def test_set_moves_it_on_and_a_closed_alarm_ignores_everything(kind):
    alarm = kind()
    now = time.monotonic()
    alarm.set(now + 0.005)
    alarm.set(now + 0.05)  # moved on before it went off
    assert 0.045 <= _waited(alarm) < 1.0
    alarm.close()
    alarm.set(0.0)
    alarm.wake_by(0.0)


def test_linux_gets_the_kernel_timer():
    if _TIMERFD is None:
        pytest.skip("no timerfd in this libc")
    assert isinstance(make_alarm(), TimerfdAlarm)
