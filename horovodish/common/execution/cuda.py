"""CuPy on demand, and which path a CUDA tensor takes: NCCL on device memory, or
host-staged MPI.

CuPy is optional. Nothing here imports it at module level: a CPU-only install never
pays for it (importing CuPy takes about a second) or breaks on it; what needs it
imports it when first called.

The choice is made once, at ``init()``: ``HOROVODISH_GPU_OPERATIONS=nccl|mpi`` (or
Horovod's ``HOROVOD_GPU_OPERATIONS``) for every collective, ``HOROVOD_GPU_ALLREDUCE``
for allreduce alone. Unset, CUDA tensors are staged through host memory and reduced
over MPI until the NCCL path has passed tests/gpu on a GPU (issue 24); after that,
NCCL becomes the default wherever CuPy's NCCL loads (``NCCL_IS_DEFAULT``).

A request's device string says which memory its views are in, because every rank must
choose the same backend for it: ``cuda`` (CuPy views of device memory, the NCCL
backend) or ``cuda/host`` (numpy copies in host memory, the MPI backends). The
coordinator compares the class (``cuda``) and the path separately, so a CPU tensor
against a CUDA one, and NCCL on one rank against staging on another, each fail every
rank with an error naming the tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..config import Config
from ..messages import ReduceOp, RequestType

NCCL = "nccl"
HOST_STAGED = "mpi"
DEVICE_CUDA = "cuda"
DEVICE_CUDA_STAGED = "cuda/host"

# False until tests/gpu/run_on_gpu.sh has passed on a GPU machine (issue 24); then the
# default for CUDA tensors becomes NCCL wherever CuPy's NCCL loads.
NCCL_IS_DEFAULT = False

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


class TypedView:
    """A CuPy array seen with a dtype CuPy cannot name (bfloat16, carried as its int16
    bits). The core names a request by its tensor's ``.dtype``, so the view reports the
    real one; everything else (``.data.ptr``, ``.shape``, ``.device``, ``__dlpack__``)
    is the array's."""
    __slots__ = ("array", "dtype")

    def __init__(self, array: Any, dtype: Any) -> None:
        self.array = array
        self.dtype = dtype

    def __getattr__(self, name: str) -> Any:
        return getattr(self.array, name)


def plain_array(view: Any) -> Any:
    """The CuPy array behind a view (a TypedView's, or the view itself)."""
    return view.array if type(view) is TypedView else view


# -- the choice --------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuOperations:
    """The path of CUDA tensors: NCCL or HOST_STAGED, for allreduce and for the rest."""
    allreduce: str = HOST_STAGED
    others: str = HOST_STAGED

    @property
    def uses_nccl(self) -> bool:
        return NCCL in (self.allreduce, self.others)


def choose_gpu_operations(config: Config,
                          nccl_problem: Callable[[], str | None] = lambda: why_not(load_nccl)
                          ) -> GpuOperations:
    """The path for CUDA tensors from the configuration; ValueError if NCCL is asked
    for and does not load. Probes CuPy only when the answer depends on it."""
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
        default = NCCL if NCCL_IS_DEFAULT and nccl_problem() is None else HOST_STAGED
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
    if path != NCCL:
        return DEVICE_CUDA_STAGED
    if kind in _REDUCING and (dtype not in NCCL_REDUCIBLE or op == ReduceOp.ADASUM):
        return DEVICE_CUDA_STAGED
    return DEVICE_CUDA
