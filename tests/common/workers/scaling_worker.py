"""Prescale and postscale with Horovod's arithmetic, bit for bit, on every path.

The reference is written from Horovod's CPU rule, independently of the runtime: each
rank's value times the factor, in float32 for float16/bfloat16 and in float64 for
integers, cast back to the dtype (integers truncate toward zero), then the sum in the
dtype (two ranks: one rounding, whatever the order); a postscale is applied to the sum
the same way. Checked for one tensor, a fused group (fusion buffer or shared memory), a
runtime-owned result, a tensor reduced in place and reducescatter, on 2 ranks and on
one (where the reduction is the input itself and only the scaling is left: with a
timeline, the job also checks that no fusion buffer was packed).
"""
from __future__ import annotations

import json
import os
import time

import ml_dtypes
import numpy as np

from worker_support import check, run_checks  # noqa: E402

from horovodish.common import api  # noqa: E402
from horovodish.common.api import collectives  # noqa: E402
from horovodish.common.messages import ReduceOp  # noqa: E402

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int32, np.int64,
          np.int8, np.uint8]
FACTORS = [0.6180339887498949, 0.1234567890123, 3.3]


def horovod_scale(values: np.ndarray, factor: float) -> np.ndarray:
    dtype = values.dtype
    if dtype in (np.float16, ml_dtypes.bfloat16):
        wide = values.astype(np.float32) * np.float32(factor)
    elif np.issubdtype(dtype, np.integer):
        wide = np.trunc(values.astype(np.float64) * factor)
    else:
        wide = values * dtype.type(factor)
    return wide.astype(dtype)


def contribution(rank: int, count: int, dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed * 7 + rank)
    # 8-bit values stay small enough that scaled sums stay in range (a cast out of range
    # is undefined in C, so Horovod defines no result for it).
    high = 15 if np.dtype(dtype).itemsize == 1 else 40
    low = 0 if dtype == np.uint8 else -high
    values = rng.integers(low, high, count).astype(np.float64)
    if np.issubdtype(np.dtype(dtype), np.floating) or dtype == ml_dtypes.bfloat16:
        values += rng.random(count)  # fractions: rounding of the product matters
    return values.astype(dtype)


def expected(size: int, count: int, dtype, seed: int, pre: float, post: float
             ) -> np.ndarray:
    parts = [horovod_scale(contribution(r, count, dtype, seed), pre) for r in range(size)]
    total = parts[0]
    for part in parts[1:]:
        total = (total + part).astype(dtype)
    return horovod_scale(total, post)


def bitwise(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """got is want bit for bit; a failure names the first element that differs."""
    if not check(got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"):
        return
    same = got.astype(np.float64) == want.astype(np.float64)
    if not same.all():
        index = int(np.argmin(same))
        check(False, f"{what}: element {index} is {got.reshape(-1)[index]!r}, "
                     f"Horovod's arithmetic gives {want.reshape(-1)[index]!r} "
                     f"({int((~same).sum())} of {same.size} differ)")
    else:
        check(True, what)


def cases():
    """(dtype, seed, pre, post, tag) for every dtype and factor, as pre, post and both."""
    for d, dtype in enumerate(DTYPES):
        for f, factor in enumerate(FACTORS):
            for pre, post in [(factor, 1.0), (1.0, factor), (factor, 1.0 / factor)]:
                seed = (d * 10 + f) * 10 + int(pre == 1.0)
                yield dtype, seed, pre, post, f"{np.dtype(dtype).name} pre={pre} post={post}"


def single_tensor(rank: int, size: int) -> None:
    """One tensor, reduced in its output."""
    for dtype, seed, pre, post, tag in cases():
        value = contribution(rank, 289, dtype, seed)
        out = np.empty_like(value)
        collectives.allreduce_async(value, out, f"one.{tag}", ReduceOp.SUM, pre, post).wait()
        bitwise(out, expected(size, 289, dtype, seed, pre, post), f"single {tag}")


def fused_group(rank: int, size: int) -> None:
    """A fused group large enough for the shared-memory path, one output given and one
    owned by the runtime."""
    counts = [40000, 30000]
    for dtype, seed, pre, post, tag in cases():
        values = [contribution(rank, c, dtype, seed + 1 + i) for i, c in enumerate(counts)]
        outputs = [np.empty_like(values[0]), None]
        handles = collectives.grouped_allreduce_async(
            values, outputs, [f"group.{tag}.{i}" for i in range(2)], ReduceOp.SUM, pre, post)
        for i, handle in enumerate(handles):
            bitwise(handle.wait(), expected(size, counts[i], dtype, seed + 1 + i, pre, post),
                    f"group {tag} tensor {i}")


def many_small_tensors(rank: int, size: int) -> None:
    """A fused group of many small tensors (packed as they are, then scaled in one
    pass: arithmetic.scale_once), large enough in all for the shared-memory path, with
    every output given or every one owned by the runtime."""
    counts = [1000 + 17 * i for i in range(24)]
    for dtype, seed, pre, post, tag in cases():
        for owned in (False, True):
            values = [contribution(rank, c, dtype, seed + 11 + i) for i, c in enumerate(counts)]
            outputs = [None if owned else np.empty_like(v) for v in values]
            handles = collectives.grouped_allreduce_async(
                values, outputs, [f"small.{tag}.{owned}.{i}" for i in range(len(counts))],
                ReduceOp.SUM, pre, post)
            for i, handle in enumerate(handles):
                bitwise(handle.wait(), expected(size, counts[i], dtype, seed + 11 + i, pre,
                                                post), f"small {tag} owned={owned} tensor {i}")


def in_place(rank: int, size: int) -> None:
    """One tensor and a fused group, each reduced where it lies."""
    for dtype, seed, pre, post, tag in cases():
        values = [contribution(rank, c, dtype, seed + 3 + i)
                  for i, c in enumerate((289, 40000, 30000))]
        handles = [collectives.allreduce_async(values[0], values[0], f"inplace.{tag}",
                                               ReduceOp.SUM, pre, post)]
        handles += collectives.grouped_allreduce_async(
            values[1:], values[1:], [f"inplace.{tag}.{i}" for i in range(2)], ReduceOp.SUM,
            pre, post)
        for i, (handle, value) in enumerate(zip(handles, values)):
            check(handle.wait() is value, f"in place {tag} tensor {i}: its own array back")
            bitwise(value, expected(size, value.size, dtype, seed + 3 + i, pre, post),
                    f"in place {tag} tensor {i}")


def alone_nothing_is_packed(rank: int, size: int) -> None:
    """On one rank every allreduce above ran as the scaling alone: the timeline shows
    LOCAL_ALLREDUCE for them, and no fusion buffer, shared memory or MPI phase."""
    path = os.environ.get("HOROVODISH_TIMELINE")
    if size != 1 or not path:
        return
    time.sleep(0.4)  # past the timeline's flush interval
    events = json.load(open(path))
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    phases: dict[str, set[str]] = {}
    for event in events:
        if event["ph"] in ("B", "X") and rows.get(event.get("tid"), "").startswith(
                ("one.", "group.", "small.", "inplace.")):
            phases.setdefault(rows[event["tid"]], set()).add(event["name"])
    check(len(phases) > 100, f"timeline rows of the allreduces above: {len(phases)}")
    local = [name for name, seen in phases.items() if "LOCAL_ALLREDUCE" in seen]
    copied = sorted(name for name, seen in phases.items() if seen & {
        "MEMCPY_IN_FUSION_BUFFER", "SHM_ALLREDUCE", "MPI_ALLREDUCE", "RING_ALLREDUCE"})
    check(len(local) == len(phases), f"{len(phases) - len(local)} rows without "
                                      "LOCAL_ALLREDUCE")
    check(not copied, f"packed or sent at one rank: {copied[:3]}")


def reducescatter(rank: int, size: int) -> None:
    """This rank's rows of the sum."""
    for dtype, seed, pre, post, tag in cases():
        rows = contribution(rank, 8 * size, dtype, seed + 5).reshape(2 * size, 4)
        mine = np.empty((2, 4), rows.dtype)
        collectives.grouped_reducescatter_async([rows], [mine], [f"rs.{tag}"], ReduceOp.SUM,
                                                pre, post)[0].wait()
        full = expected(size, 8 * size, dtype, seed + 5, pre, post).reshape(-1, 4)
        bitwise(mine, full[2 * rank:2 * rank + 2], f"reducescatter {tag}")


if __name__ == "__main__":
    api.init()
    run_checks([single_tensor, fused_group, many_small_tensors, in_place, reducescatter,
                alone_nothing_is_packed], api.rank(), api.size())
    api.shutdown()
