"""horovodish.jax on real ranks, every figure against numpy or one process on the whole
batch. Each rank's input is a pure function of (rank, name), so every rank computes the
exact reference. Named checks (tests/worker_support.py)."""
from __future__ import annotations

import copy
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
from mpi4py import MPI

from worker_support import check, close, expect_error, run_checks

import horovodish.jax as hvd
from horovodish.common.api import collectives as core

DTYPES = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-5, "int32": 0.0}


def data(rank: int, name: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    gen = np.random.default_rng(zlib.crc32(f"{rank}.{name}".encode()))
    values = gen.integers(-4, 5, size=shape)  # small integers: exact in every dtype
    if dtype == "bfloat16":
        return values.astype(np.float32).astype(ml_dtypes.bfloat16)
    return values.astype(dtype)


def collectives(rank: int, size: int) -> None:
    for dtype, tol in DTYPES.items():
        every = [data(r, "x", (3, 4), dtype).astype(np.float64) for r in range(size)]
        x = jnp.asarray(data(rank, "x", (3, 4), dtype))
        ops = {"Sum": (hvd.Sum, np.sum(every, 0)), "Min": (hvd.Min, np.min(every, 0)),
               "Max": (hvd.Max, np.max(every, 0)), "Product": (hvd.Product, np.prod(every, 0))}
        if dtype != "int32":
            ops["Average"] = (hvd.Average, np.mean(every, 0))
        for label, (op, want) in ops.items():
            got = hvd.allreduce(x, op=op, name=f"x.{dtype}.{label}")
            check(got.dtype == x.dtype, f"{dtype} {label}: dtype {got.dtype}")
            close(np.asarray(got).astype(np.float64), want, f"{dtype} {label}", tol, atol=tol)
        scaled = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5,
                               name=f"x.{dtype}.scaled")
        close(np.asarray(scaled).astype(np.float64), np.sum(every, 0), f"{dtype} scaled", tol,
              atol=tol)
    flags = jnp.asarray(np.arange(4) % (rank + 2) == 0)
    every = [np.arange(4) % (r + 2) == 0 for r in range(size)]
    close(np.asarray(hvd.allreduce(flags, op=hvd.Max, name="flags.max")), np.any(every, 0),
          "bool Max")
    close(np.asarray(hvd.allreduce(flags, op=hvd.Min, name="flags.min")), np.all(every, 0),
          "bool Min")
    # allgather: rank r sends r + 1 rows
    gathered = hvd.allgather(jnp.asarray(data(rank, "g", (rank + 1, 2), "float32")))
    close(np.asarray(gathered), np.concatenate([data(r, "g", (r + 1, 2), "float32")
                                                for r in range(size)]), "allgather")
    root = size - 1
    close(np.asarray(hvd.broadcast(jnp.asarray(data(rank, "b", (5,), "float32")), root)),
          data(root, "b", (5,), "float32"), "broadcast from the last rank")
    splits = [(rank + dest) % 3 for dest in range(size)]
    sent = jnp.asarray(data(rank, "a", (sum(splits), 2), "float32"))
    received, counts = hvd.alltoall(sent, splits=splits)
    want, offsets = [], []
    for source in range(size):
        theirs = [(source + dest) % 3 for dest in range(size)]
        start = sum(theirs[:rank])
        want.append(data(source, "a", (sum(theirs), 2), "float32")[start:start + theirs[rank]])
        offsets.append(theirs[rank])
    close(np.asarray(received), np.concatenate(want), "alltoall with splits")
    close(np.asarray(counts), np.asarray(offsets, np.int32), "alltoall's received splits")
    rows = 2 * size + 1
    summed = np.sum([data(r, "rs", (rows, 2), "float32") for r in range(size)], 0)
    base, extra = divmod(rows, size)
    start = rank * base + min(rank, extra)
    mine = hvd.reducescatter(jnp.asarray(data(rank, "rs", (rows, 2), "float32")), op=hvd.Sum)
    close(np.asarray(mine), summed[start:start + base + (rank < extra)], "reducescatter")
    placed = jax.device_put(jnp.asarray(data(rank, "p", (3,), "float32")), jax.devices()[0])
    got = hvd.allreduce(placed, op=hvd.Sum, name="placed")
    check(got.committed and got.devices() == placed.devices(),
          f"a result of an input committed to {placed.devices()}: {got.devices()}, "
          f"committed {got.committed}")
    check(not hvd.allreduce(jnp.ones(2), name="uncommitted").committed,
          "the result of an uncommitted input is uncommitted")
    hvd.barrier()


def pytrees(rank: int, size: int) -> None:
    """A nested pytree of three dtypes is one entry per dtype, whatever its leaf count;
    broadcast_parameters gives every rank the root's tree."""
    def tree(r: int) -> dict:
        return {"layers": [{"w": data(r, f"w{i}", (4, 3), "float32"),
                            "b": data(r, f"b{i}", (3,), "float32")} for i in range(3)],
                "steps": data(r, "steps", (2,), "int32"),
                "scale": data(r, "scale", (), "float16")}
    mine = jax.tree_util.tree_map(jnp.asarray, tree(rank))
    submitted = []
    grouped = core.grouped_allreduce_async

    def counting(tensors, *args, **kwargs):
        submitted.append(len(tensors))
        return grouped(tensors, *args, **kwargs)
    core.grouped_allreduce_async = counting
    try:
        got = hvd.allreduce(mine, op=hvd.Sum, name="tree")
    finally:
        core.grouped_allreduce_async = grouped
    want = jax.tree_util.tree_map(lambda *xs: np.sum([x.astype(np.float64) for x in xs], 0),
                                  *[tree(r) for r in range(size)])
    check(jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(mine),
          "the reduced tree has the input's structure")
    for (path, value), expected in zip(jax.tree_util.tree_leaves_with_path(got),
                                       jax.tree_util.tree_leaves(want)):
        close(np.asarray(value).astype(np.float64), expected, f"tree leaf {path}", 1e-2)
    check(submitted == [3], f"tensors submitted for a tree of 3 dtypes: {submitted}")
    noisy = jax.tree_util.tree_map(lambda x: x + rank, mine)
    root = jax.tree_util.tree_map(lambda x: x + 0, mine)  # rank 0's values are tree(0)
    synced = hvd.broadcast_parameters(noisy, root_rank=0)
    for value, expected in zip(jax.tree_util.tree_leaves(synced),
                               jax.tree_util.tree_leaves(tree(0))):
        close(np.asarray(value), expected, "broadcast_parameters")
    del root
    check(hvd.broadcast_object({"rank": rank}, root_rank=0) == {"rank": 0}, "broadcast_object")
    check(hvd.allgather_object(rank) == list(range(size)), "allgather_object")


def errors(rank: int, size: int) -> None:
    expect_error(lambda: jax.jit(lambda x: hvd.allreduce(x))(jnp.ones(2)), ValueError,
                 "inside a traced function", "Call it outside", what="allreduce inside jit")
    if size > 1:  # shapes that differ between ranks: every rank fails, naming the tensor
        expect_error(lambda: hvd.allreduce(jnp.ones(2 + rank), name="uneven"), Exception,
                     "uneven", what="allreduce of different shapes")
        close(np.asarray(hvd.allreduce(jnp.ones(2), op=hvd.Sum, name="after")),
              np.full(2, float(size)), "the runtime works after a mismatch")
        # Same sizes, one leaf transposed off the root: named, never silently reshaped.
        tree = {"a": jnp.ones(3), "b": jnp.ones((2, 3) if rank == 0 else (3, 2))}
        expect_error(lambda: hvd.broadcast_parameters(tree, root_rank=0), Exception,
                     "broadcast_parameters.1", "shape",
                     what="broadcast_parameters of a leaf whose shape differs between ranks")
    expect_error(lambda: hvd.DistributedOptimizer(optax.sgd(0.1), op=hvd.Max), ValueError,
                 "op=Average or Sum", what="DistributedOptimizer(op=Max)")


def mlp(key: jax.Array) -> dict:
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (6, 8)) * 0.3, "b1": jnp.zeros(8),
            "w2": jax.random.normal(k2, (8, 2)) * 0.3, "b2": jnp.zeros(2)}


def loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)


def training_equals_one_process(rank: int, size: int) -> None:
    """DistributedOptimizer on each rank's shard equals plain optax on the whole batch
    (SGD with momentum, Adam; with 2 backward passes per step; fp16 compression)."""
    batch = 6 * size
    grad = jax.jit(jax.grad(loss))
    for label, make, passes, compression, tol in (
            ("SGD momentum", lambda: optax.sgd(0.1, momentum=0.9), 1, hvd.Compression.none,
             1e-5),
            ("Adam", lambda: optax.adam(0.01), 1, hvd.Compression.none, 1e-5),
            ("SGD, 2 passes", lambda: optax.sgd(0.1), 2, hvd.Compression.none, 1e-5),
            ("Adam, fp16", lambda: optax.adam(0.01), 1, hvd.Compression.fp16, 2e-3)):
        params = want = mlp(jax.random.PRNGKey(0))
        if rank != 0:  # different starts, made equal by the broadcast
            params = jax.tree_util.tree_map(lambda p: p + 1.0, params)
        params = hvd.broadcast_parameters(params, root_rank=0)
        optimizer = hvd.DistributedOptimizer(make(), backward_passes_per_step=passes,
                                             compression=compression)
        reference = make()
        state, ref_state = optimizer.init(params), reference.init(want)
        for step in range(5):
            gen = np.random.default_rng(100 + step)
            x = jnp.asarray(gen.normal(size=(batch, 6)), jnp.float32)
            y = jnp.asarray(gen.normal(size=(batch, 2)), jnp.float32)
            shard = slice(rank * 6, (rank + 1) * 6)
            for part in range(passes):  # each pass: half the shard, loss scaled by 1/passes
                rows = slice(shard.start + part * 6 // passes,
                             shard.start + (part + 1) * 6 // passes)
                grads = jax.tree_util.tree_map(lambda g: g / passes,
                                               grad(params, x[rows], y[rows]))
                updates, state = optimizer.update(grads, state, params)
                params = optax.apply_updates(params, updates)
            ref_updates, ref_state = reference.update(grad(want, x, y), ref_state, want)
            want = optax.apply_updates(want, ref_updates)
        for key in want:
            close(np.asarray(params[key]), np.asarray(want[key]),
                  f"{label}: {key} against one process on the whole batch", tol, atol=tol)


def outside_the_set(rank: int, size: int) -> None:
    """A rank outside the optimizer's process set keeps its own gradients."""
    if size < 3:
        return
    members = [0, size - 1]
    pair = hvd.add_process_set(members)
    optimizer = hvd.DistributedOptimizer(optax.sgd(1.0), process_set=pair)
    params = {"w": jnp.zeros(2)}
    state = optimizer.init(params)
    updates, _ = optimizer.update({"w": jnp.full(2, float(rank))}, state, params)
    want = -np.mean(members) if rank in members else -float(rank)
    close(np.asarray(updates["w"]), np.full(2, want), f"rank {rank}'s update, set {members}")
    hvd.remove_process_set(pair)


def x64_and_every_dtype(rank: int, size: int) -> None:
    """With x64 on: float64, int64, int8, uint8, int16, uint16, uint32 and uint64
    through every reduction, allgather and broadcast, against numpy; uint32 and uint64
    near their maximum moved bit for bit by broadcast, allgather and alltoall; PRNG key
    arrays moved, their reductions refused; a pytree with several dtypes; a dtype that
    differs between ranks (float32 and float64, uint32 and int32 of one width) fails on
    every rank naming the tensor; DistributedOptimizer in float64 equal to optax on the
    whole batch."""
    jax.config.update("jax_enable_x64", True)
    try:
        _x64_checks(rank, size)
    finally:
        jax.config.update("jax_enable_x64", False)


def _values(rank: int, name: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Small integers (non-negative for unsigned types): exact in every dtype, and no
    sum or product of them overflows."""
    gen = np.random.default_rng(zlib.crc32(f"{rank}.{name}".encode()))
    low = 0 if np.dtype(dtype).kind == "u" else -4
    return gen.integers(low, 5, size=shape).astype(dtype)


def _x64_checks(rank: int, size: int) -> None:
    root = size - 1
    for dtype in ("float64", "int64", "int8", "uint8", "int16", "uint16", "uint32", "uint64"):
        every = [_values(r, dtype, (3, 4), dtype) for r in range(size)]
        x = jnp.asarray(every[rank])
        check(x.dtype == np.dtype(dtype), f"jnp keeps {dtype} with x64 on: {x.dtype}")
        ops = {"Sum": (hvd.Sum, np.sum), "Min": (hvd.Min, np.min), "Max": (hvd.Max, np.max),
               "Product": (hvd.Product, np.prod)}
        if dtype == "float64":
            ops["Average"] = (hvd.Average, np.mean)
        for label, (op, reference) in ops.items():
            got = hvd.allreduce(x, op=op, name=f"x64.{dtype}.{label}")
            check(got.dtype == x.dtype, f"{dtype} {label}: dtype {got.dtype}")
            close(np.asarray(got), reference(np.stack(every), axis=0).astype(dtype),
                  f"{dtype} {label}", 1e-15 if dtype == "float64" else 0.0)
        rows = [_values(r, f"g.{dtype}", (r + 1, 2), dtype) for r in range(size)]
        got = hvd.allgather(jnp.asarray(rows[rank]), name=f"x64.{dtype}.allgather")
        check(got.dtype == x.dtype, f"{dtype} allgather: dtype {got.dtype}")
        close(np.asarray(got), np.concatenate(rows), f"{dtype} allgather")
        got = hvd.broadcast(x, root, name=f"x64.{dtype}.broadcast")
        close(np.asarray(got), every[root], f"{dtype} broadcast from rank {root}")
    for dtype in ("uint32", "uint64"):  # bit for bit, where a signed type would be negative
        every = [np.arange(4, dtype=dtype) + np.iinfo(dtype).max - 10 * r for r in range(size)]
        x = jnp.asarray(every[rank])
        check(x.dtype == np.dtype(dtype), f"jnp keeps {dtype}: {x.dtype}")
        close(np.asarray(hvd.broadcast(x, root, name=f"x64.{dtype}.broadcast")), every[root],
              f"{dtype} broadcast")
        got = hvd.allgather(x, name=f"x64.{dtype}.allgather")
        check(got.dtype == x.dtype, f"{dtype} allgather: dtype {got.dtype}")
        close(np.asarray(got), np.concatenate(every), f"{dtype} allgather")
        got = hvd.alltoall(jnp.asarray(np.repeat(every[rank], size)), name=f"x64.{dtype}.a2a")
        close(np.asarray(got), np.concatenate([np.repeat(e, size)[4 * rank:4 * rank + 4]
                                               for e in every]), f"{dtype} alltoall")
    keys = jax.random.split(jax.random.key(rank), 2)
    every = [np.asarray(jax.random.key_data(jax.random.split(jax.random.key(r), 2)))
             for r in range(size)]
    got = hvd.broadcast(keys, root, name="x64.keys.broadcast")
    check(got.dtype == keys.dtype, f"a key array's dtype after broadcast: {got.dtype}")
    close(np.asarray(jax.random.key_data(got)), every[root], "PRNG keys broadcast")
    close(np.asarray(jax.random.key_data(hvd.allgather(keys, name="x64.keys.allgather"))),
          np.concatenate(every), "PRNG keys allgather")
    expect_error(lambda: hvd.allreduce(keys), TypeError, "PRNG keys cannot be reduced",
                 what="allreduce of PRNG keys")
    tree = {"a": _values(rank, "ta", (3,), "float64"), "b": _values(rank, "tb", (2, 2), "int64"),
            "c": _values(rank, "tc", (5,), "float32")}
    got = hvd.allreduce(jax.tree_util.tree_map(jnp.asarray, tree), op=hvd.Sum, name="x64.tree")
    for key in tree:
        want = np.sum([_values(r, f"t{key}", tree[key].shape, tree[key].dtype.name)
                       for r in range(size)], axis=0)
        check(got[key].dtype == tree[key].dtype, f"tree leaf {key}: dtype {got[key].dtype}")
        close(np.asarray(got[key]), want, f"tree leaf {key}")
    if size > 1:  # rank 0 float32, the others float64, under one name
        mixed = jnp.ones(3, jnp.float32 if rank == 0 else jnp.float64)
        expect_error(lambda: hvd.allreduce({"w": mixed}, name="mixed"), Exception, "mixed.0",
                     "dtype", what="a pytree whose dtype differs between ranks")
        expect_error(lambda: hvd.allreduce(mixed, name="mixed.array"), Exception,
                     "mixed.array", "dtype", what="an array whose dtype differs between ranks")
        same_width = jnp.ones(3, jnp.uint32 if rank == 0 else jnp.int32)
        expect_error(lambda: hvd.broadcast(same_width, 0, name="mixed.width"), Exception,
                     "mixed.width", "uint32", "int32",
                     what="a broadcast of uint32 on rank 0 and int32 on the others")
        close(np.asarray(hvd.allreduce(jnp.ones(2), op=hvd.Sum, name="x64.after")),
              np.full(2, float(size)), "the runtime works after a mismatch")
    # DistributedOptimizer in float64 (numpy's parameters: jax.random compiles per shape)
    batch, gen = 6 * size, np.random.default_rng(5)
    params = want = {"w1": gen.normal(size=(6, 8)) * 0.3, "b1": np.zeros(8),
                     "w2": gen.normal(size=(8, 2)) * 0.3, "b2": np.zeros(2)}
    grad = jax.jit(jax.grad(loss))
    optimizer, reference = hvd.DistributedOptimizer(optax.sgd(0.1, momentum=0.9)), \
        optax.sgd(0.1, momentum=0.9)
    reference_update = jax.jit(reference.update)
    state, ref_state = optimizer.init(params), reference.init(want)
    for step in range(3):
        gen = np.random.default_rng(100 + step)
        x, y = gen.normal(size=(batch, 6)), gen.normal(size=(batch, 2))
        shard = slice(rank * 6, (rank + 1) * 6)
        updates, state = optimizer.update(grad(params, x[shard], y[shard]), state, params)
        params = optax.apply_updates(params, updates)
        ref_updates, ref_state = reference_update(grad(want, x, y), ref_state, want)
        want = optax.apply_updates(want, ref_updates)
    for key in want:
        check(params[key].dtype == jnp.float64, f"float64 training: {key} is {params[key].dtype}")
        close(np.asarray(params[key]), np.asarray(want[key]),
              f"SGD with momentum in float64: {key} against one process on the whole batch",
              1e-12)


def elastic_state(rank: int, size: int) -> None:
    """JaxState: sync gives every rank rank 0's pytrees (parameters, an optimizer state
    with a Python int among its leaves, a PRNG key) and attributes; restore brings back
    the last commit even after the live arrays were deleted (as a jit that donates them
    deletes them); pytrees that differ between ranks fail sync on every rank, naming
    them; run() retries a failed collective from the last commit. Runs last: the retry
    re-initializes horovodish."""
    optimizer = hvd.DistributedOptimizer(optax.adam(0.01))

    def leaves(tree: Any) -> list[np.ndarray]:
        return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]

    def same(got: Any, want: Any, what: str) -> None:
        check(jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want),
              f"{what}: structure")
        for i, (g, w) in enumerate(zip(leaves(got), leaves(want))):
            check(g.dtype == w.dtype, f"{what} leaf {i}: dtype {g.dtype}, want {w.dtype}")
            close(g, w, f"{what} leaf {i}")

    params0 = mlp(jax.random.PRNGKey(0))
    opt0 = optimizer.init(params0)
    mine = mlp(jax.random.PRNGKey(rank))
    state = hvd.elastic.JaxState(params=mine,
                                 opt_state=optimizer.init(mine)._replace(passes=rank),
                                 keys=(jax.random.PRNGKey(rank), jax.random.key(rank)),
                                 epoch=rank, batch=10 * rank)
    state.sync()
    same(state.params, params0, "params after sync")
    same(state.opt_state, opt0, "opt_state after sync")
    check(state.opt_state.passes == 0, f"the int leaf after sync: {state.opt_state.passes}")
    legacy, typed = state.keys
    close(np.asarray(legacy), np.asarray(jax.random.PRNGKey(0)), "a uint32 PRNG key after sync")
    check(typed.dtype == jax.random.key(0).dtype, f"a typed key's dtype after sync: {typed.dtype}")
    close(np.asarray(jax.random.key_data(typed)), np.asarray(jax.random.key_data(jax.random.key(0))),
          "a typed PRNG key after sync")
    check((state.epoch, state.batch) == (0, 0), f"attributes after sync: {state.epoch}")
    state.commit()
    grads = jax.tree_util.tree_map(jnp.ones_like, state.params)
    updates, state.opt_state = optimizer.update(grads, state.opt_state, state.params)
    state.params = optax.apply_updates(state.params, updates)
    state.epoch = 5
    on_disk = copy.deepcopy(state._payload())  # what a commit writes, read back
    for _ in range(2):  # the commit outlives a restore whose arrays are deleted too
        for leaf in jax.tree_util.tree_leaves((state.params, state.opt_state)):
            if isinstance(leaf, jax.Array):
                leaf.delete()
        state.restore()
        same(state.params, params0, "params after restore")
        same(state.opt_state, opt0, "opt_state after restore")
        check(state.epoch == 0, f"epoch after restore: {state.epoch}")
    state.params = jax.tree_util.tree_map(jnp.zeros_like, state.params)
    state.keys = (jax.random.PRNGKey(9), jax.random.key(9))
    state._load_payload(on_disk)
    state.restore()
    same(state.params, params0, "params from the commit's payload")
    same(state.opt_state, opt0, "opt_state from the commit's payload")
    close(np.asarray(jax.random.key_data(state.keys[1])),
          np.asarray(jax.random.key_data(jax.random.key(0))), "a typed key from the payload")
    if size == 1:
        return
    uneven = hvd.elastic.JaxState(params={"w": jnp.zeros(2 + rank)})
    expect_error(uneven.sync, ValueError, "sync of JaxState.params", "first difference at leaf 0",
                 what="sync of pytrees that differ between ranks")
    attempts = []

    @hvd.elastic.run
    def train(state: hvd.elastic.JaxState) -> int:
        attempts.append(state.batch)
        state.params = jax.tree_util.tree_map(lambda p: p + 1.0, state.params)
        state.batch += 1
        if len(attempts) == 1:  # fails on every rank: a mismatch across ranks
            hvd.allreduce(jnp.ones(2 + rank), name="elastic.uneven")
        return state.batch

    check(train(state) == 1 and attempts == [0, 0], f"run: attempts {attempts}")
    same(state.params, jax.tree_util.tree_map(lambda p: p + 1.0, params0),
         "params after the retry")


if __name__ == "__main__":
    hvd.init(process_sets="dynamic")
    run_checks([collectives, pytrees, errors, training_equals_one_process, outside_the_set,
                x64_and_every_dtype, elastic_state],
               MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
