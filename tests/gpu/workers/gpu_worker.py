"""CUDA tensors through horovodish, against the same calls on CPU copies (the host path
is the reference: tests/common checks it against Horovod's arithmetic).

Run by tests/gpu/test_gpu_paths.py and tests/gpu/run_on_gpu.sh: at 1 rank with
HOROVODISH_GPU_OPERATIONS=nccl and with the default; at 2 and 4 ranks on NCCL, each rank
under tests/gpu/distinct_hosts.py (its own NCCL_HOSTID, or NCCL refuses two ranks on one
GPU); at 2 and 4 ranks with =mpi (host-staged) on the one GPU; and at 4 ranks staged,
as two hosts of two ranks (tests/mpi_variants.py), through the hierarchical allreduce.
"""
from __future__ import annotations

import copy
import os
import time

import torch

from worker_support import check, close, run_checks  # noqa: E402

import horovodish.torch as hvd  # noqa: E402
from horovodish.torch import async_ops  # noqa: E402

# Unset, the default: NCCL where CuPy's NCCL loads (it does wherever tests/gpu runs).
NCCL = os.environ.get("HOROVODISH_GPU_OPERATIONS", "nccl") == "nccl"
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
          torch.int64, torch.uint8]
OPS = [hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product]
# Sums of quarters are exact; the tolerance covers Average's 1/size, rounded per path
# and summed in another order by NCCL than by MPI.
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-5,
             torch.float64: 1e-12}


def _value(rank: int, dtype: torch.dtype, shape: tuple[int, ...], salt: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype.is_floating_point:
        return (torch.randint(-8, 9, shape, generator=generator) / 4).to(dtype)
    low = 0 if dtype == torch.uint8 else -9
    return torch.randint(low, 4 if dtype == torch.uint8 else 10, shape,
                         generator=generator).to(dtype)


def _same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    check(got.is_cuda, f"{what}: the result is on {got.device}, not the GPU")
    close(got, want, what, TOLERANCE.get(want.dtype, 0.0))


def the_path_is_the_one_chosen(rank: int, size: int) -> None:
    backends = [b.name for b in hvd.global_process_set.runtime.executor.operations.backends]
    check(("nccl" in backends) == NCCL, f"backends {backends}, NCCL asked: {NCCL}")
    if NCCL:
        check(hvd.nccl_built() > 0 and hvd.cuda_built(), "nccl_built() / cuda_built()")


def allreduce_every_op_and_dtype(rank: int, size: int) -> None:
    for salt, dtype in enumerate(DTYPES):
        for op in OPS:
            for pre, post in ((1.0, 1.0), (0.5, 3.0)):
                if op in (hvd.Min, hvd.Max) and (pre, post) != (1.0, 1.0):
                    continue
                x = _value(rank, dtype, (3, 1025), salt)
                tag = f"{dtype}.{op}.{pre}"
                got = hvd.allreduce(x.cuda(), op=op, prescale_factor=pre,
                                    postscale_factor=post, name=f"gpu.{tag}")
                want = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post,
                                     name=f"cpu.{tag}")
                _same(got, want, f"allreduce {tag}")
                in_place = x.cuda()
                same = hvd.allreduce_(in_place, op=op, prescale_factor=pre,
                                      postscale_factor=post, name=f"gpu_.{tag}")
                check(same is in_place, f"allreduce_ {tag} returned another tensor")
                _same(in_place, want, f"allreduce_ {tag}")
                strided = x.t().cuda()  # not contiguous: reduced in a copy, written back
                hvd.allreduce_(strided, op=op, prescale_factor=pre, postscale_factor=post,
                               name=f"gpu_t.{tag}")
                _same(strided, want.t(), f"allreduce_ of a transposed tensor {tag}")
                handle = hvd.allreduce_async(x.cuda(), op=op, prescale_factor=pre,
                                             postscale_factor=post, name=f"gpu_a.{tag}")
                _same(hvd.synchronize(handle), want, f"allreduce_async {tag}")


def grouped_in_place_and_owned_allreduce(rank: int, size: int) -> None:
    shapes = [(5,), (0,), (17, 241), (3, 1), (), (4096,), (2, 2, 2)]  # ragged
    for salt, dtype in enumerate(DTYPES):
        xs = [_value(rank, dtype, shape, salt + i) for i, shape in enumerate(shapes)]
        want = hvd.grouped_allreduce(xs, op=hvd.Sum, name=f"cpu.group.{dtype}")
        got = hvd.grouped_allreduce([x.cuda() for x in xs], op=hvd.Sum,
                                    name=f"gpu.group.{dtype}")
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"grouped {dtype} #{i}")
        in_place = [x.cuda() for x in xs]
        hvd.grouped_allreduce_(in_place, op=hvd.Sum, name=f"gpu.group_.{dtype}")
        for i, (g, w) in enumerate(zip(in_place, want)):
            _same(g, w, f"in-place grouped {dtype} #{i}")
        owned = async_ops.synchronize(async_ops.grouped_allreduce_into_runtime_async(
            [x.cuda() for x in xs], name=f"gpu.owned.{dtype}", op=hvd.Sum))
        for i, (g, w) in enumerate(zip(owned, want)):
            _same(g, w, f"runtime-owned {dtype} #{i}")


def allgather_broadcast_alltoall_reducescatter(rank: int, size: int) -> None:
    for salt, dtype in enumerate(DTYPES):
        x = _value(rank, dtype, (rank + 1, 3), salt)  # uneven first dimensions
        _same(hvd.allgather(x.cuda(), name=f"gpu.ag.{dtype}"),
              hvd.allgather(x, name=f"cpu.ag.{dtype}"), f"allgather {dtype}")
        x = _value(rank, dtype, (7, 2), salt)
        _same(hvd.broadcast(x.cuda(), size - 1, name=f"gpu.bc.{dtype}"),
              hvd.broadcast(x, size - 1, name=f"cpu.bc.{dtype}"), f"broadcast {dtype}")
        splits = [(rank + peer) % 3 for peer in range(size)]
        x = _value(rank, dtype, (sum(splits), 2), salt)
        got, got_splits = hvd.alltoall(x.cuda(), splits=splits, name=f"gpu.a2a.{dtype}")
        want, want_splits = hvd.alltoall(x, splits=splits, name=f"cpu.a2a.{dtype}")
        _same(got, want, f"alltoall {dtype}")
        close(got_splits, want_splits, f"alltoall {dtype} received splits")
        for op in (hvd.Average, hvd.Sum, hvd.Max):
            x = _value(rank, dtype, (2 * size + 1, 3), salt)  # uneven parts
            _same(hvd.reducescatter(x.cuda(), op=op, name=f"gpu.rs.{dtype}.{op}"),
                  hvd.reducescatter(x, op=op, name=f"cpu.rs.{dtype}.{op}"),
                  f"reducescatter {dtype} {op}")


def completion_without_a_host_wait(rank: int, size: int) -> None:
    """The GPU sleeps, then writes the tensor; the allreduce is submitted and
    synchronized meanwhile. The host must come back while the GPU still sleeps (no
    device, stream or event synchronize), and the result must include the write."""
    if not NCCL:  # staging copies to the host, which waits for the stream by design
        return
    x = torch.zeros(1 << 20, device="cuda")
    hvd.allreduce_(x, name="warm.up")  # communicator created, kernels compiled
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.cuda._sleep(100_000_000)
    torch.cuda.synchronize()
    cycles_per_second = 100_000_000 / (time.perf_counter() - start)
    for attempt in range(3):  # a descheduled host could miss the window once
        sleep_seconds = 1.0
        torch.cuda._sleep(int(sleep_seconds * cycles_per_second))
        x.fill_(float(rank + 1 + attempt))  # enqueued behind the sleep: not written yet
        start = time.perf_counter()
        out = hvd.allreduce(x, op=hvd.Sum, name=f"behind.a.sleep.{attempt}")
        host = time.perf_counter() - start
        busy = not torch.cuda.current_stream().query()
        torch.cuda.synchronize()
        want = float(sum(r + 1 + attempt for r in range(size)))
        close(out[:4].cpu(), torch.full((4,), want), "result includes the pending write")
        if host < 0.5 * sleep_seconds and busy:
            break
    check(host < 0.5 * sleep_seconds and busy,
          f"synchronize returned after {host:.3f} s of a {sleep_seconds} s GPU sleep "
          f"(stream still busy: {busy}): the host waited for the GPU")


def distributed_optimizer_matches_one_process(rank: int, size: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 3)).cuda()
    reference = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(1)
    data = torch.randn(8 * size, 20, generator=generator).cuda()
    target = torch.randint(0, 3, (8 * size,), generator=generator).cuda()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         bucket_cap_mb=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    in_flight: list[int] = []  # reductions submitted when the first layer's grad is made
    model[0].weight.register_hook(lambda grad: in_flight.append(len(optimizer._horovodish.reducer.pending)))
    shard = slice(8 * rank, 8 * (rank + 1))
    for _ in range(5):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(data[shard]), target[shard]).backward()
        optimizer.step()
        reference_optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(data), target).backward()
        reference_optimizer.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        close(p, q, f"parameter {name} after 5 steps", 1e-4)
    check(in_flight and max(in_flight) > 0,
          f"no reduction was in flight during backward ({in_flight}): no overlap")


def the_hierarchical_allreduce_is_the_one_chosen(rank: int, size: int) -> None:
    """With HOROVODISH_TEST_HOSTS (tests/mpi_variants.py) and the hierarchical allreduce
    asked for: a staged CUDA tensor's allreduce goes through the two-level backend."""
    from horovodish.common.messages import RequestType
    operations = hvd.global_process_set.runtime.executor.operations
    chosen = operations.choose(RequestType.ALLREDUCE, "float32", 1 << 20).name
    check(chosen == "hierarchical", f"a 1 MiB allreduce goes through {chosen}")


if __name__ == "__main__":
    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    hierarchical = [the_hierarchical_allreduce_is_the_one_chosen] \
        if os.environ.get("HOROVODISH_TEST_HOSTS") else []
    run_checks([the_path_is_the_one_chosen, *hierarchical, allreduce_every_op_and_dtype,
                grouped_in_place_and_owned_allreduce,
                allgather_broadcast_alltoall_reducescatter, completion_without_a_host_wait,
                distributed_optimizer_matches_one_process], hvd.rank(), hvd.size())
    hvd.shutdown()
