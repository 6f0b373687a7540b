"""A rank that fails before ``init()`` must end the job, not hang it.

mpi4py starts MPI when it is imported (as any horovodish adapter does), and finalizes it
at exit. A rank whose script raises before ``init()`` (a missing file, a bad setting)
then waits in ``MPI_Finalize`` for the other ranks, which wait for it inside ``init()``:
the job hangs for good (under Horovod, whose import starts no MPI, mpirun ends it). So an
uncaught exception in a multi-rank job that never initialized horovodish (or whose
``init()`` failed) aborts the job once the traceback is printed. After a successful
``init()`` the runtime's own shutdown tells the other ranks instead (they raise
``HorovodInternalError`` naming this rank), so the hook stays out of the way.

Under the elastic launcher the hook also sends the exception's last line to it, which
names the script's own error when the launcher gives up on a job that keeps failing.
"""
from __future__ import annotations

import contextlib
import sys
import time
from types import TracebackType
from typing import Callable

from . import launcher_link

_installed = False
_FORWARD_SECONDS = 0.5


def install(initialized: Callable[[], bool]) -> None:
    """Chain onto ``sys.excepthook`` (once); ``initialized``: whether init() succeeded."""
    global _installed
    if _installed:
        return
    _installed = True
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException,
             traceback: TracebackType | None) -> None:
        previous(kind, value, traceback)
        if launcher_link.enabled() and not issubclass(kind, KeyboardInterrupt):
            launcher_link.notify({"kind": "error", "rank": launcher_link.world_rank(),
                                  "text": f"{kind.__name__}: {value}"})
        if initialized() or issubclass(kind, KeyboardInterrupt):
            return
        MPI = sys.modules.get("mpi4py.MPI")
        if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
            return
        world = MPI.COMM_WORLD
        if world.Get_size() > 1:
            with contextlib.suppress(Exception):  # a closed stream must not stop the abort
                sys.stderr.write(f"horovodish: rank {world.Get_rank()} failed before "
                                 "horovodish.init() completed; aborting the job so that "
                                 "the other ranks do not wait for it.\n")
                sys.stdout.flush()
                sys.stderr.flush()
            # MPI_Abort kills every rank at once: give mpirun's proxy a moment to forward
            # the traceback first (under load it was lost, and the job ended silently).
            time.sleep(_FORWARD_SECONDS)
            world.Abort(1)
    sys.excepthook = hook
