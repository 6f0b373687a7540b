"""Torch tensors as the core's views, zero-copy: numpy for host memory, a DeviceArray
(pointer, device, shape, dtype) for CUDA memory on the NCCL path; results the runtime
owns come back from CuPy blocks through DLPack, once per block. A CUDA tensor on the
host-staged path is copied to the host instead."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..common.api.collectives import cuda_device
from ..common.dtypes import bfloat16
from ..common.execution.buffers import PREFAULT_BYTES, OutputBlocks
from ..common.execution.cuda import DEVICE_CUDA, DeviceArray
from ..common.execution.cuda_streams import DeviceEvent, record_ready, stream_waits
from ..common.messages import ReduceOp, RequestType

SUPPORTED = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                       torch.float16, torch.bfloat16, torch.float32, torch.float64,
                       torch.bool})


def check_tensor(tensor: torch.Tensor, opname: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{opname} expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in SUPPORTED:
        names = ", ".join(sorted(str(d).replace("torch.", "") for d in SUPPORTED))
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
        return tensor.view(torch.int16).numpy().view(bfloat16())
    return tensor.numpy()


def from_numpy(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing memory with a numpy array (the inverse of as_numpy)."""
    if array.dtype.kind == "V" and array.dtype == bfloat16():  # numpy has no bfloat16
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


_OUTPUTS = OutputBlocks()


def host_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An empty CPU tensor for a collective's result. From PREFAULT_BYTES on it comes
    from blocks reused once no tensor made from them is alive, their pages written when
    made (buffers.py says why: MPI receiving into fresh pages costs far more than the
    copy), so a call in a loop neither allocates nor faults; smaller ones from torch."""
    numpy_dtype = numpy_dtype_of(dtype)
    if numpy_dtype is None or math.prod(shape) * numpy_dtype.itemsize < PREFAULT_BYTES:
        return torch.empty(shape, dtype=dtype)
    return from_numpy(_OUTPUTS.one(shape, numpy_dtype))


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


_NUMPY_TYPES = {torch.uint8: np.dtype(np.uint8), torch.int8: np.dtype(np.int8),
                torch.int16: np.dtype(np.int16), torch.int32: np.dtype(np.int32),
                torch.int64: np.dtype(np.int64), torch.float16: np.dtype(np.float16),
                torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64),
                torch.bool: np.dtype(np.bool_)}


def numpy_dtype_of(dtype: torch.dtype) -> np.dtype | None:
    """The numpy dtype of a torch dtype the runtime moves (bfloat16 as ml_dtypes',
    loaded on first use), or None."""
    found = _NUMPY_TYPES.get(dtype)
    if found is None and dtype == torch.bfloat16:
        return bfloat16()
    return found


def as_cuda_view(tensor: torch.Tensor) -> DeviceArray:
    """The core's view of a contiguous CUDA tensor's memory (it keeps the tensor)."""
    return DeviceArray(tensor.data_ptr(), tensor.get_device(), tuple(tensor.shape),
                       numpy_dtype_of(tensor.dtype), tensor)


def _import_block(block: Any) -> torch.Tensor:
    """A torch tensor sharing a CuPy block's memory. The capsule is asked for with
    stream=-1 (DLPack's "no synchronization"): synchronize() has already made the
    caller's stream wait for the result, so the producer/consumer handshake that
    torch.from_dlpack performs (with retries over keyword arguments) is only host time;
    on an H100 it was the largest piece of an out-of-place call's completion. Falls
    back to torch.from_dlpack where the producer does not take stream=-1."""
    global _capsule_import
    if _capsule_import:
        try:
            return torch._C._from_dlpack(block.__dlpack__(stream=-1))
        except (TypeError, ValueError, BufferError, AttributeError):
            _capsule_import = False
    return torch.from_dlpack(block)


_capsule_import = True


def from_cuda_view(array: Any, dtype: torch.dtype) -> torch.Tensor:
    """One result (a CuPy view of a block) as a torch tensor: from_cuda_views for one."""
    base = array.base if array.base is not None else array
    tensor = _import_block(base)
    if base is not array:
        start = (array.data.ptr - base.data.ptr) // base.itemsize
        tensor = tensor[start:start + array.size]
    if tensor.shape != array.shape:
        tensor = tensor.view(array.shape)
    return tensor.view(torch.bfloat16) if dtype == torch.bfloat16 else tensor


def from_cuda_views(arrays: list[Any], dtypes: list[torch.dtype]) -> list[torch.Tensor]:
    """CUDA tensors sharing memory with CuPy views of the runtime's result blocks:
    one DLPack import per block, then a torch view per result (a DLPack import costs
    several times a torch view, and a step has one result per gradient). The block
    stays busy while any of them lives: the import holds it."""
    blocks: dict[int, torch.Tensor] = {}
    out = []
    for array, dtype in zip(arrays, dtypes):
        if array is None:
            out.append(None)
            continue
        base = array.base if array.base is not None else array
        whole = blocks.get(id(base))
        if whole is None:
            whole = blocks[id(base)] = _import_block(base)
        start = (array.data.ptr - base.data.ptr) // base.itemsize
        tensor = whole[start:start + array.size].view(array.shape)
        out.append(tensor.view(torch.bfloat16) if dtype == torch.bfloat16 else tensor)
    return out


# The current stream's handle without building a torch.cuda.Stream object (a sixth of
# the cost on an H100); torch's own compiled code uses it. CPU builds lack it.
_raw_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream_ptr(device: int) -> int:
    """The handle of device's current stream in torch."""
    if _raw_current_stream is not None:
        return _raw_current_stream(device)
    return torch.cuda.current_stream(device).cuda_stream


def ready_event(tensor: torch.Tensor) -> DeviceEvent:
    """An event on the tensor's device's current stream: the collective runs after
    whatever that stream had enqueued at this call (a kernel still writing the tensor)."""
    device = tensor.get_device()  # a CUDA tensor's index, without a torch.device object
    if device < 0:
        device = torch.cuda.current_device()
    return record_ready(current_stream_ptr(device), device)


def wait_on_current_stream(event: DeviceEvent) -> None:
    """Make the current stream of the event's device wait for it (synchronize()):
    kernels enqueued there from now on see the collective's result. No host wait."""
    stream_waits(current_stream_ptr(event.device), event)


def empty_allocator(like: torch.Tensor, keep: list[torch.Tensor], direct: bool = False):
    """An allocator the runtime calls once it knows the output shape; keeps the tensor.
    direct: on like's CUDA device, as a CuPy view (the NCCL path)."""
    def allocate(shape: tuple[int, ...]) -> Any:
        out = host_empty(shape, like.dtype) if like.is_cpu else \
            torch.empty(shape, dtype=like.dtype, device=like.device)
        keep.append(out)
        return as_cuda_view(out) if direct else as_numpy(out)
    return allocate
