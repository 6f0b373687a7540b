"""The one way multi-rank workers check results and report them (read by tests/multirank.py).

A worker is a list of named checks (functions) run by ``run_checks``. A failed
comparison is recorded, not raised, so a check goes on and keeps its collectives in
step with the other ranks; an exception ends that check only. Every check runs, and
each prints one line per rank that ``multirank.assert_ranks_ok`` parses::

    CHECK allreduce.sum rank 1/2: ok (12 comparisons)
    CHECK allreduce.sum rank 1/2: FAILED: float32 sum: got [2. 3.], want [2. 4.]
    DONE rank 1/2: 7 passed, 1 failed

Example::

    from worker_support import check, close, expect_error, run_checks

    def allreduce_sum(rank, size):
        got = hvd.allreduce(torch.ones(3), op=hvd.Sum)
        close(got, np.full(3, size), "sum of ones")

    if __name__ == "__main__":
        hvd.init()
        run_checks([allreduce_sum], hvd.rank(), hvd.size())

The ranks meet after each check (an MPI barrier, polled). A rank whose check raised
waits there at most ``STRAGGLER_GRACE_S``: if the others have not finished that check
by then, they are most likely waiting in a collective for it, so it reports that (an
``ABORT`` line, which ``assert_ranks_ok`` puts first) and ends the job with MPI_Abort
rather than leave it hanging until run_ranks' timeout.

A worker whose job goes wrong on purpose (a rank killed, raising, stalling) lists its
*scenarios* instead, and ``run_scenario`` runs the one its first argument names. The
test then reads how the job ended, so a scenario's exceptions are not caught: they end
the rank as they would end a user's script. Comparisons are recorded as in a check and
reported once the scenario returns::

    def raises(rank, size):
        ...

    if __name__ == "__main__":
        run_scenario([killed, raises, stalls])   # python faults_worker.py raises

Tests may also ask a worker for an MPI set-up the machine does not have (an MPI before
version 4, ranks as if on several hosts): through the environment, applied when this
module is imported, so before the worker's ``init()`` (tests/mpi_variants.py).
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any, Callable, Sequence

import numpy as np

import mpi_variants

mpi_variants.apply(os.environ)

# How long a rank whose check raised waits for the other ranks to finish that check
# before it ends the job: far longer than the rest of a check takes once a rank has
# given it up, far shorter than a test's timeout.
STRAGGLER_GRACE_S = 5.0

# Failures of the check or scenario now running, each a line that says what differed.
_failures: list[str] = []
_comparisons = 0


def _report(line: str) -> None:
    # One write per line: mpirun merges ranks' output by chunks (see multirank.py).
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def check(condition: Any, what: str) -> bool:
    """Record a failure unless condition holds; returns whether it held."""
    global _comparisons
    _comparisons += 1
    if not condition:
        _failures.append(what)
    return bool(condition)


def close(got: Any, want: Any, what: str, tol: float = 0.0,
          atol: float | None = None) -> bool:
    """got equals want (same shape); for numbers within tol relative plus atol absolute
    (atol defaults to tol), as numpy's allclose(rtol=tol, atol=atol): exact if both are 0."""
    atol = tol if atol is None else atol
    got_array, want_array = _as_array(got), _as_array(want)
    if got_array.shape != want_array.shape:
        return check(False, f"{what}: shape {got_array.shape}, want {want_array.shape}")
    if got_array.dtype == np.bool_ or want_array.dtype == np.bool_ or tol == atol == 0.0:
        same = np.array_equal(got_array, want_array, equal_nan=got_array.dtype.kind == "f")
    else:
        same = np.allclose(got_array.astype(np.float64), want_array.astype(np.float64),
                           rtol=tol, atol=atol, equal_nan=True)
    return check(same, f"{what}: got {_short(got_array)}, want {_short(want_array)}")


def expect_error(fn: Callable[[], Any], exc_type: type[BaseException] | tuple,
                 *needles: str, what: str = "") -> BaseException | None:
    """fn raises exc_type with every needle in its message; returns the exception."""
    label = what or getattr(fn, "__name__", "call")
    try:
        fn()
    except exc_type as exc:  # noqa: BLE001 (the caller names the type)
        missing = [needle for needle in needles if needle not in str(exc)]
        check(not missing, f"{label}: {missing} not in the message: {exc}")
        # Without its traceback: the traceback holds this frame, which holds exc, a
        # cycle that would keep fn's objects (an optimizer and its hooks) alive until
        # the next garbage collection.
        return exc.with_traceback(None)
    except BaseException as exc:  # noqa: BLE001
        check(False, f"{label}: raised {type(exc).__name__} ({exc}), want {exc_type}")
        return exc
    check(False, f"{label}: raised nothing, want {exc_type}")
    return None


def same_on_every_rank(value: Any, what: str, tol: float = 0.0) -> bool:
    """value is the same on every rank (compared through plain MPI, not horovodish)."""
    from mpi4py import MPI
    mine = _as_array(value)
    everyone = MPI.COMM_WORLD.allgather(mine)
    differing = [rank for rank, theirs in enumerate(everyone)
                 if theirs.shape != mine.shape or not (
                     np.array_equal(theirs, mine) if tol == 0.0 else
                     np.allclose(theirs.astype(np.float64), mine.astype(np.float64),
                                 rtol=tol, atol=tol))]
    return check(not differing, f"{what}: differs from rank(s) {differing}: "
                                f"{_short(mine)} here")


def run_checks(checks: Sequence[Callable[..., Any]], rank: int, size: int,
               *args: Any) -> None:
    """Run every check as check(rank, size, *args), report each, exit 1 if one failed;
    end the job if a check raised and the other ranks do not finish it (see above)."""
    from mpi4py import MPI
    # The ranks meet on a communicator of their own, so that a meeting never matches
    # a check's own collectives on MPI's world (same_on_every_rank's, say).
    meetings, created = MPI.COMM_WORLD.Idup()
    _wait(created)
    failed = 0
    for fn in checks:
        outcome = _run_one(fn, rank, size, args, catch=True)
        failed += outcome != "ok"
        _meet_after(fn.__name__, outcome == "raised", meetings, rank, size)
    meetings.Free()
    _report(f"DONE rank {rank}/{size}: {len(checks) - failed} passed, {failed} failed")
    if failed:
        sys.stdout.flush()
        # mpirun ends the other ranks once one exits non-zero: give theirs time to report
        # their last checks and DONE lines first (under load one was lost, 1 in ~20 runs).
        time.sleep(0.5)
        os._exit(1)  # skip atexit shutdown: the other ranks may be out of step


def _run_one(fn: Callable[..., Any], rank: int, size: int, args: Sequence[Any],
             catch: bool) -> str:
    """Run fn(rank, size, *args) and report it; returns "ok", "failed" (a comparison)
    or "raised". catch: an exception is a failure of fn (else it passes through,
    unreported)."""
    global _comparisons
    _failures.clear()
    _comparisons = 0
    start = time.perf_counter()
    outcome = "ok"
    try:
        fn(rank, size, *args)
    except BaseException as exc:  # noqa: BLE001 (reported, then the next check)
        if not catch or isinstance(exc, KeyboardInterrupt):
            raise
        detail = "".join(traceback.format_exception(exc)).rstrip()
        _failures.append(f"raised {type(exc).__name__}: {exc}\n{detail}")
        outcome = "raised"
    if _failures:
        first, *rest = _failures
        _report(f"CHECK {fn.__name__} rank {rank}/{size}: FAILED: {first}"
                + "".join(f"\n    also: {more}" for more in rest))
        return "raised" if outcome == "raised" else "failed"
    _report(f"CHECK {fn.__name__} rank {rank}/{size}: ok ({_comparisons} comparisons, "
            f"{time.perf_counter() - start:.2f} s)")
    return "ok"


def _meet_after(name: str, raised: bool, comm: Any, rank: int, size: int) -> None:
    """Every rank's end of check name; a rank whose check raised waits at most
    STRAGGLER_GRACE_S, then ends the job."""
    if _wait(comm.Ibarrier(), STRAGGLER_GRACE_S if raised else None):
        return
    _report(f"ABORT rank {rank}/{size}: check {name} raised (reported above) and the "
            f"other ranks have not finished it after {STRAGGLER_GRACE_S:g} s: they are "
            "most likely waiting in a collective for this rank; ending the job")
    comm.Abort(1)


def _wait(request: Any, limit: float | None = None) -> bool:
    """Wait for an MPI request, at most limit seconds; returns whether it completed.
    Polled with short sleeps: MPI's blocking wait would spin on a core that the ranks
    still busy need."""
    give_up_at = None if limit is None else time.monotonic() + limit
    pause = 1e-4
    while not request.Test():
        if give_up_at is not None and time.monotonic() > give_up_at:
            return False
        time.sleep(pause)
        pause = min(2 * pause, 0.01)
    return True


def run_scenario(scenarios: Sequence[Callable[..., Any]]) -> None:
    """Run the scenario that the command line's first argument names as
    scenario(rank, size, *the arguments after it), rank and size in MPI's world (a
    scenario may fail before init()). Exceptions pass through; if it returns, report it
    as a check (and DONE, as run_checks does) and exit 1 if a comparison failed."""
    from mpi4py import MPI
    args = sys.argv[1:]
    by_name = {fn.__name__: fn for fn in scenarios}
    if not args or args[0] not in by_name:
        raise SystemExit(f"usage: {sys.argv[0]} SCENARIO [ARGS...], SCENARIO one of: "
                         + ", ".join(by_name))
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    failed = _run_one(by_name[args[0]], rank, size, args[1:], catch=False) != "ok"
    _report(f"DONE rank {rank}/{size}: {int(not failed)} passed, {int(failed)} failed")
    if failed:
        sys.exit(1)


def _as_array(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # torch
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        return value.numpy()
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):  # tensorflow
        return np.asarray(value.numpy())
    return np.asarray(value)


def _short(array: np.ndarray) -> str:
    return np.array2string(array.reshape(-1)[:8], precision=6) + (
        f" ... ({array.size} values)" if array.size > 8 else "")
