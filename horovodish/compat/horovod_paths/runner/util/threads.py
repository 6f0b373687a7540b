"""Horovod import path (a shim): Horovod's ``horovod.runner.util.threads``: start a function in a background thread,
now or once an event is set (Horovod's test utilities and some launch scripts use them)."""
from __future__ import annotations

import threading
from typing import Any, Callable


def in_thread(target: Callable[..., Any], args: tuple = (), name: str | None = None,
              daemon: bool = True, silent: bool = False) -> threading.Thread:
    """Run target(*args) in a new thread, started before returning it. silent: an
    exception target raises ends the thread quietly instead of being printed."""
    if not isinstance(args, tuple):
        raise ValueError(f"in_thread: args must be a tuple, not {type(args).__name__} "
                         "(one argument: (arg,))")
    run = target
    if silent:
        def run(*call_args: Any) -> None:
            try:
                target(*call_args)
            except Exception:
                pass
    thread = threading.Thread(target=run, args=args, name=name, daemon=daemon)
    thread.start()
    return thread


def on_event(event: threading.Event, func: Callable[..., Any], args: tuple = (),
             stop: threading.Event | None = None, check_stop_interval_s: float = 1.0,
             daemon: bool = True, silent: bool = False) -> threading.Thread:
    """Run func(*args) in a thread once event is set; never, if stop is set first (it is
    looked at every check_stop_interval_s). A thread that is not a daemon needs a stop
    event, or it could keep the process alive for ever."""
    if event is None:
        raise ValueError("on_event: event must not be None")
    if not isinstance(args, tuple):
        raise ValueError(f"on_event: args must be a tuple, not {type(args).__name__} "
                         "(one argument: (arg,))")
    if stop is None and not daemon:
        raise ValueError("on_event: a thread that is not a daemon needs a stop event")

    def wait_then_run() -> None:
        if stop is None:
            event.wait()
        else:
            while not event.is_set() and not stop.is_set():
                event.wait(timeout=check_stop_interval_s)
            if stop.is_set():
                return
        func(*args)
    return in_thread(wait_then_run, daemon=daemon, silent=silent)
