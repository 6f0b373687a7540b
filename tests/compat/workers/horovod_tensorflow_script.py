"""A script written for Horovod's TensorFlow API (``import horovod.tensorflow as hvd``),
run unchanged through the alias: graph mode (tf.compat.v1 sessions) and eager, the
behaviours Horovod's own TensorFlow suite relies on, against numpy."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402  (the alias: horovodish.tensorflow)
from horovod.tensorflow.util import _executing_eagerly  # noqa: E402

from worker_support import check, close, expect_error, run_checks  # noqa: E402

v1 = tf.compat.v1


def in_graph(fn):
    with tf.Graph().as_default(), v1.Session() as session:
        return fn(session)


def graph_mode_broadcast_global_variables(rank: int, size: int) -> None:
    def body(session):
        check(not _executing_eagerly(), "a v1 graph is not eager")
        variable = v1.get_variable("w", initializer=tf.constant([float(rank), 1.0]))
        session.run(v1.global_variables_initializer())
        session.run(hvd.broadcast_global_variables(0))
        close(session.run(variable), [0.0, 1.0], "every rank holds root's variable")
    in_graph(body)


def graph_mode_broadcast_gradient_does_not_hang(rank: int, size: int) -> None:
    def body(session):
        x = tf.ones([3]) * rank
        grad = tf.gradients(hvd.broadcast(x, 0), x, tf.ones([3]))[0]
        close(session.run(grad), np.full(3, 1.0 if rank == 0 else 0.0),
              "the broadcast's gradient in a session")
    in_graph(body)


def graph_mode_mismatch_is_failed_precondition(rank: int, size: int) -> None:
    def body(session):
        summed = hvd.allreduce(tf.ones([2 + rank]), op=hvd.Sum, name="mismatch")
        expect_error(lambda: session.run(summed), tf.errors.FailedPreconditionError,
                     "mismatch", what="shapes that differ across ranks")
    in_graph(body)


def eager_uint16_collectives(rank: int, size: int) -> None:
    gathered = hvd.allgather(tf.constant([rank, rank + 1], tf.uint16))
    close(gathered.numpy(), np.array([[r, r + 1] for r in range(size)]).reshape(-1),
          "uint16 allgather")
    close(hvd.broadcast(tf.constant([rank], tf.uint16), 0).numpy(), [0], "uint16 broadcast")


def eager_mismatch_is_failed_precondition(rank: int, size: int) -> None:
    dtype = tf.float32 if rank == 0 else tf.float64
    expect_error(lambda: hvd.allreduce(tf.ones([2], dtype), name="eager.mismatch"),
                 tf.errors.FailedPreconditionError, "eager.mismatch",
                 what="dtypes that differ across ranks")


def monitored_training_session(rank: int, size: int) -> None:
    """Horovod's TensorFlow 1 example, in miniature: a tf.compat.v1.train optimizer in
    hvd.DistributedOptimizer, a global step, BroadcastGlobalVariablesHook and
    StopAtStepHook in a MonitoredTrainingSession, each rank feeding its own rows from
    its own start; the weights end where numpy's gradient descent on the whole batch
    from rank 0's start does."""
    features, per_rank, last_step, lr = 4, 3, 6, 0.25  # 0.25: exact in float32
    gen = np.random.default_rng(5)
    x = gen.normal(size=(last_step, size * per_rank, features))
    y = gen.normal(size=(last_step, size * per_rank))
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    want = np.zeros(features)  # rank 0's start
    for s in range(last_step):
        want = want - lr * 2 * x[s].T @ (x[s] @ want - y[s]) / len(y[s])
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=np.full(features, float(rank)), dtype=tf.float64)
        xs, ys = v1.placeholder(tf.float64, [None, features]), v1.placeholder(tf.float64)
        loss = tf.reduce_mean((tf.linalg.matvec(xs, w) - ys) ** 2)
        opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(lr))
        train_op = opt.minimize(loss, global_step=v1.train.get_or_create_global_step())

        class Weights(v1.train.SessionRunHook):  # w after each step (run is closed after)
            value = None

            def after_run(self, run_context, run_values):
                Weights.value = run_context.session.run(w)
        hooks = [hvd.BroadcastGlobalVariablesHook(0),
                 v1.train.StopAtStepHook(last_step=last_step), Weights()]
        steps = 0
        with v1.train.MonitoredTrainingSession(checkpoint_dir=None, hooks=hooks) as session:
            while not session.should_stop():
                session.run(train_op, {xs: x[steps, mine], ys: y[steps, mine]})
                steps += 1
    check(steps == last_step, f"{steps} steps, want {last_step}")
    close(Weights.value, want, "weights against numpy on the whole batch", tol=1e-9)


if __name__ == "__main__":
    hvd.init()
    run_checks([graph_mode_broadcast_global_variables,
                graph_mode_broadcast_gradient_does_not_hang,
                graph_mode_mismatch_is_failed_precondition, eager_uint16_collectives,
                eager_mismatch_is_failed_precondition, monitored_training_session],
               hvd.rank(), hvd.size())
