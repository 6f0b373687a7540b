"""What adapters and scripts call: lifecycle, topology, process sets, the errors.

``__all__`` is the one list of names every adapter re-exports (``horovodish.torch``,
``horovodish.tensorflow``, ``horovodish.tensorflow.keras``), so they cannot drift apart.
Inside the package the modules form a one-way chain: ``process_state`` (imports no other
API module) <- ``process_sets`` <- ``collectives`` <- ``objects`` <- ``process_set_registry``
<- ``lifecycle``.
"""
from ..errors import HorovodInternalError, HostsUpdatedInterrupt
from .lifecycle import (add_process_set, init, remove_process_set, shutdown, start_timeline,
                        stop_timeline)
from .process_sets import ProcessSet, global_process_set
from .process_state import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                            gloo_built, gloo_enabled, is_homogeneous, is_initialized,
                            local_rank, local_size, mpi_built, mpi_enabled,
                            mpi_threads_supported, nccl_built, rank, rocm_built, size, state,
                            sycl_built)

__all__ = [
    "init", "shutdown", "is_initialized", "start_timeline", "stop_timeline",
    "size", "rank", "local_size", "local_rank", "cross_size", "cross_rank", "is_homogeneous",
    "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "cuda_built", "ccl_built", "ddl_built", "rocm_built", "sycl_built",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "HorovodInternalError", "HostsUpdatedInterrupt",
]
