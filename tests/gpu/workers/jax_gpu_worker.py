"""JAX arrays on a CUDA device through horovodish's NCCL path, against numpy: allreduce
(every op, float16 to float64 and int32), allgather with uneven first dimensions,
broadcast, a pytree of several dtypes, and a DistributedOptimizer step against optax on
the whole batch. Every result must be a JAX array on the input's GPU.

Run by tests/gpu/test_jax_gpu.py and tests/gpu/run_on_gpu.sh: at 1 rank, and at 2 ranks
on the one GPU under tests/gpu/distinct_hosts.py (each rank its own NCCL_HOSTID).
"""
from __future__ import annotations

import os
import zlib

# Two JAX processes share the GPU: neither may take most of its memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from worker_support import check, close, run_checks  # noqa: E402

import horovodish.jax as hvd  # noqa: E402
from horovodish.common.messages import RequestType  # noqa: E402
from horovodish.jax.views import view  # noqa: E402

DTYPES = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-6, "float64": 1e-12, "int32": 0.0}


def gpu() -> jax.Device:
    return jax.devices("gpu")[0]


def data(rank: int, name: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Small integers (exact in every dtype), a pure function of (rank, name)."""
    values = np.random.default_rng(zlib.crc32(f"{rank}.{name}".encode())).integers(-4, 5, shape)
    if dtype == "bfloat16":
        return values.astype(np.float32).astype(ml_dtypes.bfloat16)
    return values.astype(dtype)


def on_gpu(array: np.ndarray) -> jax.Array:
    return jax.device_put(array, gpu())


def same(got: jax.Array, want: np.ndarray, what: str, tol: float = 0.0) -> None:
    check(got.devices() == {gpu()}, f"{what}: the result is on {got.devices()}, not the GPU")
    check(got.dtype == want.dtype, f"{what}: dtype {got.dtype}, want {want.dtype}")
    close(np.asarray(got).astype(np.float64), want.astype(np.float64), what, tol, atol=tol)


def the_nccl_path_is_taken(rank: int, size: int) -> None:
    for kind in (RequestType.ALLREDUCE, RequestType.ALLGATHER, RequestType.BROADCAST):
        v = view(on_gpu(np.ones(4, np.float32)), "check", kind, hvd.Sum)
        check(v.device == "cuda", f"{kind}: a GPU array's request device is {v.device}")


def allreduce_every_op_and_dtype(rank: int, size: int) -> None:
    for dtype, tol in DTYPES.items():
        every = np.stack([data(r, dtype, (3, 1025), dtype).astype(np.float64)
                          for r in range(size)])
        x = on_gpu(data(rank, dtype, (3, 1025), dtype))
        ops = {"Sum": (hvd.Sum, every.sum(0)), "Min": (hvd.Min, every.min(0)),
               "Max": (hvd.Max, every.max(0)), "Product": (hvd.Product, every.prod(0))}
        if dtype != "int32":
            ops["Average"] = (hvd.Average, every.mean(0))
        for label, (op, want) in ops.items():
            got = hvd.allreduce(x, op=op, name=f"gpu.{dtype}.{label}")
            same(got, want.astype(x.dtype), f"allreduce {dtype} {label}", tol)


def allgather_and_broadcast(rank: int, size: int) -> None:
    for dtype, tol in DTYPES.items():
        rows = [data(r, f"g.{dtype}", (r + 1, 3), dtype) for r in range(size)]
        same(hvd.allgather(on_gpu(rows[rank]), name=f"gpu.ag.{dtype}"), np.concatenate(rows),
             f"allgather {dtype}")
        root = size - 1
        same(hvd.broadcast(on_gpu(data(rank, f"b.{dtype}", (7, 2), dtype)), root,
                           name=f"gpu.bc.{dtype}"),
             data(root, f"b.{dtype}", (7, 2), dtype), f"broadcast {dtype} from rank {root}")


def pytree_and_optimizer(rank: int, size: int) -> None:
    """A pytree of three dtypes on the GPU (concatenated and sliced there), and one
    DistributedOptimizer step against optax on the whole batch."""
    def tree(r: int) -> dict:
        return {"w": data(r, "w", (4, 3), "float32"), "b": data(r, "b", (3,), "float32"),
                "n": data(r, "n", (2,), "int32"), "h": data(r, "h", (5,), "float16")}
    got = hvd.allreduce(jax.tree_util.tree_map(on_gpu, tree(rank)), op=hvd.Sum, name="gpu.tree")
    for key, leaf in tree(0).items():
        want = np.sum([tree(r)[key].astype(np.float64) for r in range(size)], 0)
        same(got[key], want.astype(leaf.dtype), f"pytree leaf {key}", 1e-6)
    x = np.random.default_rng(7).normal(size=(4 * size, 5)).astype(np.float32)
    params = {"w": on_gpu(np.linspace(-1, 1, 5, dtype=np.float32))}

    def loss(p: dict, xs: jax.Array) -> jax.Array:
        return jnp.mean((xs @ p["w"]) ** 2)
    optimizer, reference = hvd.DistributedOptimizer(optax.sgd(0.1)), optax.sgd(0.1)
    grads = jax.grad(loss)(params, on_gpu(x[4 * rank:4 * rank + 4]))
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    want, _ = reference.update(jax.grad(loss)(params, on_gpu(x)), reference.init(params))
    same(updates["w"], np.asarray(want["w"]), "DistributedOptimizer's update", 1e-6)


if __name__ == "__main__":
    hvd.init()
    run_checks([the_nccl_path_is_taken, allreduce_every_op_and_dtype, allgather_and_broadcast,
                pytree_and_optimizer], hvd.rank(), hvd.size())
