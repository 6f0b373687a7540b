"""Run the mpirun job in its own process group and pass SIGINT / SIGTERM on to all of it.

Why its own group: a signal for the launcher then reaches mpirun exactly once (from us),
and mpirun (Hydra or Open MPI) relays it to the ranks and cleans up. Both MPIs put each
rank (and Hydra's proxy) in a process group of its own, so ``killpg`` on mpirun's group does
not reach the ranks: when the grace period runs out the launcher SIGKILLs the whole process
tree below mpirun, found through /proc (or ``ps``), and then mpirun's group.
When the launcher runs in the foreground of a terminal, mpirun's group is made the
foreground group (as a shell does for a job): stdin reaches rank 0 and the terminal's
Ctrl-C goes straight to mpirun, exactly as with plain ``mpirun``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

GRACE_SECONDS = 5.0
FORWARDED = (signal.SIGINT, signal.SIGTERM)


def exit_code(returncode: int) -> int:
    """Shell convention: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _children_map() -> dict[int, list[int]]:
    """ppid -> pids of all processes we can see (Linux /proc, else ``ps``)."""
    pairs: list[tuple[int, int]] = []
    if os.path.isdir("/proc/self"):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat", "rb") as f:
                        stat = f.read()
                except OSError:
                    continue
                fields = stat[stat.rfind(b")") + 2:].split()  # after "(comm) "
                pairs.append((int(entry), int(fields[1])))
    else:
        try:
            out = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid="], text=True,
                                 capture_output=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
        pairs = [(int(a), int(b)) for a, b in (ln.split() for ln in out.splitlines() if ln.strip())]
    children: dict[int, list[int]] = {}
    for pid, ppid in pairs:
        children.setdefault(ppid, []).append(pid)
    return children


def descendants(pid: int) -> list[int]:
    """All processes below ``pid``, deepest first (the ranks before their parents)."""
    children = _children_map()
    order, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            order.append(child)
            stack.append(child)
    return order[::-1]


def kill_tree(pid: int) -> None:
    """SIGKILL every process below ``pid``, then ``pid``'s process group."""
    for child in descendants(pid):
        try:
            os.kill(child, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    _killpg(pid, signal.SIGKILL)


def _owns_terminal() -> bool:
    """True when stdin is a terminal whose foreground process group is ours."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def _new_group_in_foreground() -> None:  # runs in the child between fork and exec
    """Own process group, made the terminal's foreground group (as a shell does for a job).

    Why: Hydra forwards stdin to rank 0 only when it is in the foreground; without this,
    ``input()`` or pdb on rank 0 would see EOF. Ctrl-C from the terminal then goes straight
    to mpirun's group, exactly as with plain ``mpirun``.
    """
    os.setpgid(0, 0)
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background tcsetpgrp would stop us
    try:
        os.tcsetpgrp(0, os.getpgrp())
    except OSError:
        pass
    signal.signal(signal.SIGTTOU, old)


def _popen(argv: Sequence[str], env: Mapping[str, str] | None) -> tuple[subprocess.Popen, bool]:
    """Start ``argv`` in a new process group; returns (process, took the terminal)."""
    env = dict(env) if env is not None else None
    if threading.active_count() == 1 and _owns_terminal():  # preexec_fn needs no threads
        return subprocess.Popen(list(argv), env=env, preexec_fn=_new_group_in_foreground), True
    if sys.version_info >= (3, 11):
        return subprocess.Popen(list(argv), env=env, process_group=0), False
    return subprocess.Popen(list(argv), env=env, preexec_fn=os.setpgrp), False


def _take_back_terminal() -> None:
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(0, os.getpgrp())
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


def run_job(argv: Sequence[str], env: Mapping[str, str] | None = None,
            grace: float = GRACE_SECONDS, signals: list[int] | None = None) -> int:
    """Start ``argv`` (no shell) in a new process group, wait, return its exit code.

    SIGINT/SIGTERM received meanwhile are forwarded to mpirun's group; if the job is still
    alive ``grace`` seconds after the first one (or when a second one arrives) the whole
    process tree gets SIGKILL. Those signals are appended to ``signals`` when given (the
    elastic launcher must not restart a job the user stopped).
    """
    state: dict = {"pgid": None, "deadline": None,
                   "signals": signals if signals is not None else []}

    def forward(signum, _frame):  # runs in the main thread, between bytecodes
        state["signals"].append(signum)
        if state["pgid"] is None:
            return  # not started yet: forwarded right after Popen
        if len(state["signals"]) == 1:
            state["deadline"] = time.monotonic() + grace
            _killpg(state["pgid"], signum)
        else:
            kill_tree(state["pgid"])

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    proc, took_terminal = None, False
    try:
        proc, took_terminal = _popen(argv, env)
        state["pgid"] = proc.pid
        if state["signals"] and state["deadline"] is None:  # came before Popen returned
            state["deadline"] = time.monotonic() + grace
            _killpg(proc.pid, state["signals"][0])
        while proc.poll() is None:
            deadline = state["deadline"]
            try:
                proc.wait(timeout=0.5 if deadline is None
                          else max(0.01, min(0.2, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() >= deadline:
                    kill_tree(proc.pid)
                    state["deadline"] = None  # SIGKILL sent; now just wait
    finally:
        if took_terminal:
            _take_back_terminal()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc is not None:
            if proc.poll() is None:  # an exception (not a signal) got us here
                kill_tree(proc.pid)
                proc.wait()
            if state["signals"]:
                _killpg(proc.pid, signal.SIGKILL)  # leftovers of an interrupted job
    code = exit_code(proc.returncode)
    if state["signals"] and code != 0:  # ended by the signal we forwarded: as a shell would
        return 128 + int(state["signals"][0])
    return code

