"""The core's collectives on a multi-host job, against numpy on every rank.

    python core_worker.py LAYOUT      # LAYOUT as given to -H: h1:2,h2:2 or h1:2,h2:1,h3:1

Topology (which host each rank is on, local/cross ranks and sizes, homogeneity) is
checked against LAYOUT and the hostname, not against what MPI says. The backend the
runtime picks for a large allreduce is checked against the topology (hierarchical on
homogeneous multi-host jobs with several ranks per host, unless turned off). Every
collective's result is checked against numpy on every rank; sizes straddle the
hierarchical threshold and its pieces.
"""
from __future__ import annotations

import os
import socket
import sys

import ml_dtypes
import numpy as np

from horovodish.common import api
from horovodish.common.api import collectives
from horovodish.common.messages import ReduceOp, RequestType

from worker_support import check, close, run_checks, same_on_every_rank  # noqa: E402

# Integers small enough that every dtype sums and multiplies them exactly.
DTYPES = [np.float32, np.float64, np.int32, np.float16, ml_dtypes.bfloat16]
# Elements: 5, 70,000 (above the hierarchical threshold for 4-byte types), and over
# two 4 MiB pieces: every op, every dtype, a few cases each (a 1 Gbit/s link is slow).
LARGE = [(np.float32, ReduceOp.SUM), (np.float16, ReduceOp.AVERAGE),
         (np.int32, ReduceOp.MAX), (ml_dtypes.bfloat16, ReduceOp.SUM),
         (np.float64, ReduceOp.PRODUCT)]
LARGE_COUNT = 2_300_003
OPS = [ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT]


def layout() -> list[tuple[str, int]]:
    return [(item.split(":")[0], int(item.split(":")[1])) for item in sys.argv[1].split(",")]


def placement() -> list[tuple[str, int]]:
    """(host, local rank) of each rank: Hydra fills each host's slots in order."""
    return [(host, local) for host, slots in layout() for local in range(slots)]


def contribution(rank: int, count: int, dtype, op: ReduceOp, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed * 1009 + rank)
    low, high = (1, 3) if op == ReduceOp.PRODUCT else (-3, 4)
    if count > 1000 and op == ReduceOp.PRODUCT:  # 2**size stays exact; mostly ones
        values = np.where(rng.random(count) < 0.01, 2, 1)
    else:
        values = rng.integers(low, high, count)
    return values.astype(dtype)


def reference(size: int, count: int, dtype, op: ReduceOp, seed: int,
              joined: int | None = None) -> np.ndarray:
    parts = np.stack([np.zeros(count) if r == joined else
                      contribution(r, count, dtype, op, seed).astype(np.float64)
                      for r in range(size)])
    if op in (ReduceOp.SUM, ReduceOp.AVERAGE):
        total = parts.sum(axis=0)
        if op == ReduceOp.AVERAGE:
            kind = np.dtype(dtype).kind
            total = np.trunc(total / size) if kind in "iu" else total / size
        return total
    return {ReduceOp.MIN: np.min, ReduceOp.MAX: np.max, ReduceOp.PRODUCT: np.prod}[op](
        parts, axis=0)


def tolerance(dtype) -> float:
    return {np.dtype(np.float16): 1e-3, np.dtype(ml_dtypes.bfloat16): 1e-2}.get(
        np.dtype(dtype), 1e-6)


def check_topology(rank: int, size: int) -> None:
    where = placement()
    host, local = where[rank]
    slots = dict(layout())
    hosts = [h for h, _ in layout()]
    peers = [h for h in hosts if slots[h] > local]  # hosts with a rank of my local rank
    check(size == len(where), f"size {size}, want {len(where)}")
    check(socket.gethostname() == host, f"hostname {socket.gethostname()}, want {host}")
    check(api.local_rank() == local, f"local_rank {api.local_rank()}, want {local}")
    check(api.local_size() == slots[host], f"local_size {api.local_size()}, want {slots[host]}")
    check(api.cross_rank() == peers.index(host),
          f"cross_rank {api.cross_rank()}, want {peers.index(host)}")
    check(api.cross_size() == len(peers), f"cross_size {api.cross_size()}, want {len(peers)}")
    homogeneous = len(set(slots.values())) == 1
    check(api.is_homogeneous() == homogeneous,
          f"is_homogeneous {api.is_homogeneous()}, want {homogeneous}")


def forced() -> str | None:
    """HOROVODISH_/HOROVOD_HIERARCHICAL_ALLREDUCE as set for this job ("1", "0", None)."""
    return os.environ.get("HOROVODISH_HIERARCHICAL_ALLREDUCE",
                          os.environ.get("HOROVOD_HIERARCHICAL_ALLREDUCE"))


def hierarchical_possible() -> bool:
    slots = [s for _, s in layout()]
    return len(slots) > 1 and len(set(slots)) == 1 and slots[0] > 1


def check_backend_choice(rank: int, size: int) -> None:
    """Large allreduces go hierarchical wherever the topology allows (unless turned off),
    small ones only when forced on; never shared memory alone across hosts."""
    operations = api.state().runtime.executor.operations
    for nbytes, tensors in ((64 << 20, 1), (8 << 20, 16), (4096, 1)):
        name = operations.choose(RequestType.ALLREDUCE, "float32", nbytes, tensors,
                                 ReduceOp.SUM).name
        if hierarchical_possible() and (forced() == "1" or
                                        (forced() != "0" and nbytes > 1 << 20)):
            check(name == "hierarchical", f"{nbytes} bytes in {tensors}: {name}, "
                                          "want hierarchical")
        elif len(layout()) > 1:
            check(name not in ("hierarchical", "shm"),
                  f"{nbytes} bytes in {tensors}: {name} on a multi-host job")
        else:
            check(name != "hierarchical", f"{nbytes} bytes in {tensors}: {name} on one host")
    gather = operations.choose(RequestType.ALLGATHER, "float32", 1 << 20).name
    forced_gather = os.environ.get("HOROVOD_HIERARCHICAL_ALLGATHER") == "1"
    want = "hierarchical" if hierarchical_possible() and forced_gather else "mpi"
    check(gather == want, f"allgather: {gather}, want {want}")


def check_allreduce(rank: int, size: int) -> None:
    cases = [(d, o, 5) for d in (np.float32, np.int32) for o in OPS]
    cases += [(d, o, 70_000) for i, d in enumerate(DTYPES)
              for o in (ReduceOp.SUM, ReduceOp.AVERAGE, OPS[2 + i % 3])]
    cases += [(d, o, LARGE_COUNT) for d, o in LARGE]
    for seed, (dtype, op, count) in enumerate(cases, 1):
        data = contribution(rank, count, dtype, op, seed)
        got = collectives.allreduce_async(data, np.empty_like(data), f"ar.{seed}", op).wait()
        want = reference(size, count, dtype, op, seed)
        close(got.astype(np.float64), want, f"{np.dtype(dtype).name} {op.name} of {count}",
              tolerance(dtype))


def check_grouped_and_scaled(rank: int, size: int) -> None:
    counts = [3, 0, 600_000, 17, 1_200_001, 4096, 1]  # fused: straddles 4 MiB pieces
    for dtype in (np.float32, np.int64):
        seed = 1000 + np.dtype(dtype).itemsize
        inputs = [contribution(rank, c, dtype, ReduceOp.SUM, seed + i)
                  for i, c in enumerate(counts)]
        handles = collectives.grouped_allreduce_async(
            inputs, [None] * len(inputs), [f"g.{dtype.__name__}.{i}" for i in range(len(counts))],
            ReduceOp.SUM)
        for i, (handle, c) in enumerate(zip(handles, counts)):
            close(handle.wait().astype(np.float64),
                  reference(size, c, dtype, ReduceOp.SUM, seed + i),
                  f"grouped {np.dtype(dtype).name} tensor {i} of {c}")
    data = contribution(rank, 300_000, np.float64, ReduceOp.SUM, 77)
    got = collectives.allreduce_async(data, np.empty_like(data), "scaled", ReduceOp.SUM,
                                      prescale=0.5, postscale=3.0).wait()
    close(got, reference(size, 300_000, np.float64, ReduceOp.SUM, 77) * 1.5,
          "prescale 0.5, postscale 3", 1e-12)


def check_other_collectives(rank: int, size: int) -> None:
    rows = np.full((rank + 1, 3), rank, np.int32)
    got = collectives.allgather_async(rows, lambda shape: np.empty(shape, np.int32),
                                      "ag").wait()
    close(got, np.concatenate([np.full((r + 1, 3), r, np.int32) for r in range(size)]),
          "allgather")
    big = np.arange(400_000, dtype=np.float32) * (rank + 1)
    got = collectives.allgather_async(big, lambda shape: np.empty(shape, np.float32),
                                      "ag.big").wait()
    close(got, np.concatenate([np.arange(400_000, dtype=np.float32) * (r + 1)
                               for r in range(size)]), "allgather 1.6 MB per rank")
    root = size - 1
    data = np.arange(300_000, dtype=np.float64) + rank
    got = collectives.broadcast_async(data, np.empty_like(data), root, "bc").wait()
    close(got, np.arange(300_000, dtype=np.float64) + root, f"broadcast from {root}")
    send = np.repeat(np.arange(size) + 100 * rank, 2).astype(np.float32)
    got = collectives.alltoall_async(send, None, lambda shape: np.empty(shape, np.float32),
                                     "a2a").wait()
    got = got[0] if isinstance(got, tuple) else got
    close(got, np.repeat([rank + 100 * r for r in range(size)], 2).astype(np.float32),
          "alltoall")
    tensor = np.stack([contribution(rank, 5, np.float32, ReduceOp.SUM, 300 + i)
                       for i in range(2 * size + 1)])
    shape = collectives.reducescatter_shape(tensor.shape, rank, size)
    out = np.empty(shape, np.float32)
    got = collectives.grouped_reducescatter_async([tensor], [out], ["rs"], ReduceOp.SUM)[0].wait()
    full = np.stack([reference(size, 5, np.float32, ReduceOp.SUM, 300 + i)
                     for i in range(2 * size + 1)])
    start = sum(collectives.reducescatter_shape(tensor.shape, r, size)[0] for r in range(rank))
    close(got, full[start:start + shape[0]], "reducescatter")


def check_join(rank: int, size: int) -> None:
    """The last rank joins at once: it contributes zeros to the others' allreduce, through
    the same backend (its inputs None in shared memory on a hierarchical job)."""
    last = size - 1
    if rank != last:
        data = contribution(rank, 2_000_000, np.float32, ReduceOp.SUM, 555)
        got = collectives.allreduce_async(data, np.empty_like(data), "joined.ar",
                                          ReduceOp.AVERAGE).wait()
        close(got, reference(size, 2_000_000, np.float32, ReduceOp.AVERAGE, 555,
                             joined=last), "average with the last rank joined", 1e-6)
    joined = collectives.join_async().wait()
    check(joined in range(size), f"join returned {joined}")
    same_on_every_rank(np.array([joined]), "last joined rank")


SETS: list = []  # (members, ProcessSet), registered at init


def check_process_sets(rank: int, size: int) -> None:
    for members, ps in SETS:
        if rank not in members:
            continue
        for count in (10, 1_000_000):
            data = contribution(rank, count, np.float32, ReduceOp.SUM, 900 + count)
            got = collectives.allreduce_async(data, np.empty_like(data),
                                              f"ps.{members}.{count}", ReduceOp.SUM,
                                              process_set=ps).wait()
            parts = [contribution(r, count, np.float32, ReduceOp.SUM, 900 + count)
                     for r in members]
            close(got, np.sum(parts, axis=0, dtype=np.float64), f"set {members}, {count}")


def main() -> None:
    size = len(placement())
    first_host = [r for r, (h, _) in enumerate(placement()) if h == placement()[0][0]]
    spread = [0, size - 1]  # the first and last rank: on different hosts
    members = list(dict.fromkeys(tuple(m) for m in (first_host, spread, range(1, size))))
    # (Every rank is the global set: Horovod's rule refuses a second set of them.)
    members = [list(m) for m in members if 1 < len(m) < size]
    SETS.extend((m, api.ProcessSet(m)) for m in members)
    api.init(process_sets=[ps for _, ps in SETS])
    run_checks([check_topology, check_backend_choice, check_allreduce,
                check_grouped_and_scaled, check_other_collectives, check_join,
                check_process_sets], api.rank(), api.size())
    api.shutdown()


if __name__ == "__main__":
    main()
