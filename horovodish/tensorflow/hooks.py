"""TensorFlow 1 training hooks: ``hvd.BroadcastGlobalVariablesHook`` for
``tf.compat.v1.train.MonitoredTrainingSession`` scripts.

The hook builds its broadcast when the session is made, after the training step, and
runs it once the session exists. In a graph, a collective depends on every one built
before it (ops.run), so a session running the broadcast would also run the step's
gradient allreduce, without the step's feeds; the broadcast is therefore built on its
own (ops.standalone_collectives), which is safe because it runs alone, before any step.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from .functions import broadcast_global_variables
from .ops import standalone_collectives


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Broadcast every global variable from root_rank when the session is created, so
    that every rank starts from the same values (or from root's checkpoint)."""

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.device = device  # (Horovod's argument: the broadcast runs on the host here)
        self.bcast_op: Any = None

    def begin(self) -> None:
        graph = tf.compat.v1.get_default_graph()
        if self.bcast_op is None or self.bcast_op.graph is not graph:
            with standalone_collectives():
                self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session: Any, coord: Any) -> None:
        session.run(self.bcast_op)
