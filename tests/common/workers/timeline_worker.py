"""Runs a few collectives with a timeline and checks the file on rank 0 while it grows."""
from __future__ import annotations

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from worker_support import check, expect_error, run_checks  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import collectives  # noqa: E402
from horovodish.common.messages import ReduceOp  # noqa: E402


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


def init_fails_on_every_rank(rank: int, size: int, path: str) -> None:
    """An unwritable path: every rank gets rank 0's error from init(), none hangs."""
    expect_error(api.init, ValueError, "cannot write the timeline file", path,
                 what="init() with an unwritable timeline path")


def phases_while_running(rank: int, size: int, path: str) -> None:
    for _ in range(3):
        step("env")
    time.sleep(0.4)  # past the flush interval
    step("env2")
    if rank != 0:
        return
    phases = rows(path)  # mid-run
    for i in range(3):
        want = {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER",
                "MPI_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"}
        check(want <= phases.get(f"env.grad{i}", set()),
              f"env.grad{i}: missing {sorted(want - phases.get(f'env.grad{i}', set()))}")
    want = {"NEGOTIATE_ALLGATHER", "ALLGATHER", "MPI_ALLGATHER"}
    check(want <= phases.get("env.gather", set()),
          f"env.gather: missing {sorted(want - phases.get('env.gather', set()))}")
    check(any(e["ph"] == "i" and e["name"] == "1" for e in json.load(open(path))),
          "no readiness mark for rank 1")


# A single tensor from the ring's default threshold (4 MiB) on takes the ring; one below
# it, shared memory (docs/tuning.md, "Backends").
BACKEND_BY_SIZE = ((1 << 20, "SHM_ALLREDUCE"), (4 << 20, "RING_ALLREDUCE"),
                   ((4 << 20) - 4, "SHM_ALLREDUCE"))


def single_tensors_by_size(rank: int, size: int, path: str) -> None:
    """The timeline names the backend that ran each tensor of BACKEND_BY_SIZE; the sums
    are checked too."""
    for nbytes, _ in BACKEND_BY_SIZE:
        tensor = np.full(nbytes // 4, rank + 1, np.float32)
        result = collectives.allreduce_async(tensor, None, f"size.{nbytes}",
                                             ReduceOp.SUM).wait()
        check(bool(np.all(result == size * (size + 1) // 2)),
              f"{nbytes} bytes: sum {np.unique(result)[:4]}")
    time.sleep(0.4)  # past the flush interval
    if rank != 0:
        return
    phases = rows(path)
    for nbytes, backend in BACKEND_BY_SIZE:
        seen = phases.get(f"size.{nbytes}", set())
        check(backend in seen, f"a single tensor of {nbytes} bytes: {sorted(seen)}, "
                               f"no {backend}")


def valid_after_shutdown(rank: int, size: int, path: str) -> None:
    api.shutdown()
    if rank == 0:
        check("env2.grad0" in rows(path), "env2.grad0 missing after shutdown")


def only_between_start_and_stop(rank: int, size: int, path: str) -> None:
    step("before")
    api.start_timeline(path)
    step("during")
    api.stop_timeline()
    step("after")
    if rank == 0:
        phases = rows(path)
        check("during.grad0" in phases and "before.grad0" not in phases
              and "after.grad0" not in phases, f"rows: {sorted(phases)}")
    else:
        check(api.state().runtime.timeline is None, "only rank 0 records")


def torch_names_soon_in_the_file(rank: int, size: int, path: str) -> None:
    """A torch op's row is named as Horovod names it ("allreduce.<name>"), and is in the
    file soon after the op, though a write just happened (Horovod's own timeline test
    reads the file 0.1 s after its allreduce)."""
    import torch

    import horovodish.torch as hvd
    hvd.allreduce(torch.ones(3), name="first")  # its cycle writes the file
    hvd.allreduce(torch.tensor([1.0, 2.0, 3.0]), name="test_allreduce")
    time.sleep(0.15)
    if rank == 0:
        phases = rows(path)
        want = {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"}
        got = phases.get("allreduce.test_allreduce", set())
        check(want <= got, f"row allreduce.test_allreduce: {sorted(got)} (rows: "
                           f"{sorted(phases)})")


def runs_without_a_timeline(rank: int, size: int, path: str) -> None:
    step("off")


CHECKS = {"unwritable": [init_fails_on_every_rank],
          "env": [torch_names_soon_in_the_file, phases_while_running, single_tensors_by_size,
                  valid_after_shutdown],
          "dynamic": [only_between_start_and_stop],
          "off": [runs_without_a_timeline]}

if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    if mode != "unwritable":
        api.init()
    run_checks(CHECKS[mode], MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size(), path)
    api.shutdown()
