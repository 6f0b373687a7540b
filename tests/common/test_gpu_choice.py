"""Which path CUDA tensors take (execution/cuda.py), decided without a GPU: the
configuration, the default until the NCCL path is proven on a GPU, per-request
placement, the error when NCCL is asked for and missing, and the stream bookkeeping
(with the fake CuPy)."""
from __future__ import annotations

import pytest

from horovodish.common import config as config_module
from horovodish.common.config import Config
from horovodish.common.execution import cuda
from horovodish.common.execution.cuda import (
    DEVICE_CUDA, DEVICE_CUDA_STAGED, GpuOperations, choose_gpu_operations, device_class,
    device_for)
from horovodish.common.messages import ReduceOp, RequestType

LOADS = lambda: None  # noqa: E731 (NCCL loads)
MISSING = lambda: "ImportError: No module named 'cupy'"  # noqa: E731


def choose(env: dict[str, str], nccl=LOADS) -> GpuOperations:
    return choose_gpu_operations(Config.from_env(env), nccl)


def test_before_a_gpu_run_passed_the_default_staged_through_the_host(monkeypatch):
    monkeypatch.setattr(cuda, "NCCL_IS_DEFAULT", False)
    assert choose({}) == GpuOperations("mpi", "mpi")
    assert choose({}, MISSING) == GpuOperations("mpi", "mpi")


@pytest.mark.parametrize("loads,want", [(LOADS, cuda.DEVICE_CUDA),
                                        (MISSING, cuda.DEVICE_CUDA_STAGED)])
def test_the_default_is_nccl_where_it_loads_found_out_at_the_first_cuda_tensor(
        monkeypatch, loads, want):
    assert cuda.NCCL_IS_DEFAULT is True  # tests/gpu passed on an H100 (docs/gpu.md)
    gpu = choose({}, lambda: pytest.fail("init() probed CuPy"))
    assert gpu == GpuOperations(cuda.AUTO, cuda.AUTO) and gpu.uses_nccl
    monkeypatch.setattr(cuda, "_nccl_loads", None)
    probes = []
    monkeypatch.setattr(cuda, "load_nccl", lambda: probes.append(1) or loads())
    monkeypatch.setattr(cuda, "why_not", lambda loader: (loader(), loads())[1])
    for _ in range(3):
        assert cuda.device_for(gpu, RequestType.ALLREDUCE, "float32") == want
    assert len(probes) == 1  # probed once
    assert choose({"HOROVODISH_GPU_OPERATIONS": "mpi"}) == GpuOperations("mpi", "mpi")


def test_the_default_does_not_import_cupy():
    probed = []
    choose({}, lambda: probed.append(1))
    assert probed == []  # importing CuPy costs a second: only when the answer needs it


@pytest.mark.parametrize("env,want", [
    ({"HOROVODISH_GPU_OPERATIONS": "nccl"}, ("nccl", "nccl")),
    ({"HOROVOD_GPU_OPERATIONS": "NCCL"}, ("nccl", "nccl")),  # Horovod's name and case
    ({"HOROVOD_GPU_ALLREDUCE": "nccl"}, ("nccl", "auto")),  # the rest: the default
    ({"HOROVOD_GPU_OPERATIONS": "nccl", "HOROVOD_GPU_ALLREDUCE": "mpi"}, ("mpi", "nccl")),
    ({"HOROVODISH_GPU_OPERATIONS": "mpi"}, ("mpi", "mpi")),
])
def test_configuration(env, want):
    assert choose(env) == GpuOperations(*want)


def test_nccl_asked_for_and_missing_fails_init_with_the_fix():
    with pytest.raises(ValueError) as error:
        choose({"HOROVOD_GPU_ALLREDUCE": "nccl"}, MISSING)
    message = str(error.value)
    assert "GPU_ALLREDUCE=nccl" in message and "No module named 'cupy'" in message
    assert "horovodish[cuda12]" in message and "=mpi" in message


def test_bad_value_names_the_variable():
    with pytest.raises(ValueError, match="HOROVOD_GPU_ALLREDUCE"):
        Config.from_env({"HOROVOD_GPU_ALLREDUCE": "ddl"})
    assert config_module.GPU_OPERATIONS == ("nccl", "mpi")


NCCL = GpuOperations("nccl", "nccl")


@pytest.mark.parametrize("gpu,kind,dtype,op,want", [
    (NCCL, RequestType.ALLREDUCE, "float32", ReduceOp.AVERAGE, DEVICE_CUDA),
    (NCCL, RequestType.ALLREDUCE, "bfloat16", ReduceOp.SUM, DEVICE_CUDA),
    (NCCL, RequestType.ALLREDUCE, "bool", ReduceOp.SUM, DEVICE_CUDA),
    (NCCL, RequestType.ALLREDUCE, "int16", ReduceOp.SUM, DEVICE_CUDA_STAGED),  # no NCCL type
    (NCCL, RequestType.REDUCESCATTER, "int16", ReduceOp.SUM, DEVICE_CUDA_STAGED),
    (NCCL, RequestType.ALLREDUCE, "float32", ReduceOp.ADASUM, DEVICE_CUDA_STAGED),
    (NCCL, RequestType.ALLGATHER, "int16", None, DEVICE_CUDA),  # bytes: any dtype
    (GpuOperations("nccl", "mpi"), RequestType.BROADCAST, "float32", None, DEVICE_CUDA_STAGED),
    (GpuOperations("mpi", "nccl"), RequestType.ALLREDUCE, "float32", ReduceOp.SUM,
     DEVICE_CUDA_STAGED),
    (GpuOperations(), RequestType.ALLTOALL, "float32", None, DEVICE_CUDA_STAGED),
])
def test_placement(gpu, kind, dtype, op, want):
    assert device_for(gpu, kind, dtype, op) == want


def test_device_class_ignores_the_path():
    assert device_class("cuda") == device_class("cuda/host") == "cuda"
    assert device_class("cpu") == "cpu"


def test_work_stream_waits_once_per_submit_event_and_tags_completion(tmp_path, monkeypatch):
    import sys

    from horovodish.common.execution.cuda_streams import DeviceEvent, WorkStream

    from .fake_cuda import Exchange, FakeCupy, FakeNccl
    cupy = FakeCupy(FakeNccl(Exchange(1)), tmp_path)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    stream = WorkStream(cupy, device=3)
    shared = DeviceEvent(cupy.cuda.Event(), 3)
    other = DeviceEvent(cupy.cuda.Event(), 3)
    stream.after([shared, shared, None, other, shared])  # a group's tensors share one
    work = stream.stream.ptr
    assert cupy.waits == [(work, shared.event.ptr), (work, other.event.ptr)]
    done = stream.finished()
    assert done.device == 3 and cupy.records == [(done.event.ptr, work)]


def test_device_mismatch_across_ranks_fails_every_rank_naming_the_tensor():
    from pathlib import Path

    from multirank import assert_ranks_ok, run_ranks
    worker = Path(__file__).parent / "workers" / "gpu_mismatch_worker.py"
    assert_ranks_ok(run_ranks(worker, 2, timeout=120), 2,
                    ["cpu_on_rank_0_cuda_elsewhere", "nccl_on_rank_0_staged_elsewhere",
                     "the_runtime_goes_on"])
