"""Torch tensors as the core's views, zero-copy: numpy for host memory, CuPy for CUDA
memory on the NCCL path (through ``__cuda_array_interface__``; results come back
through DLPack). A CUDA tensor on the host-staged path is copied to the host instead."""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import torch

from ..common.api.collectives import cuda_device
from ..common.execution.cuda import DEVICE_CUDA, TypedView, load_cupy, plain_array
from ..common.execution.cuda_streams import DeviceEvent, record_ready, stream_waits
from ..common.messages import ReduceOp, RequestType

_SUPPORTED = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64, torch.bool}


def check_tensor(tensor: torch.Tensor, opname: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{opname} expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in _SUPPORTED:
        names = ", ".join(sorted(str(d).replace("torch.", "") for d in _SUPPORTED))
        raise TypeError(f"{opname}: dtype {tensor.dtype} is not supported; supported: {names}")
    if not tensor.is_cpu and tensor.is_meta:  # is_cpu: 80 ns; tensor.device 300 ns
        raise NotImplementedError(f"{opname}: a meta tensor has no values to send.")


def staged(tensor: torch.Tensor) -> bool:
    """Whether a tensor goes through host memory: one on an accelerator (CUDA) is copied
    to the host for the collective and its result copied back, until the NCCL path
    exists. (Tests force staging of CPU tensors by replacing this function.)"""
    return not tensor.is_cpu


def as_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy array sharing memory with a contiguous CPU tensor."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def from_numpy(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing memory with a numpy array (the inverse of as_numpy)."""
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def device_class(tensor: torch.Tensor) -> str:
    """The device string of a request for a tensor that is not on the NCCL path: cpu,
    or e.g. cuda/host for a CUDA tensor staged through host memory."""
    return "cpu" if tensor.is_cpu else f"{tensor.device.type}/host"


def on_device(tensors: list[torch.Tensor], kind: RequestType,
              op: ReduceOp | None = None) -> bool:
    """Whether these tensors (one call's) go to the core as CuPy views of their CUDA
    memory (the NCCL path): all on one CUDA device, and init()'s choice sends this
    call and dtype there (execution/cuda.py). Otherwise CUDA tensors are staged."""
    if not tensors or not tensors[0].is_cuda:
        return False
    first = tensors[0]
    if any(t.device != first.device or t.dtype != first.dtype for t in tensors[1:]):
        return False  # a group that mixes devices or dtypes stages (same on every rank)
    return cuda_device(kind, str(first.dtype)[len("torch."):], op) == DEVICE_CUDA


def as_cuda_view(tensor: torch.Tensor) -> Any:
    """A CuPy array sharing memory with a contiguous CUDA tensor (bfloat16, which the
    interface cannot describe, as its int16 bits, in a view that tells the core its
    real dtype)."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        return TypedView(load_cupy().asarray(tensor.view(torch.int16)), ml_dtypes.bfloat16)
    return load_cupy().asarray(tensor)


def from_cuda_view(array: Any, dtype: torch.dtype) -> torch.Tensor:
    """A CUDA tensor sharing memory with a CuPy array (the inverse of as_cuda_view)."""
    tensor = torch.from_dlpack(plain_array(array))
    return tensor.view(torch.bfloat16) if dtype == torch.bfloat16 else tensor


def ready_event(tensor: torch.Tensor) -> DeviceEvent:
    """An event on the tensor's device's current stream: the collective runs after
    whatever that stream had enqueued at this call (a kernel still writing the tensor)."""
    device = tensor.device.index if tensor.device.index is not None else \
        torch.cuda.current_device()
    return record_ready(torch.cuda.current_stream(device).cuda_stream, device)


def wait_on_current_stream(event: DeviceEvent) -> None:
    """Make the current stream of the event's device wait for it (synchronize()):
    kernels enqueued there from now on see the collective's result. No host wait."""
    stream_waits(torch.cuda.current_stream(event.device).cuda_stream, event)


def empty_allocator(like: torch.Tensor, keep: list[torch.Tensor], direct: bool = False):
    """An allocator the runtime calls once it knows the output shape; keeps the tensor.
    direct: on like's CUDA device, as a CuPy view (the NCCL path)."""
    def allocate(shape: tuple[int, ...]) -> Any:
        out = torch.empty(shape, dtype=like.dtype, device=like.device)
        keep.append(out)
        return as_cuda_view(out) if direct else as_numpy(out)
    return allocate
