"""Benchmark: what users call, against its baseline measured in the same run.

    horovodishrun -np 2 python -m horovodish.bench [--json out.json] [--plot busbw.png]

Every figure is a ratio against a baseline timed in the same job, in alternating rounds
(a slow spell of a shared machine hits both sides):

- sizes 4 KiB to 64 MiB: one synchronous allreduce through each public path (the core
  API in place; torch's ``allreduce_`` in place and ``allreduce`` out of place;
  TensorFlow's eager ``allreduce``) against ``MPI_Allreduce`` on a preallocated buffer;
- a burst of 256 x 16 KiB submitted asynchronously, then synchronized, through the same
  paths, against one MPI call on the 4 MiB concatenation and 256 separate MPI calls;
- the other collectives through torch (broadcast in place and out of place, grouped
  allreduce both ways, allgather, reducescatter) against MPI's own call on numpy
  buffers, 4 KiB to 16 MiB;
- a training step (an MLP, ``DistributedOptimizer``) against torch DDP on gloo and
  against the same step with no communication at all (the bound), with where the step's
  time goes; the 162-tensor step (and the sharded optimizer against torch's
  ZeroRedundancyOptimizer) with the host time each reducer adds per tensor;
- one synchronous ``allreduce_`` per call against ``torch.distributed.all_reduce`` on
  gloo, 4 KiB to 64 MiB;
- the same MLP in JAX: ``horovodish.jax.DistributedOptimizer`` over optax against JAX's
  own multi-process collectives (``jax.distributed`` with gloo, a ``pmean`` of the
  gradients inside one jitted ``shard_map`` step), and the bound;
- the idle cost: how much a compute-bound loop slows while the runtime is idle.

docs/tuning.md explains each figure and records the latest run.
"""
from .cli import main

__all__ = ["main"]
