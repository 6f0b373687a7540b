"""The process's horovodish state and the questions about it every adapter answers.

Nothing here starts or stops anything (``lifecycle.py`` does); this module imports
nothing else of the package's API, so every other API module can sit on top of it.
"""
from __future__ import annotations

import importlib.util
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..config import Config
from ..errors import not_initialized_error
from ..execution.cuda import (GpuOperations, cuda_runtime_version, load_nccl, nccl_version,
                              why_not)


@dataclass
class State:
    config: Config
    comm: Any
    manage_comm: Any  # main-thread only: creating process sets; never used by a runtime
    local_comm: Any
    cross_comm: Any
    runtime: Any
    rank: int
    size: int
    dynamic_process_sets: bool = False
    homogeneous: bool = True  # every host runs as many ranks (Horovod's is_homogeneous)
    process_sets: dict[int, Any] = field(default_factory=dict)
    next_process_set_id: int = 1
    # Ids of removed sets, reused first-in first-out before new ones (Horovod's table)
    free_process_set_ids: deque = field(default_factory=deque)
    registration_calls: int = 0  # add/remove_process_set calls so far (the same on every rank)
    gpu: GpuOperations = GpuOperations()  # the path of CUDA tensors, chosen at init()
    watchdog: Any = None  # heartbeats between hosts (runtime/heartbeat.py), or None


_state: State | None = None


def current() -> State | None:
    """The state, or None before init() and after shutdown()."""
    return _state


def replace(new: State | None) -> State | None:
    """Install new (None: uninitialized) and return what was there; lifecycle only."""
    global _state
    old, _state = _state, new
    return old


def state() -> State:
    if _state is None:
        raise not_initialized_error()
    return _state


def is_initialized() -> bool:
    return _state is not None


def rank() -> int:
    return state().rank


def size() -> int:
    return state().size


def local_rank() -> int:
    return state().local_comm.Get_rank()


def local_size() -> int:
    return state().local_comm.Get_size()


def cross_rank() -> int:
    return state().cross_comm.Get_rank()


def cross_size() -> int:
    return state().cross_comm.Get_size()


def is_homogeneous() -> bool:
    """Whether every host runs the same number of ranks (decided at init)."""
    return state().homogeneous


def mpi_threads_supported() -> bool:
    from mpi4py import MPI  # (only imported: the API imports it anyway)
    state()
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_enabled() -> bool:
    return is_initialized()


def mpi_built() -> bool:
    return importlib.util.find_spec("mpi4py") is not None


def gloo_built() -> bool:
    return False


def gloo_enabled() -> bool:
    """Horovod's Gloo controller; horovodish runs on MPI alone."""
    return False


def nccl_built() -> int:
    """NCCL's version code (e.g. 22805 for 2.28.5) when CuPy's NCCL bindings load here
    (the nccl backend's requirement), else 0 (Horovod returns its build's version or
    0; a version is truthy, so `if hvd.nccl_built():` reads the same)."""
    try:
        return nccl_version() if why_not(load_nccl) is None else 0
    except Exception:
        return 0


def cuda_built() -> bool:
    """True when CuPy and its CUDA runtime load (the CUDA path's requirement; a GPU need
    not be present: Horovod's answer is about the build, too)."""
    try:
        return cuda_runtime_version() > 0
    except Exception:
        return False


def ccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def rocm_built() -> bool:
    return False


def sycl_built() -> bool:
    return False
