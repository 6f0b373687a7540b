"""Runs a few collectives with a timeline and checks the file on rank 0 while it grows."""
from __future__ import annotations

import json
import sys
import time

import numpy as np

from horovodish.common import api
from horovodish.common.api import collectives
from horovodish.common.messages import ReduceOp


def step(tag: str) -> None:
    handles = [collectives.allreduce_async(np.ones(64, np.float32), np.empty(64, np.float32),
                                           f"{tag}.grad{i}", ReduceOp.SUM) for i in range(3)]
    for handle in handles:
        handle.wait()
    collectives.allgather_async(np.ones((2, 2), np.float32),
                                lambda shape: np.empty(shape, np.float32), f"{tag}.gather").wait()


def rows(path: str) -> dict[str, set[str]]:
    events = json.load(open(path))  # must parse at any moment
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    phases: dict[str, set[str]] = {}
    for event in events:
        if event["ph"] in ("B", "X") and event.get("tid") in names:
            phases.setdefault(names[event["tid"]], set()).add(event["name"])
    return phases


def main(mode: str, path: str) -> None:
    if mode == "unwritable":  # every rank gets rank 0's error from init(), none hangs
        from mpi4py import MPI
        try:
            api.init()
        except ValueError as exc:
            assert "cannot write the timeline file" in str(exc) and path in str(exc), exc
            sys.stdout.write(f"OK rank {MPI.COMM_WORLD.Get_rank()}\n")
            return
        raise AssertionError("init() with an unwritable timeline path did not raise")
    api.init()
    rank = api.rank()
    if mode == "env":
        for _ in range(3):
            step("env")
        time.sleep(0.4)  # past the flush interval
        step("env2")
        if rank == 0:
            phases = rows(path)  # mid-run
            for i in range(3):
                assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER",
                        "MPI_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"} <= phases[f"env.grad{i}"], phases
            assert {"NEGOTIATE_ALLGATHER", "ALLGATHER", "MPI_ALLGATHER"} <= phases["env.gather"]
            assert any(e["ph"] == "i" and e["name"] == "1" for e in json.load(open(path))), \
                "no readiness mark for rank 1"
    elif mode == "dynamic":
        step("before")
        api.start_timeline(path)
        step("during")
        api.stop_timeline()
        step("after")
        if rank == 0:
            phases = rows(path)
            assert "during.grad0" in phases and "before.grad0" not in phases \
                and "after.grad0" not in phases, sorted(phases)
        else:
            assert api.state().runtime.timeline is None, "only rank 0 records"
    elif mode == "off":
        step("off")
    api.shutdown()
    if rank == 0 and mode == "env":
        assert "env2.grad0" in rows(path)  # still valid after shutdown
    sys.stdout.write(f"OK rank {rank}\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
