"""A script written for Horovod's TensorFlow API (``import horovod.tensorflow as hvd``),
run unchanged through the alias: graph mode (tf.compat.v1 sessions) and eager, the
behaviours Horovod's own TensorFlow suite relies on, against numpy."""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402  (the alias: horovodish.tensorflow)
from horovod.tensorflow.util import _executing_eagerly  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
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


if __name__ == "__main__":
    hvd.init()
    run_checks([graph_mode_broadcast_global_variables,
                graph_mode_broadcast_gradient_does_not_hang,
                graph_mode_mismatch_is_failed_precondition, eager_uint16_collectives,
                eager_mismatch_is_failed_precondition], hvd.rank(), hvd.size())
