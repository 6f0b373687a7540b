"""Where the core reads a call's tensors and where their results go back.

A call takes one of two paths. Direct (the NCCL path, ``tensor_views.on_device``): its
CUDA tensors go to the core as CuPy views of their own memory and results stay on the
device. Otherwise host memory: CPU tensors as numpy views, and a tensor on an
accelerator is staged (copied to the host, its result copied back to its device).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from ...common.execution.cuda import DEVICE_CUDA
from ...common.messages import ReduceOp, RequestType
from .. import tensor_views
from ..tensor_views import as_cuda_view, as_numpy, device_class, from_numpy, on_device


# The dtypes a CPU tensor's numpy view has as they are (bfloat16 needs a conversion).
_NUMPY_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                           torch.float16, torch.float32, torch.float64, torch.bool})


def plain_array(tensor: Any) -> np.ndarray | None:
    """The numpy view of a tensor that needs no conversion (a contiguous CPU tensor of a
    numpy dtype, outside autograd), else None: the single-tensor calls' short path,
    which skips the grouped path's lists and closures (per-call Python is most of a
    small collective's time)."""
    if isinstance(tensor, torch.Tensor) and tensor.is_cpu and not tensor.requires_grad \
            and tensor.dtype in _NUMPY_DTYPES and tensor.is_contiguous():
        return tensor.numpy()
    return None


def takes_direct_path(tensors: Sequence[torch.Tensor], kind: RequestType,
                      op: ReduceOp | None = None) -> bool:
    """Whether this call takes the NCCL path (a CPU tensor costs one attribute read)."""
    return bool(tensors) and isinstance(tensors[0], torch.Tensor) and \
        tensors[0].is_cuda and on_device(list(tensors), kind, op)


def contiguous_for_core(tensor: torch.Tensor, direct: bool = False) -> torch.Tensor:
    """A contiguous tensor with tensor's values where the core reads it: itself if it is
    one, else a copy (of a strided tensor, or in host memory of one on an accelerator
    that is staged: see tensor_views.staged)."""
    # Looked up on the module on every call: the torch workers' host-staging tests
    # replace tensor_views.staged.
    if not direct and tensor_views.staged(tensor):
        return tensor.detach().to("cpu", memory_format=torch.contiguous_format, copy=True)
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def empty_result_like(tensor: torch.Tensor, direct: bool = False) -> torch.Tensor:
    """An empty contiguous tensor for tensor's result: on its device if direct, else
    on the host."""
    if direct:
        return torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    return tensor_views.host_empty(tuple(tensor.shape), tensor.dtype)


def on_callers_device(result: torch.Tensor, like: torch.Tensor,
                      direct: bool = False) -> torch.Tensor:
    """A result where the caller's tensor lives (a staged one's device)."""
    if not direct and tensor_views.staged(like):
        return result.to(like.device, copy=True)
    return result


def owned_results(results: list[np.ndarray], tensors: Sequence[torch.Tensor]
                  ) -> list[torch.Tensor]:
    """Results in runtime-owned host blocks as tensors where the callers' live (a staged
    tensor's device gets a copy; the block is then free again)."""
    return [on_callers_device(from_numpy(result), tensor)
            for result, tensor in zip(results, tensors)]


def core_view(tensor: torch.Tensor, direct: bool) -> Any:
    """The view the core reads or writes: CuPy's on the direct path, else numpy's."""
    return as_cuda_view(tensor) if direct else as_numpy(tensor)


def core_device(tensor: torch.Tensor, direct: bool) -> str:
    """The device class the core negotiates for tensor on this path."""
    return DEVICE_CUDA if direct else device_class(tensor)


def write_back(tensors: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]
               ) -> Callable[[list[Any]], list[torch.Tensor]]:
    """Completion of an in-place op: a non-contiguous input got a contiguous stand-in,
    whose result is copied back into it."""
    def finish(_: list[Any]) -> list[torch.Tensor]:
        with torch.no_grad():  # as Horovod: an in-place collective is outside autograd
            for tensor, output in zip(tensors, outputs):
                if tensor.data_ptr() != output.data_ptr():
                    tensor.copy_(output)
        return list(tensors)
    return finish
