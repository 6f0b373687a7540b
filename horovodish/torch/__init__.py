"""PyTorch adapter: ``import horovodish.torch as hvd`` in place of ``import horovod.torch as hvd``.

    import horovodish.torch as hvd
    hvd.init()
    total = hvd.allreduce(torch.ones(3), op=hvd.Sum)   # == size() * ones on every rank
"""
import os as _os

# PyTorch's own switch for transparent huge pages on CPU tensors of 2 MiB and more, read
# at the first such allocation (so set before any): on memory without huge pages, MPI's
# transfers and our copies ran far slower than on numpy's, which asks for them itself
# (a 64 MiB allreduce: 17.8 against 13.0 ms; docs/tuning.md, "Huge pages").
# THP_MEM_ALLOC_ENABLE=0 keeps PyTorch's default.
_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from ..common.api import *  # noqa: F401,F403  (the names every adapter shares)
from ..compat.horovod_paths.common_util import check_extension  # noqa: F401 (Horovod's package has it)
from . import elastic
from .compression import Compression
from .compiled import compile_backend, keep_collectives_out_of_graphs
from .comm_hooks import GradBucket, allreduce_hook, bf16_compress_hook, fp16_compress_hook
from .powersgd import PowerSGDState, powersgd_hook
from .buffers import BufferSync, sync_buffers
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                        broadcast_parameters)
from .optimizer import DistributedOptimizer
from .sync_batch_norm import SyncBatchNorm
from .sparse import sparse_allreduce, sparse_allreduce_async
from .mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async,
                      allreduce, allreduce_, allreduce_async, allreduce_async_, alltoall,
                      alltoall_async, barrier, broadcast, broadcast_, broadcast_async,
                      broadcast_async_, grouped_allgather, grouped_allgather_async,
                      grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                      grouped_allreduce_async_, grouped_reducescatter,
                      grouped_reducescatter_async, join, poll, reducescatter,
                      reducescatter_async, synchronize)

keep_collectives_out_of_graphs()  # see compiled.py
