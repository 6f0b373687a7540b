"""A training-like loop across hosts in which a fault strikes. Scenarios (the first
argument names one, the second is the file READY):

    python faults_worker.py killed READY       # rank 2 (on the second host) SIGKILLs itself
    python faults_worker.py link_pulled READY  # the test pulls the second host's link

Rank 0 creates the file READY once every rank has run 10 steps (the test waits for it
before pulling the link); every step's allreduce is checked against numpy.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np

from worker_support import close, run_scenario  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import collectives  # noqa: E402
from horovodish.common.messages import ReduceOp  # noqa: E402


def _train(ready: Path, kill_rank_2_at: int | None) -> None:
    """Checked steps until the job is ended from outside (a failed sum ends the rank)."""
    api.init()
    rank, size = api.rank(), api.size()
    for step in range(100_000):
        if step == 10 and rank == 0:
            ready.touch()
        if step == kill_rank_2_at and rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        data = np.full(300_000, rank + step, dtype=np.float32)  # hierarchical on 2x2
        got = collectives.allreduce_async(data, data, "grad", ReduceOp.SUM).wait()
        if not close(got, np.full(300_000, sum(range(size)) + size * step, np.float32),
                     f"sum at step {step}"):
            return  # reported as a failed scenario
        time.sleep(0.01)


def killed(rank: int, size: int, ready: str) -> None:
    _train(Path(ready), kill_rank_2_at=20)


def link_pulled(rank: int, size: int, ready: str) -> None:
    _train(Path(ready), kill_rank_2_at=None)


if __name__ == "__main__":
    run_scenario([killed, link_pulled])
