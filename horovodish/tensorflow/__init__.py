"""TensorFlow 2 adapter: ``import horovodish.tensorflow as hvd`` in place of Horovod's.

    import horovodish.tensorflow as hvd
    hvd.init()
    total = hvd.allreduce(tf.ones(3), op=hvd.Sum)   # == size() * ones on every rank

Every collective works on eager tensors and inside tf.function (not under jit_compile);
see docs/tensorflow.md.
"""
from ..common.api import *  # noqa: F401,F403  (the names every adapter shares)
from . import elastic
from .compression import Compression
from .functions import (allgather_object, broadcast_global_variables, broadcast_object,
                        broadcast_object_fn, broadcast_variables)
from .gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from .hooks import BroadcastGlobalVariablesHook
from .mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allreduce, alltoall,
                      barrier, broadcast, broadcast_, grouped_allgather, grouped_allreduce,
                      grouped_reducescatter, join, reducescatter)
from .optimizer import DistributedOptimizer
from .rank_ops import (local_rank_op, local_size_op, process_set_included_op, rank_op,
                       size_op)
from ..compat.horovod_paths.tensorflow_util import _executing_eagerly  # Horovod's scripts and tests call hvd._executing_eagerly
from ..compat.horovod_paths.common_util import check_extension, gpu_available, split_list  # noqa: F401 (as Horovod's)
from .mpi_ops import check_num_rank_power_of_2, handle_average_backwards_compatibility  # noqa: F401


def __getattr__(name: str) -> object:
    """SyncBatchNormalization on first use: it is a Keras layer, and Keras takes a while
    to import."""
    if name == "SyncBatchNormalization":
        from .sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
