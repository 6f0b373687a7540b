"""What every torch worker shares: a failed check names the rank, and a failure ends the
process at once with a non-zero code (no MPI finalize that could wait for peers)."""
from __future__ import annotations

import os
import sys
import traceback
from typing import Callable

import horovodish.torch as hvd


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(f"rank {hvd.rank()}: {what}")


def run(main: Callable[[], None]) -> None:
    """Run a worker's main; on any failure print the traceback and exit 1."""
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
