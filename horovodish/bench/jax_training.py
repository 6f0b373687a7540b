"""A JAX data-parallel step through horovodish's DistributedOptimizer against JAX's own
multi-process collectives (``jax.distributed`` with gloo on CPU: a ``pmean`` of the
gradients inside one jitted ``shard_map`` step over a mesh of one CPU device per
process) and against the same step with no communication at all (the bound): the MLP,
batch and SGD of the torch step, the same data for every contender.

``jax.distributed.initialize`` must come before JAX runs anything in the process, so
the bench runs this before any other JAX work, and shuts JAX's client down after it.
"""
from __future__ import annotations

import importlib.util
import os
import statistics
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .timing import Contender, alternating
from .training import free_port

OURS = "horovodish DistributedOptimizer"
JAX = "jax.distributed (gloo) pmean"
BOUND = "no communication"


def available() -> bool:
    """Whether jax (with jax.shard_map and make_array_from_process_local_data) and optax
    are installed; imports jax, which starts nothing."""
    if importlib.util.find_spec("jax") is None or importlib.util.find_spec("optax") is None:
        return False
    import jax
    return hasattr(jax, "shard_map") and hasattr(jax, "make_array_from_process_local_data")


def _start_jax_distributed(comm: MPI.Comm) -> None:
    """JAX's multi-process runtime on CPU with gloo collectives, rank 0 the coordinator
    on a free loopback port."""
    import jax
    port = comm.bcast(free_port() if comm.Get_rank() == 0 else None, root=0)
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=comm.Get_size(),
                               process_id=comm.Get_rank())


def _mlp(widths: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """torch.nn.Linear's initialization (uniform in +-1/sqrt(fan_in)), the same on every
    rank; numpy's, which compiles nothing (jax.random compiles for each shape)."""
    gen = np.random.default_rng(0)
    return [(gen.uniform(-1, 1, (a, b)).astype(np.float32) / np.sqrt(a),
             gen.uniform(-1, 1, b).astype(np.float32) / np.sqrt(a))
            for a, b in zip(widths, widths[1:])]


def _loss(params: Any, x: Any, y: Any) -> Any:
    """Cross-entropy of a ReLU MLP."""
    import jax
    import jax.numpy as jnp
    for i, (w, b) in enumerate(params):
        x = x @ w + b
        if i < len(params) - 1:
            x = jax.nn.relu(x)
    logp = jax.nn.log_softmax(x)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def _stepper(step: Callable[[Any, Any], tuple[Any, Any]], params: Any, state: Any
             ) -> Contender:
    """One training step of a contender, state carried from call to call; it returns
    once the new parameters are computed (JAX dispatches asynchronously)."""
    import jax
    held = [params, state]

    def run() -> None:
        held[0], held[1] = step(held[0], held[1])
        jax.block_until_ready(held[0])
    return run


def _contenders(widths: list[int], x: np.ndarray, y: np.ndarray) -> dict[str, Contender]:
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from .. import jax as hvd
    sgd = optax.sgd(0.01)
    local = jax.tree_util.tree_map(jnp.asarray, _mlp(widths))
    local_x, local_y = jnp.asarray(x), jnp.asarray(y)

    # horovodish, as docs/jax.md writes it: the gradient jitted, reduced outside jit.
    grad, apply = jax.jit(jax.grad(_loss)), jax.jit(optax.apply_updates)
    ours = hvd.DistributedOptimizer(sgd, name="bench.jax")

    def ours_step(params: Any, state: Any) -> tuple[Any, Any]:
        updates, state = ours.update(grad(params, local_x, local_y), state, params)
        return apply(params, updates), state

    def plain(params: Any, state: Any, xs: Any, ys: Any, reduce: Callable = lambda g: g
              ) -> tuple[Any, Any]:
        updates, state = sgd.update(reduce(jax.grad(_loss)(params, xs, ys)), state, params)
        return optax.apply_updates(params, updates), state

    # JAX's own: one jitted step, gradients averaged over a mesh of the processes' CPUs.
    mesh = Mesh(np.array(jax.devices()), ("data",))
    whole, split = PartitionSpec(), PartitionSpec("data")

    def global_tree(tree: Any, spec: PartitionSpec) -> Any:
        sharding = NamedSharding(mesh, spec)
        return jax.tree_util.tree_map(
            lambda a: jax.make_array_from_process_local_data(sharding, np.asarray(a)), tree)
    reduced = jax.jit(jax.shard_map(
        lambda p, s, xs, ys: plain(p, s, xs, ys, lambda g: jax.lax.pmean(g, "data")),
        mesh=mesh, in_specs=(whole, whole, split, split), out_specs=(whole, whole)))
    global_x, global_y = global_tree(x, split), global_tree(y, split)
    bound = jax.jit(plain)
    return {
        OURS: _stepper(ours_step, local, ours.init(local)),
        JAX: _stepper(lambda p, s: reduced(p, s, global_x, global_y),
                      global_tree(local, whole), global_tree(sgd.init(local), whole)),
        BOUND: _stepper(lambda p, s: bound(p, s, local_x, local_y), local, sgd.init(local)),
    }


def jax_training_step(comm: MPI.Comm, widths: list[int] | None = None, batch: int = 64,
                      rounds: int = 5, budget: float = 0.3) -> dict:
    """Steps per second of each contender (median over rounds) and the ratios, each
    round's horovodish / jax.distributed ratio giving the range."""
    import jax
    _start_jax_distributed(comm)
    try:
        widths = widths or [784, 1024, 1024, 10]
        gen = np.random.default_rng(1 + comm.Get_rank())
        x = gen.standard_normal((batch, widths[0]), dtype=np.float32)
        y = gen.integers(0, widths[-1], batch).astype(np.int32)
        times = alternating(_contenders(widths, x, y), comm, rounds, budget)
    finally:
        jax.distributed.shutdown()
    over = [j / o for o, j in zip(times[OURS], times[JAX])]
    return {"widths": widths, "batch_per_rank": batch,
            "steps_per_s": {key: 1.0 / statistics.median(v) for key, v in times.items()},
            "over_jax": statistics.median(over), "over_jax_range": [min(over), max(over)],
            "jax_over_bound": statistics.median(b / j for j, b in zip(times[JAX],
                                                                       times[BOUND])),
            "ours_over_bound": statistics.median(b / o for o, b in zip(times[OURS],
                                                                        times[BOUND])),
            "xla_flags": os.environ.get("XLA_FLAGS", "")}
