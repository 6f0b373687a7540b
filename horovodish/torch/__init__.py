"""PyTorch adapter: ``import horovodish.torch as hvd`` in place of ``import horovod.torch as hvd``.

    import horovodish.torch as hvd
    hvd.init()
    total = hvd.allreduce(torch.ones(3), op=hvd.Sum)   # == size() * ones on every rank
"""
from ..common.api import *  # noqa: F401,F403  (the names every adapter shares)
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
