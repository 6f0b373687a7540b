"""A caller blocked on a handle runs negotiation cycles on its own thread (runtime.py)."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from horovodish.common.runtime import interrupts
from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "caller_runs_worker.py"


# (worker mode, ranks): what each checks is in the worker's docstring; the mode is the
# name of the one check the worker runs.
CASES = {
    "a late peer hands the negotiation to the runtime thread (2 ranks)": ("late", 2),
    "a late peer hands the negotiation to the runtime thread (3 ranks)": ("late", 3),
    "Ctrl-C interrupts a wait but never a cycle half done": ("sigint", 2),
    "a storm of Ctrl-C keeps critical sections balanced": ("storm", 1),
    "an application's raising SIGINT handler never orphans a group's names":
        ("app_storm", 1),
    "a Ctrl-C storm on one of two ranks leaves the runtime working": ("shared_storm", 2),
    "work nobody waits on yet starts without the idle timeout": ("idle", 2),
    "a submit-and-wait loop leaves the runtime thread asleep": ("quiet", 2),
    "a blocking call arms no timer, and wakes the thread when it cannot drive":
        ("waited", 2),
    "idle ranks begin no negotiation, and join those a peer begins": ("joins", 2),
    "a cycle failing on the thread stops the runtime before a caller drives":
        ("thread_failure", 1),
}


@pytest.mark.parametrize("mode,ranks", list(CASES.values()), ids=list(CASES))
def test_caller_runs(mode: str, ranks: int):
    assert_ranks_ok(run_ranks(WORKER, ranks, args=[mode], timeout=120), ranks, [mode])


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
