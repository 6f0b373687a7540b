"""The GPU path's figures, written as JSON to argv[1]:

1. pack + unpack of ResNet-50's 161 gradients (float32, about 102 MB) by the batched
   kernel, against a device-to-device copy of the same bytes (target: >= 60% of the
   copy's bandwidth);
2. one-rank NCCL allreduce of 64 MiB through the runtime against the raw CuPy NCCL
   call on the same buffer (target: within 10%);
3. a ResNet-50 training step with DistributedOptimizer against without (target:
   within 5%);
4. against torch DDP on NCCL, side by side in the job (horovodish.bench.training's
   ``against_ddp``, alternating rounds): ResNet-50 at batch 32 and 128 and the
   162-tensor model, ms per step of DistributedOptimizer, DDP and no communication
   (target at batch 32: horovodish's step within 1% of DDP's); and one synchronous
   allreduce per call against ``torch.distributed.all_reduce``, 4 KiB to 64 MiB
   (horovodish.bench.per_call; target: host time at most 2x theirs for small calls).

    python tests/gpu/bench_gpu.py figures.json            # 1 to 4 at one rank
    horovodishrun -np 2 python tests/gpu/distinct_hosts.py tests/gpu/bench_gpu.py \
        figures-2.json --against-ddp-only                   # 4 at two NCCL ranks

Run with HOROVODISH_GPU_OPERATIONS=nccl (run_on_gpu.sh does both). GPU times come from
CUDA events; each figure is the median of several repetitions.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from gpu.resnet50 import resnet50, resnet50_parameter_shapes  # noqa: E402

import horovodish.torch as hvd  # noqa: E402


def _gpu_ms(run, repeat: int = 20, warmup: int = 3) -> float:
    """Median GPU time of run() in ms, each timed between two CUDA events."""
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def fusion_kernel() -> dict:
    import cupy

    from horovodish.common.execution.gpu_fusion import (
        BatchedCopier, pack_pointers, plan_layout, unpack_pointers)
    counts = tuple(int(np.prod(s)) for s in resnet50_parameter_shapes())
    grads = [torch.randn(c, device="cuda") for c in counts]
    layout = plan_layout(counts)
    buffer = torch.empty(layout.total, device="cuda")
    outputs = [torch.empty_like(g) for g in grads]
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    copier = BatchedCopier(cupy)
    pack = pack_pointers(layout, buffer.data_ptr(), 4, [g.data_ptr() for g in grads])
    unpack = unpack_pointers(layout, buffer.data_ptr(), 4, [o.data_ptr() for o in outputs])
    pack_ms = _gpu_ms(lambda: copier.launch("float32", layout, *pack, stream))
    unpack_ms = _gpu_ms(lambda: copier.launch("float32", layout, *unpack, stream))
    source = torch.randn(layout.total, device="cuda")
    copy_ms = _gpu_ms(lambda: buffer.copy_(source))
    per_tensor_ms = _gpu_ms(lambda: [buffer[o:o + c].copy_(g) for o, c, g in
                                     zip(layout.offsets, counts, grads)], repeat=5)
    ok = all(torch.equal(o, g) for o, g in zip(outputs, grads))
    nbytes = layout.total * 4
    ratio = 2 * copy_ms / (pack_ms + unpack_ms)
    return {"tensors": len(counts), "bytes": nbytes, "pack_ms": pack_ms,
            "unpack_ms": unpack_ms, "device_copy_ms": copy_ms,
            "one_copy_per_tensor_ms": per_tensor_ms,
            "copy_bandwidth_GBps": 2 * nbytes / copy_ms / 1e6,
            "pack_unpack_fraction_of_copy_bandwidth": ratio, "target": 0.6,
            "met": ratio >= 0.6, "round_trip_exact": ok}


def allreduce_overhead() -> dict:
    """64 MiB float32 at one rank: the runtime's calls against CuPy's raw NCCL call.

    At one rank NCCL's in-place allreduce moves nothing and its out-of-place one is a
    device copy, so what the runtime adds per call (submit, a negotiation cycle,
    completion: host time while the GPU waits) is most of a synchronous call. Measured
    three ways: one call at a time (GPU span between events around the call), calls
    kept in flight (20 submitted, then synchronized: the host cost overlaps), and the
    runtime's host time per call on a small tensor."""
    import cupy
    from cupy.cuda import nccl

    count = (64 << 20) // 4
    x = torch.randn(count, device="cuda")
    y = torch.empty_like(x)
    uid = nccl.get_unique_id()
    communicator = nccl.NcclCommunicator(1, uid, 0)
    stream = torch.cuda.current_stream().cuda_stream

    def raw(send: torch.Tensor, recv: torch.Tensor) -> None:
        communicator.allReduce(send.data_ptr(), recv.data_ptr(), count, nccl.NCCL_FLOAT32,
                               nccl.NCCL_SUM, stream)
    figures = {"bytes": count * 4, "cupy": cupy.__version__,
               "raw_in_place_ms": _gpu_ms(lambda: raw(x, x)),
               "raw_out_of_place_ms": _gpu_ms(lambda: raw(x, y)),
               "runtime_in_place_sync_ms": _gpu_ms(
                   lambda: hvd.allreduce_(x, op=hvd.Sum, name="bench.inplace")),
               "runtime_out_of_place_sync_ms": _gpu_ms(
                   lambda: hvd.allreduce(x, op=hvd.Sum, name="bench.oop"))}
    many = [torch.randn(count, device="cuda") for _ in range(4)]

    def in_flight(async_call) -> None:
        handles = [async_call(many[i % 4], op=hvd.Sum, name=f"bench.flight.{i}")
                   for i in range(20)]
        for handle in handles:
            hvd.synchronize(handle)
    figures["runtime_in_place_in_flight_ms"] = _gpu_ms(
        lambda: in_flight(hvd.allreduce_async_), repeat=5) / 20
    figures["runtime_out_of_place_in_flight_ms"] = _gpu_ms(
        lambda: in_flight(hvd.allreduce_async), repeat=5) / 20
    figures["raw_out_of_place_in_flight_ms"] = _gpu_ms(
        lambda: [raw(many[i % 4], y) for i in range(20)], repeat=5) / 20
    figures.update(_in_flight_host_split(many))
    sys.stdout.write(_profiled(lambda: in_flight(hvd.allreduce_async), 1.0))
    small = torch.ones(256, device="cuda")
    for _ in range(20):
        hvd.allreduce_(small, name="bench.small")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(200):
        hvd.allreduce_(small, name="bench.small")
    figures["runtime_host_us_per_sync_call"] = (time.perf_counter() - start) / 200 * 1e6
    torch.cuda.synchronize()
    communicator.destroy()
    ratio = figures["runtime_out_of_place_in_flight_ms"] / figures["raw_out_of_place_in_flight_ms"]
    figures.update(runtime_in_flight_over_raw=ratio, target=1.10, met=ratio <= 1.10,
                   sync_over_raw=figures["runtime_out_of_place_sync_ms"]
                   / figures["raw_out_of_place_ms"])
    return figures


def _in_flight_host_split(tensors: list[torch.Tensor]) -> dict:
    """Host time of 20 out-of-place calls kept in flight, in us per call: submitting
    them, then synchronizing them (medians of 10 rounds, the GPU idle before each)."""
    submit, finish = [], []
    for round_ in range(10):
        torch.cuda.synchronize()
        start = time.perf_counter()
        handles = [hvd.allreduce_async(tensors[i % 4], op=hvd.Sum, name=f"bench.split.{i}")
                   for i in range(20)]
        middle = time.perf_counter()
        for handle in handles:
            hvd.synchronize(handle)
        end = time.perf_counter()
        submit.append((middle - start) / 20 * 1e6)
        finish.append((end - middle) / 20 * 1e6)
    return {"in_flight_host_submit_us_per_call": statistics.median(submit),
            "in_flight_host_synchronize_us_per_call": statistics.median(finish)}


def _profiled(run, seconds: float) -> str:
    """cProfile of run() repeated for about seconds, top 30 by own time. At one rank
    the caller's thread runs the runtime's cycles itself (the runtime thread idles),
    so this thread's profile is the whole host cost. (A sampler thread reading
    sys._current_frames() was tried: it gets the GIL only when the profiled thread
    drops it, in CUDA calls, so it saw nothing else.)"""
    import cProfile
    import io
    import pstats
    profiler = cProfile.Profile()
    end = time.perf_counter() + seconds
    profiler.enable()
    while time.perf_counter() < end:
        run()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    return f"profile of 20 out-of-place calls in flight, repeated:\n{text.getvalue()}\n"


def host_costs() -> dict:
    """Where a synchronous CUDA allreduce's host time goes, in us per call (medians of
    rounds of 200): the whole call on a small CUDA tensor and on a CPU tensor of the
    same size (the runtime's own Python on this host), and each CUDA-only piece alone."""
    import cupy
    from cupy.cuda import nccl

    from horovodish.torch import tensor_views
    from horovodish.torch.tensor_views import (_import_block, as_cuda_view, current_stream_ptr,
                                               ready_event, wait_on_current_stream)

    def per_call_us(run, calls: int = 200) -> float:
        rounds = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                run()
            rounds.append((time.perf_counter() - start) / calls * 1e6)
        return statistics.median(rounds)
    def device_context() -> None:
        with cupy.cuda.Device(0):
            pass
    gpu, cpu = torch.ones(256, device="cuda"), torch.ones(256)
    block = cupy.ones(1 << 20, dtype=cupy.float32)
    imported = _import_block(block)
    assert imported.data_ptr() == block.data.ptr and float(imported[-1]) == 1.0
    event = ready_event(gpu)
    communicator = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    stream = cupy.cuda.Stream(non_blocking=True)
    figures = {
        "allreduce_cuda_tensor": per_call_us(lambda: hvd.allreduce_(gpu, name="host.gpu")),
        "allreduce_cpu_tensor": per_call_us(lambda: hvd.allreduce_(cpu, name="host.cpu")),
        "as_cuda_view": per_call_us(lambda: as_cuda_view(gpu)),
        "ready_event": per_call_us(lambda: ready_event(gpu)),
        "wait_on_current_stream": per_call_us(lambda: wait_on_current_stream(event)),
        "torch_current_stream": per_call_us(lambda: torch.cuda.current_stream(0).cuda_stream),
        "current_stream_ptr": per_call_us(lambda: current_stream_ptr(0)),
        "torch_from_dlpack_of_a_block": per_call_us(lambda: torch.from_dlpack(block)),
        "block_import_used": per_call_us(lambda: _import_block(block)),
        "capsule_import_works": float(tensor_views._capsule_import),
        "cupy_event_record": per_call_us(
            lambda: cupy.cuda.Event(block=False, disable_timing=True).record(stream)),
        "cupy_device_context": per_call_us(device_context),
        "raw_nccl_enqueue": per_call_us(lambda: communicator.allReduce(
            gpu.data_ptr(), gpu.data_ptr(), 256, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
            stream.ptr)),
    }
    torch.cuda.synchronize()
    stream.synchronize()
    communicator.destroy()
    return figures


def training_step(batch: int = 32) -> dict:
    """ResNet-50 steps with and without DistributedOptimizer (one rank, NCCL): the
    median step, and the host time until step() returns (the host runs ahead of the
    GPU; where it does not, Python's cost is on the step's critical path)."""
    host: dict[bool, float] = {}

    def step_ms(distributed: bool) -> float:
        torch.manual_seed(0)
        model = resnet50().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if distributed:
            optimizer = hvd.DistributedOptimizer(optimizer,
                                                 named_parameters=model.named_parameters())
        data = torch.randn(batch, 3, 224, 224, device="cuda")
        target = torch.randint(0, 1000, (batch,), device="cuda")

        def step() -> None:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(data), target).backward()
            optimizer.step()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        times, enqueue = [], []
        for _ in range(10):
            start = time.perf_counter()
            step()
            enqueue.append((time.perf_counter() - start) * 1e3)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        host[distributed] = statistics.median(enqueue)
        if distributed and batch == 32:  # where the host's time goes (in the log)
            import cProfile
            import io
            import pstats
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
            sys.stdout.write(f"profile of 5 distributed steps, batch {batch}:\n"
                             f"{text.getvalue()}\n")
        return statistics.median(times)
    plain = step_ms(False)
    distributed = step_ms(True)
    plain_again = step_ms(False)  # the spread of the baseline itself
    ratio = distributed / min(plain, plain_again)
    return {"batch": batch, "plain_step_ms": [plain, plain_again],
            "distributed_step_ms": distributed, "plain_host_ms": host[False],
            "distributed_host_ms": host[True], "distributed_over_plain": ratio,
            "target": 1.05, "met": ratio <= 1.05}


def against_ddp() -> dict:
    """DistributedOptimizer against torch DDP on NCCL and no communication, in one job:
    ResNet-50 at batch 32 and 128, the 162-tensor model at batch 32; then one call at a
    time against torch.distributed.all_reduce."""
    from mpi4py import MPI

    from horovodish.bench.per_call import per_call
    from horovodish.bench.training import against_ddp as compare
    from horovodish.bench.training import many_tensor_model, process_group
    from gpu.resnet50 import resnet50 as build  # noqa: E402
    device = f"cuda:{torch.cuda.current_device()}"
    comm = MPI.COMM_WORLD
    figures: dict = {}
    with process_group(hvd, "nccl"):
        for name, model, batch, shape, classes in (
                ("resnet50_batch32", build, 32, (3, 224, 224), 1000),
                ("resnet50_batch128", build, 128, (3, 224, 224), 1000),
                ("many_tensors_batch32", lambda: many_tensor_model(torch), 32, (64,), 10)):
            try:
                row = compare(comm, model, batch, shape, classes, rounds=3, budget=0.5,
                              tag=f"{name}.", device=device, backend="nccl")
                if name == "resnet50_batch32":
                    row.update(target=1.01, met=row["ours_over_ddp_step"] <= 1.01)
                figures[name] = row
            except Exception as exc:  # noqa: BLE001 (one failed figure keeps the others)
                figures[name] = {"error": f"{type(exc).__name__}: {exc}"}
            if hvd.rank() == 0:
                sys.stdout.write(f"against DDP, {name}: {json.dumps(figures[name])}\n")
        rows = per_call(comm, device=device)
        small = [r for r in rows if r["bytes"] <= 64 << 10]
        figures["per_call"] = {"rows": rows, "target_small_host": 2.0, "met": all(
            r["ours_over_theirs_host_s"] <= 2.0 for r in small)}
    return figures


def main() -> None:
    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    out = Path(sys.argv[1])
    figures = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "ranks": hvd.size()}
    measures = (("fusion_kernel", fusion_kernel),
                ("allreduce_64MiB", allreduce_overhead),
                ("host_costs_us", host_costs),
                ("resnet50_step", training_step),
                ("resnet50_step_batch128", lambda: training_step(128)),
                ("against_ddp", against_ddp))
    if "--against-ddp-only" in sys.argv[2:]:
        measures = measures[-1:]
    for name, measure in measures:
        try:
            figures[name] = measure()
        except Exception as exc:  # one failed figure must not lose the others
            figures[name] = {"error": f"{type(exc).__name__}: {exc}"}
        if hvd.rank() == 0:  # after each: a kill keeps the rest
            out.write_text(json.dumps(figures, indent=2))
            sys.stdout.write(f"{name}: {json.dumps(figures[name])}\n")
    if hvd.rank() == 0:  # a record beside figures.json: copy it into docs/records
        from horovodish.bench import records
        gpu = {"gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda}
        try:
            from cupy.cuda import nccl
            version = nccl.get_version()  # e.g. 22809 for 2.28.9
            gpu["nccl"] = f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
        except Exception:  # noqa: BLE001 (a record without NCCL's version is still one)
            pass
        kind = "gpu" if len(measures) > 1 else f"gpu-against-ddp-{hvd.size()}-ranks"
        path = records.write(out.parent, kind, figures, "bash tests/gpu/run_on_gpu.sh",
                             extra_machine=gpu)
        sys.stdout.write(f"record: {path}\n")
    hvd.shutdown()


if __name__ == "__main__":
    main()
