"""Every TensorFlow collective x dtype, eagerly and in tf.function, against numpy.

Each rank's input is a pure function of (rank, name), so every rank computes every other
rank's input and hence the exact reference. Also: gradients of the collectives, mismatch
errors that name the tensor, IndexedSlices, compression, variables, objects, process sets.
Each is a named check (tests/worker_support.py): a failure is reported and the next check
still runs.
"""
from __future__ import annotations

import numpy as np
from checks import F64_TOL, FLOAT_TOL, data, quiet_tensorflow
from mpi4py import MPI  # noqa: E402
from worker_support import check, close, expect_error, run_checks  # noqa: E402

import tensorflow as tf  # noqa: E402  (checks quiets TF first)

import horovodish.tensorflow as hvd  # noqa: E402

DTYPES = ["uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "bfloat16", "float32",
          "float64", "bool"]
FLOATS = {"float16", "bfloat16", "float32", "float64"}
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max,
       "Product": hvd.Product}


def f64(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).astype(np.float64) if array.dtype != np.bool_ else array


# -- references --------------------------------------------------------------------------------
def reduce_ref(arrays: list[np.ndarray], op: str, dtype: str, size: int) -> np.ndarray:
    if dtype == "bool":
        stacked = np.stack(arrays)
        return stacked.any(0) if op in ("Sum", "Max") else stacked.all(0)
    stacked = np.stack([a.astype(np.float64) if dtype in FLOATS else a.astype(np.int64)
                        for a in arrays])
    if op == "Sum":
        return stacked.sum(0)
    if op == "Average":
        total = stacked.sum(0)
        return total / size if dtype in FLOATS else np.sign(total) * (np.abs(total) // size)
    return {"Min": stacked.min(0), "Max": stacked.max(0), "Product": stacked.prod(0)}[op]


def splits_of(rank: int, size: int) -> list[int]:
    return [(rank + j) % 3 for j in range(size)]


def inputs_for(rank: int, size: int, dtype: str) -> dict[str, np.ndarray]:
    rows_rs = 2 * size + 1
    return {
        "ar": data(rank, "ar", (3, 4), dtype),
        "scalar": data(rank, "scalar", (), dtype),
        "empty": data(rank, "empty", (0, 2), dtype),
        "g1": data(rank, "g1", (5,), dtype),
        "ag": data(rank, "ag", (rank + 1, 3), dtype),
        "even": data(rank, "even", (2 * size, 2), dtype),
        "uneven": data(rank, "uneven", (sum(splits_of(rank, size)), 2), dtype),
        "rs": data(rank, "rs", (rows_rs, 2), dtype),
    }


def all_ops(x: dict, splits, dtype: str, size: int) -> dict:
    """Every collective on x; traced once per dtype under tf.function."""
    out = {}
    for label, op in OPS.items():
        if dtype == "bool" and label == "Average":
            continue
        out[f"allreduce.{label}"] = hvd.allreduce(x["ar"], op=op)
    out["allreduce.scalar"] = hvd.allreduce(x["scalar"], op=hvd.Sum)
    out["allreduce.empty"] = hvd.allreduce(x["empty"], op=hvd.Sum)
    if dtype in FLOATS:
        out["allreduce.scaled"] = hvd.allreduce(x["ar"], op=hvd.Sum, prescale_factor=0.5,
                                                postscale_factor=3.0)
    out["grouped.0"], out["grouped.1"] = hvd.grouped_allreduce([x["ar"], x["g1"]], op=hvd.Max)
    out["allgather"] = hvd.allgather(x["ag"])
    out["grouped_allgather.0"], out["grouped_allgather.1"] = hvd.grouped_allgather(
        [x["ag"], x["even"]])
    for root in range(size):
        out[f"broadcast.{root}"] = hvd.broadcast(x["ar"], root)
    out["alltoall.even"] = hvd.alltoall(x["even"])
    out["alltoall.uneven"], out["alltoall.received"] = hvd.alltoall(x["uneven"], splits=splits)
    if dtype != "bool":
        out["reducescatter.Sum"] = hvd.reducescatter(x["rs"], op=hvd.Sum)
        out["reducescatter.Average"] = hvd.reducescatter(x["rs"], op=hvd.Average)
        out["grouped_reducescatter.0"], out["grouped_reducescatter.1"] = \
            hvd.grouped_reducescatter([x["rs"], x["even"]], op=hvd.Sum)
    return out


def expected(dtype: str, rank: int, size: int) -> dict[str, np.ndarray]:
    every = [inputs_for(r, size, dtype) for r in range(size)]
    col = lambda key: [e[key] for e in every]  # noqa: E731
    want = {}
    for label in OPS:
        if not (dtype == "bool" and label == "Average"):
            want[f"allreduce.{label}"] = reduce_ref(col("ar"), label, dtype, size)
    want["allreduce.scalar"] = reduce_ref(col("scalar"), "Sum", dtype, size)
    want["allreduce.empty"] = reduce_ref(col("empty"), "Sum", dtype, size)
    if dtype in FLOATS:
        want["allreduce.scaled"] = reduce_ref([a.astype(np.float64) * 0.5 for a in col("ar")],
                                              "Sum", "float64", size) * 3.0
    want["grouped.0"] = reduce_ref(col("ar"), "Max", dtype, size)
    want["grouped.1"] = reduce_ref(col("g1"), "Max", dtype, size)
    want["allgather"] = np.concatenate(col("ag"))
    want["grouped_allgather.0"] = np.concatenate(col("ag"))
    want["grouped_allgather.1"] = np.concatenate(col("even"))
    for root in range(size):
        want[f"broadcast.{root}"] = every[root]["ar"]
    per = 2  # alltoall.even: 2 rows from every rank
    want["alltoall.even"] = np.concatenate([e["even"][rank * per:(rank + 1) * per] for e in every])
    parts = []
    for src in range(size):
        offsets = np.concatenate([[0], np.cumsum(splits_of(src, size))])
        parts.append(every[src]["uneven"][offsets[rank]:offsets[rank + 1]])
    want["alltoall.uneven"] = np.concatenate(parts)
    want["alltoall.received"] = np.array([splits_of(src, size)[rank] for src in range(size)])
    if dtype != "bool":
        rows = 2 * size + 1
        base, extra = divmod(rows, size)
        start = rank * base + min(rank, extra)
        stop = start + base + (1 if rank < extra else 0)
        for label in ("Sum", "Average"):
            want[f"reducescatter.{label}"] = reduce_ref(col("rs"), label, dtype, size)[start:stop]
        want["grouped_reducescatter.0"] = reduce_ref(col("rs"), "Sum", dtype, size)[start:stop]
        want["grouped_reducescatter.1"] = reduce_ref(col("even"), "Sum", dtype, size)[
            rank * 2:(rank + 1) * 2]
    return want


def collectives(rank: int, size: int) -> None:
    graph_fns = {}
    for mode in ("eager", "graph"):
        for dtype in DTYPES:
            mine = inputs_for(rank, size, dtype)
            x = {k: tf.constant(v) for k, v in mine.items()}
            splits = splits_of(rank, size)
            if mode == "eager":
                got = all_ops(x, splits, dtype, size)
            else:
                fn = graph_fns.setdefault(dtype, tf.function(all_ops))
                got = fn(x, tf.constant(splits, tf.int32), dtype, size)
                got = fn(x, tf.constant(splits, tf.int32), dtype, size)  # cached names re-run
            want = expected(dtype, rank, size)
            check(set(got) == set(want), f"{mode} {dtype}: keys {set(got) ^ set(want)}")
            for key, value in want.items():
                tensor = got[key]
                if key != "alltoall.received":
                    check(tensor.dtype.name == dtype, f"{mode} {dtype} {key}: dtype {tensor.dtype}")
                close(f64(tensor.numpy()), f64(value), f"{mode} {dtype} {key}",
                      FLOAT_TOL.get(dtype, 0.0))


# -- gradients ---------------------------------------------------------------------------------
def weights(rank: int, name: str, shape) -> np.ndarray:
    return data(rank, name, shape, "float64") + rank + 1.0


def gradients(rank: int, size: int) -> None:
    every_w = lambda name, shape_of: [weights(r, name, shape_of(r)) for r in range(size)]  # noqa
    root = size - 1

    def losses(x_ar, x_ag, x_rs, x_a2a, x_even):
        w_ar = tf.constant(weights(rank, "w_ar", (3,)))
        parts = {
            "Sum": tf.reduce_sum(w_ar * hvd.allreduce(x_ar, op=hvd.Sum)),
            "Average": tf.reduce_sum(w_ar * hvd.allreduce(x_ar, op=hvd.Average)),
            "scaled": tf.reduce_sum(w_ar * hvd.allreduce(x_ar, op=hvd.Sum, prescale_factor=2.0,
                                                         postscale_factor=0.25)),
            "grouped": tf.reduce_sum(w_ar * hvd.grouped_allreduce([x_ar], op=hvd.Sum)[0]),
        }
        gathered = hvd.allgather(x_ag)
        parts["allgather"] = tf.reduce_sum(tf.constant(weights(rank, "w_ag", (total_ag, 2)))
                                           * gathered)
        parts["broadcast"] = tf.reduce_sum(w_ar * hvd.broadcast(x_ar, root))
        w_rs = tf.constant(weights(rank, "w_rs", rs_rows(rank)))
        parts["reducescatter"] = tf.reduce_sum(w_rs * hvd.reducescatter(x_rs, op=hvd.Average))
        parts["reducescatter Sum"] = tf.reduce_sum(w_rs * hvd.reducescatter(x_rs, op=hvd.Sum))
        sent, _ = hvd.alltoall(x_a2a, splits=splits_of(rank, size))
        parts["alltoall"] = tf.reduce_sum(tf.constant(weights(rank, "w_a2a", a2a_rows(rank)))
                                          * sent)
        # No splits, first dimensions that differ: rank r sends r + 1 rows to each rank.
        parts["alltoall even"] = tf.reduce_sum(tf.constant(weights(rank, "w_even", (total_ag, 2)))
                                               * hvd.alltoall(x_even))
        return parts

    total_ag = sum(r + 1 for r in range(size))
    rows = 2 * size + 1
    rs_rows = lambda r: (rows // size + (1 if r < rows % size else 0), 2)  # noqa: E731
    a2a_rows = lambda r: (sum(splits_of(s, size)[r] for s in range(size)), 2)  # noqa: E731

    def grads(x_ar, x_ag, x_rs, x_a2a, x_even):
        out = {}
        for key in ("Sum", "Average", "scaled", "grouped", "allgather", "broadcast",
                    "reducescatter", "reducescatter Sum", "alltoall", "alltoall even"):
            with tf.GradientTape() as tape:
                tape.watch([x_ar, x_ag, x_rs, x_a2a, x_even])
                loss = losses(x_ar, x_ag, x_rs, x_a2a, x_even)[key]
            out[key] = [g for g in tape.gradient(loss, [x_ar, x_ag, x_rs, x_a2a, x_even])
                        if g is not None][0]
        return out

    w_ar = every_w("w_ar", lambda r: (3,))
    mean_ar = np.mean(w_ar, 0)
    want = {"Sum": np.sum(w_ar, 0), "Average": mean_ar, "scaled": np.sum(w_ar, 0) * 0.5,
            "grouped": np.sum(w_ar, 0),
            "broadcast": mean_ar if rank == root else np.zeros(3)}
    offset = sum(r + 1 for r in range(rank))
    want["allgather"] = np.mean(every_w("w_ag", lambda r: (total_ag, 2)), 0)[
        offset:offset + rank + 1]
    # Horovod's reducescatter gradient: the allgather of the upstream gradients, times
    # size for Sum (size times the exact gradient of the summed losses, either op).
    want["reducescatter"] = np.concatenate(every_w("w_rs", rs_rows))
    want["reducescatter Sum"] = np.concatenate(every_w("w_rs", rs_rows)) * size
    w_a2a = every_w("w_a2a", a2a_rows)
    blocks = []
    for dest in range(size):
        start = sum(splits_of(s, size)[dest] for s in range(rank))
        blocks.append(w_a2a[dest][start:start + splits_of(rank, size)[dest]])
    want["alltoall"] = np.concatenate(blocks)
    w_even = every_w("w_even", lambda r: (total_ag, 2))
    want["alltoall even"] = np.concatenate([w_even[dest][offset:offset + rank + 1]
                                            for dest in range(size)])
    args = [tf.constant(data(rank, "x_ar", (3,), "float64")),
            tf.constant(data(rank, "x_ag", (rank + 1, 2), "float64")),
            tf.constant(data(rank, "x_rs", (rows, 2), "float64")),
            tf.constant(data(rank, "x_a2a", (sum(splits_of(rank, size)), 2), "float64")),
            tf.constant(data(rank, "x_even", (size * (rank + 1), 2), "float64"))]
    for mode, fn in (("eager", grads), ("graph", tf.function(grads))):
        got = fn(*args)
        for key, value in want.items():
            close(got[key].numpy(), value, f"{mode} gradient of {key}", tol=F64_TOL)
    # Forward mode: eager collectives skip tf.custom_gradient when nothing records, so a
    # ForwardAccumulator must still count as recording (the JVP of a Sum is the sum of
    # every rank's tangent).
    x = tf.constant(data(rank, "x_ar", (3,), "float64"))
    tangents = [np.arange(3.0) + r for r in range(size)]
    with tf.autodiff.ForwardAccumulator(x, tf.constant(tangents[rank])) as accumulator:
        y = hvd.allreduce(3.0 * x, op=hvd.Sum, name="forward.mode")
    jvp = accumulator.jvp(y)
    check(jvp is not None, "a ForwardAccumulator sees the eager allreduce")
    if jvp is not None:
        close(jvp.numpy(), 3.0 * np.sum(tangents, 0), "forward-mode JVP of allreduce Sum",
              tol=F64_TOL)


def second_order(rank: int, size: int) -> None:
    """Gradients of gradients through the collectives (a gradient penalty, MAML): the
    backward of each collective is differentiable in turn (once a constant to the outer
    tape: silently wrong, or None through DistributedGradientTape)."""
    x = tf.Variable([1.0, 2.0], dtype=tf.float64)
    xv, scale = np.array([1.0, 2.0]), float(rank + 1)
    total = sum(r + 1.0 for r in range(size))

    def through_allreduce():
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                y = hvd.allreduce(scale * x * x, op=hvd.Sum)  # total * x^2 everywhere
                loss = tf.reduce_sum(y * y)
            grad = inner.gradient(loss, x)  # 4 size total scale x^3
            penalty = tf.reduce_sum(grad)
        return grad, outer.gradient(penalty, x)

    def through_tape():
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                loss = tf.reduce_sum(x ** 3) * scale
            grad = hvd.DistributedGradientTape(inner).gradient(loss, x)  # 3 x^2 mean(scale)
            penalty = tf.reduce_sum(grad)
        # The allreduce's gradient is the allreduce of the upstream ones (all 1): 6 x scale.
        return grad, outer.gradient(penalty, x)
    for mode, wrap in (("eager", lambda f: f), ("tf.function", tf.function)):
        grad, second = wrap(through_allreduce)()
        close(grad.numpy(), 4 * size * total * scale * xv ** 3, f"{mode}: first order", tol=F64_TOL)
        close(second.numpy(), 12 * size * total * scale * xv ** 2,
              f"{mode}: second order through allreduce", tol=F64_TOL)
        grad, second = wrap(through_tape)()
        close(grad.numpy(), 3 * xv ** 2 * total / size, f"{mode}: DistributedGradientTape",
              tol=F64_TOL)
        check(second is not None, f"{mode}: second order through DistributedGradientTape")
        close(second.numpy(), 6 * xv * scale,
              f"{mode}: second order through DistributedGradientTape", tol=F64_TOL)


def eager_tape_over_tf_function(rank: int, size: int) -> None:
    """A tf.function forward with 16 independent allreduces of uneven sizes, differentiated
    by an eager tape outside it: TensorFlow builds that backward function without automatic
    control dependencies, and its collectives once ran in a different order on each rank
    (a hang). loss = sum_i sum(cos(o_i) * o_i), o_i = allreduce(sin(x_i)) summed."""
    sizes = [10, 1_000_000, 100_000, 10, 1_000_000, 100_000, 10, 1_000_000] * 2
    every = [[data(r, f"fwd.{i}", (n,), "float64") for r in range(size)]
             for i, n in enumerate(sizes)]
    xs = [tf.Variable(x[rank]) for x in every]

    @tf.function
    def forward():
        outs = [hvd.allreduce(tf.sin(x), op=hvd.Sum) for x in xs]
        return tf.add_n([tf.reduce_sum(tf.cos(o) * o) for o in outs])
    for step in range(2):
        with tf.GradientTape() as tape:
            loss = forward()
        grads = tape.gradient(loss, xs)
        for i, (grad, x) in enumerate(zip(grads, every)):
            o = np.sum(np.sin(x), 0)
            want = size * (np.cos(o) - o * np.sin(o)) * np.cos(x[rank])
            close(grad.numpy(), want, f"step {step}: gradient {i} through an eager tape "
                  "over tf.function", tol=F64_TOL)


# -- errors, sparse, compression, variables, objects ---------------------------------------
def mismatch(rank: int, size: int) -> None:
    """Horovod's error types, eagerly and in tf.function: FailedPreconditionError where the
    ranks disagree (still a HorovodInternalError eagerly), InvalidArgumentError for a bad
    argument (still a ValueError eagerly); the message names the tensor and what differed."""
    if size > 1:
        shape = (2,) if rank == 0 else (3,)
        exc = expect_error(lambda: hvd.allreduce(tf.ones(shape), name="mismatched.shape"),
                           tf.errors.FailedPreconditionError, "mismatched.shape",
                           what="eager shape mismatch")
        check(isinstance(exc, hvd.HorovodInternalError), f"still ours: {type(exc)}")
        check("shape" in str(exc), f"message says what differs: {exc}")
        dtype = tf.float32 if rank == 0 else tf.float64
        expect_error(lambda: hvd.allreduce(tf.ones(2, dtype), name="mismatched.dtype"),
                     tf.errors.FailedPreconditionError, "mismatched.dtype",
                     what="eager dtype mismatch")
        expect_error(lambda: hvd.broadcast(tf.ones(2), rank, name="mismatched.root"),
                     tf.errors.FailedPreconditionError, "root rank", what="eager root mismatch")
        expect_error(lambda: hvd.alltoall(tf.ones([size, rank + 1]), name="mismatched.a2a"),
                     tf.errors.FailedPreconditionError, "after the first dimension",
                     what="eager alltoall mismatch")
        close(hvd.allreduce(tf.ones(2), op=hvd.Sum).numpy(), np.full(2, size),
              "allreduce after a mismatch", tol=F64_TOL)

        @tf.function
        def unnamed(x):
            return hvd.allreduce(x, op=hvd.Sum)
        exc = expect_error(lambda: unnamed(tf.ones(shape)), tf.errors.FailedPreconditionError,
                           "HorovodInternalError", what="graph shape mismatch")
        check("allreduce.graph0" in str(exc) and "disagree on the shape" in str(exc),
              f"graph error names the tensor and what differed: {exc}")
        close(unnamed(tf.ones(2)).numpy(), np.full(2, size),
              "graph allreduce after a mismatch", tol=F64_TOL)
        expect_error(lambda: hvd.alltoall(tf.ones([size + 1])), tf.errors.InvalidArgumentError,
                     "not divisible", what="eager alltoall without splits, rows not divisible")
        expect_error(lambda: tf.function(hvd.alltoall)(tf.ones([size + 1])),
                     tf.errors.InvalidArgumentError, "not divisible",
                     what="tf.function alltoall without splits, rows not divisible")
    exc = expect_error(lambda: hvd.broadcast(tf.ones(2), size), tf.errors.InvalidArgumentError,
                       "out of range", what="eager root out of range")
    check(isinstance(exc, ValueError), f"still a ValueError: {type(exc)}")
    expect_error(lambda: hvd.allgather(tf.constant(1.0)), ValueError, "0-dim",
                 what="allgather of a scalar")
    expect_error(lambda: hvd.allreduce(tf.constant(["a"])), TypeError, "not supported",
                 what="string dtype")
    check(hvd._executing_eagerly() and not tf.function(hvd._executing_eagerly)(),
          "hvd._executing_eagerly")


def sparse_and_compression(rank: int, size: int) -> None:
    def slices(r):
        indices = np.array([r % 4, 7, (3 * r) % 10], np.int64)
        return data(r, "sv", (3, 2), "float32"), indices

    dense_of = lambda v, i: np.add.at(z := np.zeros((10, 2)), i, v) or z  # noqa: E731
    every = [dense_of(*slices(r)) for r in range(size)]
    values, indices = slices(rank)
    sparse = tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant([10, 2]))
    for label, op, want in (("Average", hvd.Average, np.mean(every, 0)),
                            ("Sum", hvd.Sum, np.sum(every, 0))):
        for mode, fn in (("eager", hvd.allreduce), ("graph", tf.function(hvd.allreduce))):
            reduced = fn(sparse, op=op)
            check(isinstance(reduced, tf.IndexedSlices), f"sparse {label} stays IndexedSlices")
            close(tf.convert_to_tensor(reduced).numpy(), want,
                  f"{mode} sparse allreduce {label}", FLOAT_TOL["float32"])
    # Horovod's integer Average: the values divided by size with true division (uint8
    # comes back float32, int32 float64), not rounded in the integer dtype.
    for dtype, want_dtype in (("uint8", "float32"), ("int32", "float64")):
        ints = tf.IndexedSlices(tf.constant(np.full((1, 3), rank + 1), dtype), tf.constant([0]),
                                tf.constant([1, 3]))
        for mode, fn in (("eager", hvd.grouped_allreduce),
                         ("graph", tf.function(hvd.grouped_allreduce))):
            reduced = fn([ints], op=hvd.Average)[0]
            check(reduced.values.dtype.name == want_dtype,
                  f"{mode} sparse Average of {dtype}: {reduced.values.dtype.name}")
            close(tf.reduce_sum(reduced.values, 0).numpy(),
                  np.full(3, sum(r + 1 for r in range(size)) / size),
                  f"{mode} sparse Average of {dtype}", tol=F64_TOL)
    for kwargs in ({"prescale_factor": 0.5}, {"postscale_factor": 2.0}):
        expect_error(lambda: hvd.allreduce(sparse, op=hvd.Sum, **kwargs), NotImplementedError,
                     "IndexedSlices", what=f"sparse allreduce with {kwargs}")
    x = data(rank, "comp", (4, 3), "float32") / 7
    want = np.mean([data(r, "comp", (4, 3), "float32") / 7 for r in range(size)], 0)
    for label, compression, tol in (("fp16", hvd.Compression.fp16, 2e-3),
                                    ("bf16", hvd.Compression.bf16, 2e-2)):
        got = hvd.allreduce(tf.constant(x), compression=compression)
        check(got.dtype == tf.float32, f"{label} decompresses to float32")
        close(got.numpy(), want, f"{label} compression", tol=tol)


def variables_and_objects(rank: int, size: int) -> None:
    import keras
    root = size - 1
    tf_var = tf.Variable(np.full(3, rank, np.float32))
    keras_var = keras.Variable(np.full((2, 2), rank, np.float64))
    counter = tf.Variable(rank, dtype=tf.int64)
    hvd.broadcast_variables([tf_var, keras_var, counter], root_rank=root)
    close(tf_var.numpy(), np.full(3, root), "broadcast_variables tf.Variable", tol=F64_TOL)
    close(keras_var.numpy(), np.full((2, 2), root), "broadcast_variables keras.Variable",
          tol=F64_TOL)
    check(int(counter.numpy()) == root, "broadcast_variables int64")
    tf_var.assign(np.full(3, rank, np.float32))

    @tf.function
    def broadcast_in_place():
        return hvd.broadcast_([tf_var], 0)
    close(broadcast_in_place()[0].numpy(), np.zeros(3), "broadcast_ in tf.function returns",
          tol=F64_TOL)
    close(tf_var.numpy(), np.zeros(3), "broadcast_ in tf.function", tol=F64_TOL)
    tf_var.assign(np.full(3, rank, np.float32))
    close(hvd.broadcast_([tf_var, keras_var], root)[0].numpy(), np.full(3, root),
          "broadcast_ returns the values", tol=F64_TOL)
    close(tf_var.numpy(), np.full(3, root), "broadcast_ eagerly", tol=F64_TOL)
    check(hvd.broadcast_object({"from": rank}, root_rank=root) == {"from": root},
          "broadcast_object")
    check(hvd.allgather_object(rank * 10) == [r * 10 for r in range(size)], "allgather_object")
    hvd.barrier()
    tf.function(hvd.barrier)()
    if rank != 0:  # rank 0 joins at once; its zeros still count in the Average
        got = hvd.allreduce(tf.ones(2) * size, op=hvd.Average, name="after.join")
        close(got.numpy(), np.full(2, size - 1.0), "allreduce with a joined rank", tol=F64_TOL)
    last = int(hvd.join().numpy())
    check(hvd.allgather_object(last) == [last] * size and 0 <= last < size,
          f"join returns the same last rank everywhere ({last})")


def process_set(rank: int, size: int) -> None:
    """Collectives on a subset of ranks, eagerly and traced; the rest keep out of it."""
    if size < 2:
        return
    members = [0, 1] if size > 2 else [0]  # every rank is the global set (Horovod's rule)
    pair = hvd.add_process_set(members)
    if pair.included():
        x = tf.constant([rank + 1.0, 10.0])

        @tf.function
        def traced(t):
            return hvd.allreduce(t, op=hvd.Sum, process_set=pair), hvd.allgather(
                t, process_set=pair)
        for mode, (summed, gathered) in (
                ("eager", (hvd.allreduce(x, op=hvd.Sum, process_set=pair),
                           hvd.allgather(x, process_set=pair))),
                ("graph", traced(x))):
            close(summed.numpy(), [sum(r + 1.0 for r in members), 10.0 * len(members)],
                  f"{mode} allreduce on process set {members}", tol=F64_TOL)
            close(gathered.numpy(), [v for r in members for v in (r + 1.0, 10.0)],
                  f"{mode} allgather on {members}", tol=F64_TOL)
    else:  # Horovod's op error type, still a ValueError
        for error in (tf.errors.InvalidArgumentError, ValueError):
            expect_error(lambda: hvd.allreduce(tf.ones(1), process_set=pair), error,
                         "not a member", what="collective on a set this rank is not in")
    fake = hvd.ProcessSet([0])
    fake.process_set_id = 10  # never registered (Horovod's test does this): ValueError
    expect_error(lambda: hvd.allreduce(tf.ones(1), process_set=fake), ValueError,
                 "not a registered process set", what="a set whose id was set by hand")
    hvd.remove_process_set(pair)


def results_kept_across_calls(rank: int, size: int) -> None:
    """Outputs are reused from call to call (outputs.py): results a caller keeps must
    keep their values while later calls of the same sizes run, eagerly (allreduce alone,
    grouped, allgather, broadcast, reducescatter) and in tf.function. An eager tensor a
    tf.function captures is reduced when the function runs, not when it is traced."""
    def inputs(step: int) -> list[tf.Tensor]:
        return [tf.constant(data(r, f"kept.{step}", (2 * size, 300), "float32"))
                for r in range(size)]

    kept, want = [], []
    for step in range(6):
        every = inputs(step)
        mine = every[rank]
        kept.append([hvd.allreduce(mine, op=hvd.Sum, name=f"kept.ar.{step % 2}"),
                     *hvd.grouped_allreduce([mine, mine * 2], op=hvd.Sum,
                                            name=f"kept.gr.{step % 2}"),
                     hvd.allgather(mine, name=f"kept.ag.{step % 2}"),
                     hvd.broadcast(mine, step % size, name=f"kept.bc.{step % 2}"),
                     hvd.reducescatter(mine, op=hvd.Sum, name=f"kept.rs.{step % 2}")])
        total = sum(np.asarray(x, np.float64) for x in every)
        want.append([total, total, 2 * total, np.concatenate(every),
                     every[step % size].numpy(), total[2 * rank:2 * rank + 2]])
        for _ in range(3):  # results dropped at once: their blocks are taken again
            hvd.allreduce(mine * 0, op=hvd.Sum, name="kept.dropped")
    labels = ["allreduce", "grouped 0", "grouped 1", "allgather", "broadcast", "reducescatter"]
    for step, (got, expected) in enumerate(zip(kept, want)):
        for label, tensor, value in zip(labels, got, expected):
            close(f64(tensor.numpy()), value, f"{label} of step {step}, kept", FLOAT_TOL["float32"])

    captured = tf.constant(np.full(5, rank + 1.0, np.float32))
    reduce_captured = tf.function(lambda: hvd.allreduce(captured, op=hvd.Sum, name="captured"))
    graph = reduce_captured.get_concrete_function().graph
    check(any(op.type == "EagerPyFunc" for op in graph.get_operations()),
          "an eager tensor captured by tf.function: no collective op in the graph")
    close(reduce_captured().numpy(), np.full(5, size * (size + 1) / 2), "captured tensor")
    from tensorflow.python.autograph.impl.api import is_autograph_artifact
    check(all(is_autograph_artifact(f) for f in (hvd.allreduce, hvd.allgather,
                                                 hvd.broadcast, hvd.reducescatter)),
          "AutoGraph's converted_call would convert the public collectives")


def odd_sized_groups(rank: int, size: int) -> None:
    """A grouped allreduce's results are views of the runtime's block (ops.allreduce).
    TensorFlow aborts the process (Check failed: IsAligned) when a kernel meets memory
    it adopted that is not 64-byte aligned, so results at odd offsets must be copied:
    sizes of 3, 5, 17 ... elements put most of them there. Each result goes through a
    strided slice, which checks, eagerly and in tf.function, small groups and ones of
    the shared-memory backend's sizes, float32 and int8."""
    counts = [3, 5, 17, 1, 40000, 7, 16]
    for dtype in ("float32", "int8"):
        every = [[data(r, f"odd.{dtype}.{i}", (n,), dtype) for i, n in enumerate(counts)]
                 for r in range(size)]
        mine = [tf.constant(a) for a in every[rank]]
        want = [reduce_ref([every[r][i] for r in range(size)], "Sum", dtype, size)
                for i in range(len(counts))]
        sliced = tf.function(lambda xs: [t[1:] for t in hvd.grouped_allreduce(
            xs, op=hvd.Sum, name="odd.graph")])
        for mode, results in (
                ("eager", [t[1:] for t in hvd.grouped_allreduce(mine, op=hvd.Sum,
                                                                name=f"odd.{dtype}")]),
                ("tf.function", sliced(mine))):
            for i, (got, value) in enumerate(zip(results, want)):
                close(f64(got.numpy()), value[1:],
                      f"{mode} grouped allreduce, {dtype} tensor {i} of {counts[i]}",
                      FLOAT_TOL.get(dtype, 0))


def use_before_init(rank: int, size: int) -> None:
    """Before init() the calls say to call it; then init() (rank and size are MPI's)."""
    expect_error(hvd.rank, ValueError, "init()", what="rank() before init")
    expect_error(lambda: hvd.allreduce(tf.ones(1)), ValueError, "init()",
                 what="allreduce before init")
    hvd.init(process_sets="dynamic")
    check((hvd.rank(), hvd.size()) == (rank, size),
          f"init(): rank {hvd.rank()} of {hvd.size()}, MPI's {rank} of {size}")


def tape_flat_buckets(rank: int, size: int) -> None:
    """DistributedGradientTape sends one flat bucket per dtype, not one tensor per
    variable (counted at the core's submit calls), eagerly and in tf.function, with
    explicit groups splitting the buckets, and every gradient equal to numpy's mean."""
    from horovodish.common.api import collectives as core
    shapes = [(3, 4), (4,), (2, 2, 2), (5,), (1,)]
    variables = [tf.Variable(data(0, f"v{i}", shape, "float32")) for i, shape in
                 enumerate(shapes)] + [tf.Variable(data(0, "v64", (3,), "float64"))]
    scale = [float(r + 1) for r in range(size)]

    def step() -> list:
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(tf.cast(v, tf.float64) ** 2) * scale[rank]
                             for v in variables])
        return hvd.DistributedGradientTape(tape).gradient(loss, variables)

    def grouped_step() -> list:
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(tf.cast(v, tf.float64) ** 2) * scale[rank]
                             for v in variables])
        tape = hvd.DistributedGradientTape(tape, groups=[variables[:2], variables[2:5]])
        return tape.gradient(loss, variables)

    submitted: list[int] = []
    single, grouped = core.allreduce_async, core.grouped_allreduce_async

    def count_single(*args, **kwargs):
        submitted.append(1)
        return single(*args, **kwargs)

    def count_grouped(arrays, *args, **kwargs):
        submitted.append(len(arrays))
        return grouped(arrays, *args, **kwargs)
    core.allreduce_async, core.grouped_allreduce_async = count_single, count_grouped
    try:
        for mode, fn, buckets in (("eager", step, 2), ("graph", tf.function(step), 2),
                                  ("groups", grouped_step, 3)):
            for _ in range(2):
                submitted.clear()
                got = fn()
                check(sum(submitted) == (buckets if size > 1 else 0),
                      f"{mode}: {sum(submitted)} tensors went to the core, want {buckets} "
                      "flat buckets")
                mean = sum(scale) / size
                for v, g in zip(variables, got):
                    close(g.numpy(), 2 * v.numpy() * mean, f"{mode}: gradient of {v.name}",
                          tol=1e-5)
    finally:
        core.allreduce_async, core.grouped_allreduce_async = single, grouped


def gradients_outside_the_set(rank: int, size: int) -> None:
    """DistributedGradientTape and the Keras optimizer of a process set, called on every
    rank: members get the members' average, a rank outside the set its own gradients
    unchanged (Horovod's identity branch), with no collective and no error."""
    if size < 3:
        return
    members = [0, size - 1]
    pair = hvd.add_process_set(members)
    variable = tf.Variable([1.0, 2.0, 3.0])
    factor = lambda r: float(r + 1)  # noqa: E731  d loss / d v = factor * 2 v

    def grads():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(variable ** 2) * factor(rank)
        return hvd.DistributedGradientTape(tape, process_set=pair).gradient(loss, [variable])
    mine = 2 * np.array([1.0, 2.0, 3.0]) * factor(rank)
    want = 2 * np.array([1.0, 2.0, 3.0]) * np.mean([factor(r) for r in members]) \
        if rank in members else mine
    for mode, fn in (("eager", grads), ("graph", tf.function(grads))):
        close(fn()[0].numpy(), want, f"{mode} tape gradient on rank {rank}, set {members}",
              tol=1e-6)
    import keras
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), process_set=pair)
    weights = keras.Variable([1.0, 2.0, 3.0])
    optimizer.apply_gradients([(tf.constant(mine, tf.float32), weights)])
    close(weights.numpy(), np.array([1.0, 2.0, 3.0]) - want,
          f"Keras optimizer step on rank {rank}, set {members}", tol=1e-6)
    hvd.remove_process_set(pair)


if __name__ == "__main__":
    quiet_tensorflow()
    # Horovod's graph mode, and Keras layers across ranks, in this job: TensorFlow's
    # import costs seconds per rank.
    import graph_checks
    import layers_checks
    size = MPI.COMM_WORLD.Get_size()
    run_checks([use_before_init, collectives, gradients, eager_tape_over_tf_function,
                second_order, mismatch, sparse_and_compression, variables_and_objects,
                process_set, results_kept_across_calls, odd_sized_groups, tape_flat_buckets,
                gradients_outside_the_set, *graph_checks.CHECKS,
                *(layers_checks.CHECKS if size > 1 else [])],
               MPI.COMM_WORLD.Get_rank(), size)
