"""The GPU path's figures (issue 24), written as JSON to argv[1]:

1. pack + unpack of ResNet-50's 161 gradients (float32, about 102 MB) by the batched
   kernel, against a device-to-device copy of the same bytes (target: >= 60% of the
   copy's bandwidth);
2. one-rank NCCL allreduce of 64 MiB through the runtime against the raw CuPy NCCL
   call on the same buffer (target: within 10%);
3. a ResNet-50 training step with DistributedOptimizer against without (target:
   within 5%).

Run at one rank with HOROVODISH_GPU_OPERATIONS=nccl (run_on_gpu.sh does). GPU times
come from CUDA events; each figure is the median of several repetitions.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
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
    import cupy
    from cupy.cuda import nccl

    count = (64 << 20) // 4
    x = torch.ones(count, device="cuda")
    runtime_ms = _gpu_ms(lambda: hvd.allreduce_(x, op=hvd.Sum, name="bench.64MiB"))
    uid = nccl.get_unique_id()
    communicator = nccl.NcclCommunicator(1, uid, 0)
    stream = torch.cuda.current_stream().cuda_stream
    raw_ms = _gpu_ms(lambda: communicator.allReduce(x.data_ptr(), x.data_ptr(), count,
                                                    nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream))
    # GPU time above covers the stream's span; the host cost of a call matters too.
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        hvd.allreduce_(x, op=hvd.Sum, name="bench.64MiB")
    torch.cuda.synchronize()
    runtime_wall_ms = (time.perf_counter() - start) / 20 * 1e3
    start = time.perf_counter()
    for _ in range(20):
        communicator.allReduce(x.data_ptr(), x.data_ptr(), count, nccl.NCCL_FLOAT32,
                               nccl.NCCL_SUM, stream)
    torch.cuda.synchronize()
    raw_wall_ms = (time.perf_counter() - start) / 20 * 1e3
    communicator.destroy()
    ratio = runtime_wall_ms / raw_wall_ms
    return {"bytes": count * 4, "runtime_gpu_span_ms": runtime_ms, "raw_gpu_span_ms": raw_ms,
            "runtime_wall_ms": runtime_wall_ms, "raw_wall_ms": raw_wall_ms,
            "runtime_over_raw": ratio, "target": 1.10, "met": ratio <= 1.10,
            "cupy": cupy.__version__}


def training_step(batch: int = 32) -> dict:
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
        times = []
        for _ in range(10):
            start = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    plain = step_ms(False)
    distributed = step_ms(True)
    ratio = distributed / plain
    return {"batch": batch, "plain_step_ms": plain, "distributed_step_ms": distributed,
            "distributed_over_plain": ratio, "target": 1.05, "met": ratio <= 1.05}


def main() -> None:
    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    out = Path(sys.argv[1])
    figures = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "ranks": hvd.size()}
    for name, measure in (("fusion_kernel", fusion_kernel),
                          ("allreduce_64MiB", allreduce_overhead),
                          ("resnet50_step", training_step)):
        try:
            figures[name] = measure()
        except Exception as exc:  # one failed figure must not lose the others
            figures[name] = {"error": f"{type(exc).__name__}: {exc}"}
        out.write_text(json.dumps(figures, indent=2))  # after each: a kill keeps the rest
        sys.stdout.write(f"{name}: {json.dumps(figures[name])}\n")
    hvd.shutdown()


if __name__ == "__main__":
    main()
