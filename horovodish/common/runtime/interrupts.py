"""Holding back Ctrl-C while the main thread runs part of a collective.

A caller blocked on a handle runs negotiation cycles itself (runtime.py), so a
KeyboardInterrupt could land in the middle of a cycle: between two barriers of a
shared-memory reduce, say, and the other ranks would wait in that barrier forever.
While the main thread is inside such a critical section, SIGINT is only recorded, and
raised as KeyboardInterrupt when the section ends. Python runs signal handlers in the
main thread only, so other threads never need this.

Installed at init() only over Python's default handler (a handler of the application's
own is left alone; the main thread then does not run cycles itself, nor while any other
signal has a Python handler: only SIGINT is held back). Swapping the
handler per cycle would cost microseconds; a flag costs nanoseconds.
"""
from __future__ import annotations

import _signal
import signal
import threading
from types import FrameType

MAIN_THREAD = threading.main_thread().ident

# Nesting depth of critical sections on the main thread. Public so that a caller can
# change it inline: a signal handler that raises (an application's, for another signal)
# runs as a call such as enter() returns, and would leave the count up with no leave()
# to come, after which every Ctrl-C would only be recorded.
depth = 0
_pending = False  # a SIGINT arrived during one


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _pending
    if depth:
        _pending = True
        return
    signal.default_int_handler(signum, frame)


def install() -> None:
    """Take over SIGINT if Python's default handler has it (main thread only)."""
    if threading.get_ident() == MAIN_THREAD and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)


_SIGINT = int(signal.SIGINT)
# Signals whose Python-level handlers (if any) could raise in the main thread.
_OTHERS = [int(getattr(signal, name)) for name in
           ("SIGTERM", "SIGALRM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
           if hasattr(signal, name)]


# _signal's own getsignal: signal.getsignal wraps it to turn SIG_DFL / SIG_IGN into enum
# members (microseconds a call), and safe_to_drive asks for seven on every blocking wait.
_raw_handler = _signal.getsignal


def installed() -> bool:
    return _raw_handler(signal.SIGINT) is _on_sigint


def safe_to_drive() -> bool:
    """Whether the main thread may run a cycle: SIGINT is ours, and no other signal has
    a Python handler, which could raise (SIGTERM -> sys.exit, say) in mid-cycle."""
    if _raw_handler(_SIGINT) is not _on_sigint:
        return False
    for signum in _OTHERS:
        if callable(_raw_handler(signum)):
            return False
    return True


def enter() -> None:
    """Start a critical section (main thread)."""
    global depth
    depth += 1


def held_back() -> bool:
    """Whether a SIGINT waits for the critical section to end."""
    return _pending


def leave() -> None:
    """End one; raises the KeyboardInterrupt held back during it, once none is left."""
    global depth
    depth -= 1
    raise_held_back()


def raise_held_back() -> None:
    """Once no critical section is left: raise the KeyboardInterrupt held back."""
    global _pending
    if not depth and _pending:
        _pending = False
        raise KeyboardInterrupt
