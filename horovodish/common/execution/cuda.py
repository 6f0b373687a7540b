"""CuPy on demand, and which path a CUDA tensor takes: NCCL on device memory, or
host-staged MPI.

CuPy is optional. Nothing here imports it at module level: a CPU-only install never
pays for it (importing CuPy takes about a second) or breaks on it; what needs it
imports it when first called.

The choice is made at ``init()``: ``HOROVODISH_GPU_OPERATIONS=nccl|mpi`` (or
Horovod's ``HOROVOD_GPU_OPERATIONS``) for every collective, ``HOROVOD_GPU_ALLREDUCE``
for allreduce alone. Unset, the default is NCCL wherever CuPy's NCCL loads, else
host-staged MPI (``NCCL_IS_DEFAULT``: tests/gpu passes on an H100); whether
it loads is found out at the first CUDA tensor (``AUTO``), so a job that never has
one never imports CuPy.

A request's device string says which memory its views are in, because every rank must
choose the same backend for it: ``cuda`` (device memory, described by a ``DeviceArray``,
for the NCCL backend) or ``cuda/host`` (numpy copies in host memory, the MPI backends).
The coordinator compares the class (``cuda``) and the path separately, so a CPU tensor
against a CUDA one, and NCCL on one rank against staging on another, each fail every
rank with an error naming the tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any, Callable, NamedTuple

import numpy as np

from ..config import Config
from ..messages import ReduceOp, RequestType

NCCL = "nccl"
HOST_STAGED = "mpi"
DEVICE_CUDA = "cuda"
DEVICE_CUDA_STAGED = "cuda/host"

# tests/gpu/run_on_gpu.sh passes on an H100 with NCCL: unset, CUDA tensors take NCCL
# wherever CuPy's NCCL loads.
NCCL_IS_DEFAULT = True
AUTO = "auto"  # the default, resolved at the first CUDA tensor (nccl_loads())

# What NCCL can reduce: its own types, and bool as uint8 (Sum and Max as max, Product
# and Min as min, i.e. logical or / and). NCCL has no int16: such reductions stage.
NCCL_REDUCIBLE = frozenset({"uint8", "int8", "int32", "int64", "float16", "bfloat16",
                            "float32", "float64", "bool"})
_REDUCING = (RequestType.ALLREDUCE, RequestType.REDUCESCATTER)


def device_class(device: str) -> str:
    """cpu or cuda, whatever path the data takes."""
    return device.partition("/")[0]


# -- CuPy, loaded on first use -----------------------------------------------------------
def load_cupy() -> Any:
    """The cupy module; ImportError (with CuPy's reason) where it does not import."""
    import cupy
    return cupy


def load_nccl() -> Any:
    """CuPy's NCCL bindings; ImportError where CuPy or libnccl does not load."""
    load_cupy()
    from cupy.cuda import nccl
    if not getattr(nccl, "available", True):  # CuPy imports without libnccl
        raise ImportError("CuPy is installed but could not load libnccl "
                          "(install nvidia-nccl-cu12 or nvidia-nccl-cu13)")
    return nccl


def why_not(loader: Callable[[], Any]) -> str | None:
    """None if loader() works here, else what went wrong, in one line."""
    try:
        loader()
    except Exception as exc:  # a broken CUDA install raises more than ImportError
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def cuda_runtime_version() -> int:
    """CUDA runtime version as CUDA writes it (13000 is 13.0); raises without CUDA."""
    return int(load_cupy().cuda.runtime.runtimeGetVersion())


def nccl_version() -> int:
    """NCCL's runtime version code (22805 is 2.28.5); raises without NCCL."""
    return int(load_nccl().get_version())


class DevicePointer(NamedTuple):
    ptr: int


class DeviceId(NamedTuple):
    id: int


class DeviceArray:
    """Device memory as the core and the NCCL backend read it: ``.data.ptr``,
    ``.device.id``, ``.shape`` and a numpy ``.dtype`` (bfloat16 as ml_dtypes', which
    CuPy cannot name). An adapter makes one per tensor per call, so it is a few
    attribute reads, not a CuPy array (on the GPU machine, building one through
    ``__cuda_array_interface__`` cost several times a whole submit). owner: what keeps
    the memory alive (the framework's tensor)."""
    __slots__ = ("data", "device", "shape", "dtype", "owner")

    def __init__(self, ptr: int, device: int, shape: tuple[int, ...], dtype: np.dtype,
                 owner: Any = None) -> None:
        self.data = DevicePointer(ptr)
        self.device = DeviceId(device)
        self.shape = shape
        self.dtype = dtype
        self.owner = owner

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


# -- the choice --------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuOperations:
    """The path of CUDA tensors: NCCL or HOST_STAGED, for allreduce and for the rest."""
    allreduce: str = HOST_STAGED
    others: str = HOST_STAGED

    @property
    def uses_nccl(self) -> bool:
        """Whether CUDA tensors may take NCCL (AUTO: if it loads, found out later)."""
        return not {NCCL, AUTO}.isdisjoint((self.allreduce, self.others))


_nccl_loads: bool | None = None


def nccl_loads(nccl_problem: Callable[[], str | None] = lambda: why_not(load_nccl)) -> bool:
    """Whether CuPy's NCCL loads here; probed once (importing CuPy takes a second)."""
    global _nccl_loads
    if _nccl_loads is None:
        _nccl_loads = nccl_problem() is None
    return _nccl_loads


def choose_gpu_operations(config: Config,
                          nccl_problem: Callable[[], str | None] = lambda: why_not(load_nccl)
                          ) -> GpuOperations:
    """The path for CUDA tensors from the configuration; ValueError if NCCL is asked
    for and does not load. Probes CuPy only when NCCL is asked for: the default is
    AUTO, resolved at the first CUDA tensor."""
    others = config.gpu_operations
    allreduce = config.gpu_allreduce or others
    if NCCL in (others, allreduce):
        problem = nccl_problem()
        if problem is not None:
            asked = "GPU_OPERATIONS" if config.gpu_operations == NCCL else "GPU_ALLREDUCE"
            raise ValueError(
                f"HOROVODISH_{asked}=nccl (or HOROVOD_{asked}) asks for NCCL, but CuPy's "
                f"NCCL does not load here ({problem}). Install horovodish[cuda12] or "
                f"horovodish[cuda13] to match your CUDA, or set HOROVODISH_{asked}=mpi to "
                "stage CUDA tensors through host memory.")
    if others is None or allreduce is None:
        default = AUTO if NCCL_IS_DEFAULT else HOST_STAGED
        others = others or default
        allreduce = allreduce or default
    return GpuOperations(allreduce=allreduce, others=others)


def device_for(gpu: GpuOperations, kind: RequestType, dtype: str,
               op: ReduceOp | None = None) -> str:
    """The device string of a CUDA tensor's request: DEVICE_CUDA where NCCL runs it on
    device memory, DEVICE_CUDA_STAGED where it goes through host memory (the choice,
    or a reduction NCCL cannot do: int16, Adasum). The same on every rank for the same
    configuration, call and dtype."""
    path = gpu.allreduce if kind == RequestType.ALLREDUCE else gpu.others
    if path == AUTO:
        path = NCCL if nccl_loads() else HOST_STAGED
    if path != NCCL:
        return DEVICE_CUDA_STAGED
    if kind in _REDUCING and (dtype not in NCCL_REDUCIBLE or op == ReduceOp.ADASUM):
        return DEVICE_CUDA_STAGED
    return DEVICE_CUDA
