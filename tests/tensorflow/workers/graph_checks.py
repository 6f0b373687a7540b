"""Collectives in tf.compat.v1 graphs run by a Session (Horovod's graph mode), on every rank
against numpy: gradients (the broadcast's on a non-root rank once hung both ranks),
Horovod's error types, in-place broadcasts, broadcast_global_variables, barrier, sparse
averages. Each graph is built the same way on every rank, as Horovod's tests build theirs.
Each is a named check (tests/worker_support.py), in CHECKS; collectives_worker.py runs
them after its eager ones, in the same job (TensorFlow's import costs seconds per rank).
"""
from __future__ import annotations

import itertools
import signal
import time

import numpy as np
from checks import F64_TOL
from worker_support import check, close, expect_error  # noqa: E402

import tensorflow as tf  # noqa: E402  (checks quiets TF first)

import horovodish.tensorflow as hvd  # noqa: E402

v1 = tf.compat.v1


def in_graph(fn):
    """fn(session) inside a fresh graph and session: a graph-mode 'test'."""
    with tf.Graph().as_default(), v1.Session() as session:
        return fn(session)


def broadcast_gradient(rank: int, size: int) -> None:
    """Horovod's test_horovod_broadcast_grad_cpu: one graph, a broadcast and its gradient
    per root, each gradient fetched on its own. On a non-root rank the gradient is zeros;
    built as a constant it no longer depended on the allreduce, so those ranks skipped
    the collectives the root waited in, and both ranks hung."""
    def body(session):
        for dtype, dim, root in itertools.product([tf.float32, tf.float64], [1, 2],
                                                  range(size)):
            tensor = tf.cast(tf.ones([3] * dim) * rank, dtype)
            grad = tf.gradients(hvd.broadcast(tensor, root), tensor, tf.ones([3] * dim, dtype))
            want = np.ones([3] * dim) * (1.0 if rank == root else 0.0)
            close(session.run(grad[0]), want, f"broadcast gradient, root {root}, {dtype.name}",
                  tol=F64_TOL)
    in_graph(body)


def reducescatter_gradient(rank: int, size: int) -> None:
    """Horovod's reducescatter gradient: the allgather of the upstream gradients, times
    size for Sum."""
    def body(session):
        x = tf.ones([2 * size, 3], tf.float64)
        for op, scale in ((hvd.Sum, size), (hvd.Average, 1)):
            out = hvd.reducescatter(x, op=op)
            grad = tf.gradients(out, x, tf.ones([2, 3], tf.float64))[0]
            close(session.run(grad), np.full((2 * size, 3), scale), f"reducescatter grad {op}",
                  tol=F64_TOL)
    in_graph(body)


def errors(rank: int, size: int) -> None:
    """Horovod's error types when a session runs the op: FailedPrecondition where ranks
    disagree, InvalidArgument for a bad argument; the message names the tensor and what
    differed, on every rank; the next graph's collectives work."""
    if size > 1:
        cases = {
            "shape": lambda: hvd.allreduce(tf.ones([2 + rank]), name="g.shape"),
            "dtype": lambda: hvd.allgather(tf.ones([2], tf.float32 if rank else tf.int32),
                                           name="g.dtype"),
            "root rank": lambda: hvd.broadcast(tf.ones([2]), rank, name="g.root"),
            "shape after the first dimension": lambda: hvd.alltoall(
                tf.ones([2 * size, rank + 1]), name="g.a2a"),
        }
        for what, build in cases.items():
            def body(session, build=build, what=what):
                exc = expect_error(lambda: session.run(build()),
                                   tf.errors.FailedPreconditionError,
                                   "ranks disagree on the " + what,
                                   what=f"graph mismatch of the {what}")
                check("g." in str(exc), f"the error names the tensor: {exc}")
            in_graph(body)
    for what, build in {
            "not divisible": lambda: hvd.alltoall(tf.ones([size + 1])) if size > 1 else None,
            "splits": lambda: hvd.alltoall(tf.ones([size]), splits=[1] * (size + 1)),
            "out of range": lambda: hvd.broadcast(tf.ones([2]), size)}.items():
        def body(session, build=build, what=what):
            op = build()
            if op is not None:
                expect_error(lambda: session.run(op), tf.errors.InvalidArgumentError, what,
                             what=f"graph bad argument: {what}")
        in_graph(body)
    in_graph(lambda s: close(s.run(hvd.allreduce(tf.ones([2]), op=hvd.Sum)),
                             np.full(2, size), "a graph after the failures", tol=F64_TOL))


def variables(rank: int, size: int) -> None:
    """broadcast_ returns the broadcast values, which a session runs to assign them (a
    RefVariable too); broadcast_global_variables returns the op for a session to run."""
    root = size - 1

    def body(session):
        resource = tf.Variable(np.full(3, rank, np.float32))
        ref = v1.Variable(np.full(2, rank, np.int32), use_resource=False)
        session.run(v1.global_variables_initializer())
        values = hvd.broadcast_([resource, ref], root)
        got = session.run(values)
        close(got[0], np.full(3, root), "broadcast_ value (resource variable)", tol=F64_TOL)
        close(got[1], np.full(2, root), "broadcast_ value (RefVariable)", tol=F64_TOL)
        close(session.run(resource), np.full(3, root), "broadcast_ assigned (resource)",
              tol=F64_TOL)
        close(session.run(ref), np.full(2, root), "broadcast_ assigned (RefVariable)", tol=F64_TOL)
        session.run([resource.assign(np.full(3, rank, np.float32)),
                     v1.assign(ref, np.full(2, rank, np.int32))])
        session.run(hvd.broadcast_global_variables(0))
        close(session.run(resource), np.zeros(3), "broadcast_global_variables", tol=F64_TOL)
        close(session.run(ref), np.zeros(2), "broadcast_global_variables (RefVariable)",
              tol=F64_TOL)
        barrier = hvd.barrier()
        check(isinstance(barrier, tf.Operation), f"barrier returns the op: {barrier!r}")
        session.run(barrier)
    in_graph(body)
    expect_error(lambda: hvd.broadcast_global_variables(0), RuntimeError, "broadcast_variables",
                 what="broadcast_global_variables eagerly")


def legacy_optimizer(rank: int, size: int) -> None:
    """hvd.DistributedOptimizer around a tf.compat.v1.train optimizer (TensorFlow 1 style
    scripts): minimize() in a session, each rank on its own rows of the global batch, ends
    where numpy's momentum on the whole batch does, on every rank; eagerly too; the
    gradient of a registered local variable stays this rank's, divided by the size."""
    features, per_rank, steps, lr, mu = 3, 4, 5, 0.125, 0.875  # exact in float32: TF casts them
    gen = np.random.default_rng(3)
    x = gen.normal(size=(steps, size * per_rank, features))
    y = gen.normal(size=(steps, size * per_rank))
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    want_w, velocity = np.full(features, 0.5), np.zeros(features)
    for s in range(steps):  # numpy, one process, the whole batch
        grad = 2 * x[s].T @ (x[s] @ want_w - y[s]) / len(y[s])
        velocity = mu * velocity + grad
        want_w = want_w - lr * velocity

    # Horovod's TensorFlow 1 script: the step is built first, the hook's broadcast after
    # it (in MonitoredSession's begin), and the ranks start from different weights.
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=np.full(features, 0.5 + rank), dtype=tf.float64)
        xs, ys = v1.placeholder(tf.float64, [per_rank, features]), v1.placeholder(tf.float64)
        loss = tf.reduce_mean((tf.linalg.matvec(xs, w) - ys) ** 2)
        opt = hvd.DistributedOptimizer(v1.train.MomentumOptimizer(lr, mu))
        check(isinstance(opt, v1.train.Optimizer), f"wrapper type {type(opt).__name__}")
        train = opt.minimize(loss)
        with v1.train.MonitoredSession(hooks=[hvd.BroadcastGlobalVariablesHook(0)]) as session:
            close(session.run(w), np.full(features, 0.5), "hook: rank 0's start", tol=0)
            for s in range(steps):
                session.run(train, {xs: x[s, mine], ys: y[s, mine]})
            close(session.run(w), want_w, "graph: momentum weights against numpy", tol=1e-9)
        check(opt.get_slot_names() == ["momentum"], f"slots {opt.get_slot_names()}")

    # Eagerly, with a local variable: its gradient is this rank's own, divided by size.
    w = tf.Variable(np.full(features, 0.5), dtype=tf.float64)
    own = tf.Variable(float(rank + 1), dtype=tf.float64)
    opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(lr))
    opt.register_local_var(own)
    pairs = opt.compute_gradients(
        lambda: tf.reduce_mean((tf.linalg.matvec(tf.constant(x[0, mine]), w) - y[0, mine])
                               ** 2) + own * own, [w, own])
    close(pairs[0][0].numpy(),
          2 * x[0].T @ (x[0] @ np.full(features, 0.5) - y[0]) / (size * per_rank),
          "eager: reduced gradient of w", tol=1e-9)
    close(pairs[1][0].numpy(), 2.0 * (rank + 1) / size, "eager: local gradient / size",
          tol=1e-12)
    expect_error(lambda: hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(lr),
                                                  backward_passes_per_step=2),
                 ValueError, "backward_passes_per_step > 1", "eager execution")


def legacy_optimizer_accumulates(rank: int, size: int) -> None:
    """backward_passes_per_step=N around a tf.compat.v1.train optimizer in a session, as
    Horovod's: each pass adds its gradient locally; every N-th pass reduces the sums
    (divided by N with average_aggregated_gradients) and applies them, once (momentum
    sees one update per N passes); global_step counts every pass. Against numpy on the
    whole batch, on every rank."""
    features, per_rank, passes, lr, mu = 3, 4, 6, 0.125, 0.5
    gen = np.random.default_rng(5)
    x = gen.normal(size=(passes, size * per_rank, features))
    y = gen.normal(size=(passes, size * per_rank))
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    for every, average in ((2, False), (3, True)):
        want_w, velocity, summed = np.full(features, 0.5), np.zeros(features), 0
        trace = []
        for s in range(passes):  # numpy, one process, the whole batch
            summed = summed + 2 * x[s].T @ (x[s] @ want_w - y[s]) / len(y[s])
            if (s + 1) % every == 0:
                velocity = mu * velocity + summed / (every if average else 1)
                want_w, summed = want_w - lr * velocity, 0
            trace.append(want_w)
        with tf.Graph().as_default():
            w = v1.get_variable("w", initializer=np.full(features, 0.5), dtype=tf.float64)
            xs, ys = v1.placeholder(tf.float64, [per_rank, features]), v1.placeholder(tf.float64)
            loss = tf.reduce_mean((tf.linalg.matvec(xs, w) - ys) ** 2)
            step = v1.train.get_or_create_global_step()
            opt = hvd.DistributedOptimizer(v1.train.MomentumOptimizer(lr, mu),
                                           backward_passes_per_step=every,
                                           average_aggregated_gradients=average)
            train = opt.minimize(loss, global_step=step)
            with v1.train.MonitoredSession() as session:
                for s in range(passes):
                    session.run(train, {xs: x[s, mine], ys: y[s, mine]})
                    close(session.run(w), trace[s], f"every {every} (average {average}): "
                          f"weights after pass {s + 1}", tol=1e-9)
                check(session.run(step) == passes, f"global_step {session.run(step)} after "
                      f"{passes} passes of {every}")


def sparse_average(rank: int, size: int) -> None:
    """IndexedSlices Average: values divided by size with TensorFlow's true division, so
    integer values come back floating, as Horovod's do."""
    def body(session):
        for dtype, want_dtype in ((tf.uint8, np.float32), (tf.int32, np.float64),
                                  (tf.float32, np.float32)):
            values = tf.constant(np.full((1, 2), 3), dtype)
            slices = tf.IndexedSlices(values, tf.constant([rank]), tf.constant([size, 2]))
            got = session.run(hvd.allreduce(slices, op=hvd.Average).values)
            check(got.dtype == want_dtype, f"sparse Average of {dtype.name}: {got.dtype}")
            close(got, np.full((size, 2), 3 / size), f"sparse Average of {dtype.name}", tol=F64_TOL)
    in_graph(body)


class Alarm(Exception):
    pass


def interrupt(rank: int, size: int) -> None:
    """A timeout alarm stops a session.run whose collective waits for a late rank (Horovod's
    suite on one rank that failed a check and went on elsewhere hung for good): the
    handler runs within a slice of waiting, the collective completes once the late ranks
    submit it, and the next graph's collectives work."""
    if size == 1:
        return
    if rank == 0:
        def body(session):
            late = hvd.allreduce(tf.ones([2]), name="late", op=hvd.Sum)
            previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(Alarm()))
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            start = time.monotonic()
            try:
                session.run(late)
                check(False, "session.run returned though the other ranks were late")
            except (Alarm, RuntimeError, tf.errors.OpError) as exc:
                # Alarm itself, or the op's error; or (the handler raising while
                # TensorFlow's pybind11 layer converts the op's error) a RuntimeError that
                # names both.
                check(isinstance(exc, Alarm) or "stopped waiting" in str(exc)
                      or "Alarm" in str(exc), f"the alarm stopped the wait: {exc!r}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
            check(time.monotonic() - start < 2.5,
                  f"stopped after {time.monotonic() - start:.1f} s, not when the peers came")
        in_graph(body)
    else:
        time.sleep(3)  # late: rank 0's alarm goes off meanwhile
        hvd.allreduce(tf.ones([2]), name="late", op=hvd.Sum)
    in_graph(lambda s: close(s.run(hvd.allreduce(tf.ones([2]), op=hvd.Sum)),
                             np.full(2, size), "a graph after the interrupted one", tol=F64_TOL))


CHECKS = [broadcast_gradient, reducescatter_gradient, errors, variables, sparse_average,
          legacy_optimizer, legacy_optimizer_accumulates, interrupt]
