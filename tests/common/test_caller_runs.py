"""A caller blocked on a handle runs negotiation cycles on its own thread (runtime.py)."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from horovodish.common import interrupts
from multirank import assert_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "caller_runs_worker.py"


@pytest.mark.parametrize("np_", [2, 3])
def test_a_late_peer_hands_the_negotiation_to_the_runtime_thread(np_):
    result = run_ranks(WORKER, np_, args=["late"], timeout=120)
    assert_ok(result)
    for rank in range(np_):
        assert f"rank {rank} ok" in result.stdout, result.stdout


def test_ctrl_c_interrupts_a_wait_but_never_a_cycle_half_done():
    result = run_ranks(WORKER, 2, args=["sigint"], timeout=120)
    assert_ok(result)
    assert "rank 0 ok" in result.stdout and "rank 1 ok" in result.stdout, result.stdout


def test_a_storm_of_ctrl_c_keeps_critical_sections_balanced():
    result = run_ranks(WORKER, 1, args=["storm"], timeout=120)
    assert_ok(result)
    assert "rank 0 ok" in result.stdout, result.stdout


def test_work_nobody_waits_on_yet_starts_without_the_idle_timeout():
    result = run_ranks(WORKER, 2, args=["idle"], timeout=120)
    assert_ok(result)
    assert "rank 0 ok" in result.stdout and "rank 1 ok" in result.stdout, result.stdout


def test_a_cycle_failing_on_the_thread_stops_the_runtime_before_a_caller_can_drive():
    result = run_ranks(WORKER, 1, args=["thread_failure"], timeout=120)
    assert_ok(result)
    assert "rank 0 ok" in result.stdout, result.stdout


def test_main_thread_drives_only_without_other_python_signal_handlers():
    watched = [signal.SIGINT, *interrupts._OTHERS]  # pytest-timeout may hold SIGALRM
    previous = {signum: signal.getsignal(signum) for signum in watched}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in interrupts._OTHERS:
        signal.signal(signum, signal.SIG_DFL)
    try:
        interrupts.install()
        assert interrupts.safe_to_drive()
        signal.signal(signal.SIGTERM, lambda signum, frame: None)  # could raise SystemExit
        assert not interrupts.safe_to_drive()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        assert interrupts.safe_to_drive()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_sigint_is_held_back_inside_a_critical_section_only():
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupts.install()
        assert interrupts.installed()
        interrupts.enter()
        interrupts.enter()  # nested
        os.kill(os.getpid(), signal.SIGINT)  # handled before the next line: recorded only
        interrupts.leave()  # still inside the outer section
        with pytest.raises(KeyboardInterrupt):
            interrupts.leave()
        with pytest.raises(KeyboardInterrupt):  # outside: at once, as Python's own
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
        interrupts.enter()
        interrupts.leave()  # nothing held back: nothing raised
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_applications_own_sigint_handler_is_left_alone():
    previous = signal.getsignal(signal.SIGINT)

    def own(signum, frame):
        pass
    signal.signal(signal.SIGINT, own)
    try:
        interrupts.install()
        assert signal.getsignal(signal.SIGINT) is own and not interrupts.installed()
    finally:
        signal.signal(signal.SIGINT, previous)
