"""TensorFlow 2 adapter: ``import horovodish.tensorflow as hvd`` in place of Horovod's.

    import horovodish.tensorflow as hvd
    hvd.init()
    total = hvd.allreduce(tf.ones(3), op=hvd.Sum)   # == size() * ones on every rank

Every collective works on eager tensors and inside tf.function (not under jit_compile);
see docs/tensorflow.md.
"""
from ..common.basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                             gloo_built, gloo_enabled, init, is_homogeneous, is_initialized,
                             local_rank, local_size, mpi_built, mpi_enabled,
                             mpi_threads_supported, nccl_built, rank, rocm_built, shutdown,
                             size, start_timeline, stop_timeline, sycl_built)
from ..common.errors import HorovodInternalError, HostsUpdatedInterrupt
from ..common.process_sets import (ProcessSet, add_process_set, global_process_set,
                                   remove_process_set)
from . import elastic
from .compression import Compression
from .functions import (allgather_object, broadcast_global_variables, broadcast_object,
                        broadcast_object_fn, broadcast_variables)
from .gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from .mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allreduce, alltoall,
                      barrier, broadcast, broadcast_, grouped_allgather, grouped_allreduce,
                      grouped_reducescatter, join, reducescatter)
from .optimizer import DistributedOptimizer
from .rank_ops import (local_rank_op, local_size_op, process_set_included_op, rank_op,
                       size_op)
from .util import _executing_eagerly  # Horovod's scripts and tests call hvd._executing_eagerly


def __getattr__(name: str) -> object:
    """SyncBatchNormalization on first use: it is a Keras layer, and Keras takes a while
    to import."""
    if name == "SyncBatchNormalization":
        from .sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
