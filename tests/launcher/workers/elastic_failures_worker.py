"""A light elastic job (no framework) for the launcher's failure paths. Scenarios (the
first argument names one):

    elastic_failures_worker.py killed  rank 1 SIGKILLs itself in the first generation
    elastic_failures_worker.py raises  rank 1 raises ValueError in every generation
"""
from __future__ import annotations

import os
import signal
import sys

from worker_support import check, run_scenario  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import collectives  # noqa: E402
from horovodish.common.elastic import ObjectState, run  # noqa: E402
from horovodish.common.runtime import launcher_link  # noqa: E402


def _train(fail: str) -> None:
    """20 steps in lockstep, a commit every 5; rank 1 fails at step 7 as fail says."""
    api.init()
    generation, rank = launcher_link.generation(), api.rank()
    state = ObjectState(step=0)

    @run
    def train(state: ObjectState) -> None:
        sys.stdout.write(f"generation {generation} rank {rank}/{api.size()} from step "
                         f"{state.step}\n")
        while state.step < 20:
            collectives.barrier_async().wait()  # lockstep, as training's allreduces make it
            state.step += 1
            if state.step % 5 == 0:
                state.commit()
            if rank == 1 and state.step == 7:
                if fail == "kill" and generation == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                if fail == "raise":
                    raise ValueError(f"deliberate failure in generation {generation}")

    train(state)
    sys.stdout.write(f"finished rank {rank}/{api.size()} at step {state.step}\n")
    check(state.step == 20, f"finished at step {state.step}, want 20")


def killed(rank: int, size: int) -> None:
    _train("kill")


def raises(rank: int, size: int) -> None:
    _train("raise")


if __name__ == "__main__":
    run_scenario([killed, raises])
