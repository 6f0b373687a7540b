"""A light elastic job (no framework) for the launcher's failure paths:

    elastic_failures_worker.py kill   rank 1 SIGKILLs itself in the first generation
    elastic_failures_worker.py raise  rank 1 raises ValueError in every generation
    elastic_failures_worker.py steps  20 committed steps, no failure
"""
from __future__ import annotations

import os
import signal
import sys

from horovodish.common import api
from horovodish.common.api import collectives
from horovodish.common.elastic import ObjectState, run
from horovodish.common.runtime import launcher_link


def main(mode: str) -> None:
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
                if mode == "kill" and generation == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                if mode == "raise":
                    raise ValueError(f"deliberate failure in generation {generation}")

    train(state)
    sys.stdout.write(f"finished rank {rank}/{api.size()} at step {state.step}\n")


if __name__ == "__main__":
    main(sys.argv[1])
