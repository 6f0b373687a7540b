"""One synchronous allreduce per call through horovodish's torch API against
``torch.distributed.all_reduce`` in the same job: gloo on host memory, NCCL on a GPU.

Per size, in alternating rounds: the time per completed call (on a GPU the caller then
waits for the device), and on a GPU also the host time until the call returns (both
enqueue the work and return; what a training loop's Python pays per call). The caller
enters ``training.process_group(hvd, backend)`` first.
"""
from __future__ import annotations

import statistics

from mpi4py import MPI

from .timing import alternating

SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)
OURS, THEIRS = "horovodish allreduce_", "torch.distributed.all_reduce"


def per_call(comm: MPI.Comm, sizes: tuple[int, ...] = SIZES, rounds: int = 3,
             budget: float = 0.2, device: str = "cpu") -> list[dict]:
    """Rows of {bytes, seconds per completed call of each, ours over theirs; on a GPU
    also host seconds per call of each and ours over theirs}."""
    import torch
    import torch.distributed as dist

    from .. import torch as hvd
    on_gpu = torch.device(device).type == "cuda"
    rows = []
    for nbytes in sizes:
        tensor = torch.zeros(nbytes // 4, device=device)  # zeros: sums stay finite
        name = f"bench.per_call.{nbytes}"

        def ours() -> None:
            hvd.allreduce_(tensor, op=hvd.Sum, name=name)

        def theirs() -> None:
            dist.all_reduce(tensor)

        def completed(call):
            def run() -> None:
                call()
                if on_gpu:
                    torch.cuda.synchronize()
            return run
        times = alternating({OURS: completed(ours), THEIRS: completed(theirs)}, comm,
                            rounds, budget)
        row = _summary(nbytes, times, "s")
        if on_gpu:  # the host's part: calls that only enqueue, the device drained after
            host = alternating({OURS: ours, THEIRS: theirs}, comm, rounds, budget)
            torch.cuda.synchronize()
            row.update(_summary(nbytes, host, "host_s"))
        rows.append(row)
    return rows


def _summary(nbytes: int, times: dict[str, list[float]], unit: str) -> dict:
    median = {key: statistics.median(values) for key, values in times.items()}
    ratios = [o / t for o, t in zip(times[OURS], times[THEIRS])]
    return {"bytes": nbytes, f"ours_{unit}": median[OURS], f"theirs_{unit}": median[THEIRS],
            f"ours_over_theirs_{unit}": statistics.median(ratios),
            f"ours_over_theirs_{unit}_range": [min(ratios), max(ratios)]}


def print_rows(rows: list[dict], backend: str) -> None:
    print(f"\nper call: {OURS} against {THEIRS} ({backend}), float32 Sum, synchronous "
          "(time in us; ours / theirs: below 1 is faster)")
    for row in rows:
        low, high = row["ours_over_theirs_s_range"]
        print(f"  {row['bytes']:>10} bytes  horovodish {row['ours_s'] * 1e6:9.1f}  "
              f"torch.distributed {row['theirs_s'] * 1e6:9.1f}  "
              f"{row['ours_over_theirs_s']:5.2f}x (rounds {low:.2f}x to {high:.2f}x)")
