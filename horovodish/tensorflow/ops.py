"""Raw collectives: the one place TensorFlow tensors meet the core (numpy in, numpy out).

Eager tensors go straight to the core, with no op built (the cheapest path). Inside
tf.function (or a ``tf.compat.v1`` graph) each call becomes one ``tf.py_function``
(stateful) whose body submits to the core and waits, blocking a TensorFlow thread
meanwhile. So every rank must reach its collectives in the same order: each op gets a
control dependency on the collective built before it in the same graph. (The backward
function TensorFlow builds when an eager tape differentiates a tf.function has no
automatic control dependencies: there the gradients' collectives ran in whatever order
each rank's executor picked, each rank blocked on one the others had not reached, and
the job hung. In a tf.compat.v1 session, several independent collectives fetched at once
hung the same way, each rank's few executor threads blocked on different ones.) So a
session that runs a collective runs every collective built before it in that graph.
The chain is per graph: calls of inner tf.functions are not ordered by it
(docs/tensorflow.md). No gradients here (see mpi_ops.py).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from ..common.api import collectives as core
from ..common.api.process_sets import ProcessSet
from ..common.errors import RankMismatchError
from ..common.messages import ReduceOp
from ..common.handles import Handle, wait_all as handles_wait_all
from . import errors, interrupts
from ..common.execution.buffers import ALIGN, OutputBlocks

_from_dlpack = tf.experimental.dlpack.from_dlpack

_SUPPORTED = (tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16,
              tf.bfloat16, tf.float32, tf.float64, tf.bool)
_SUPPORTED_SET = frozenset(_SUPPORTED)  # a hash lookup: this runs per tensor and call


def check_dtype(tensor: Any, opname: str) -> None:
    if tensor.dtype not in _SUPPORTED_SET:
        names = ", ".join(d.name for d in _SUPPORTED)
        raise TypeError(f"{opname}: dtype {tensor.dtype.name} is not supported; "
                        f"supported: {names}")


def _require_xla_free(opname: str) -> None:
    """A numpy_function cannot be XLA-compiled; say so at trace time, not deep in XLA."""
    try:
        from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext
    except ImportError:
        return
    if GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise ValueError(f"horovodish {opname} cannot run inside an XLA-compiled function "
                         "(jit_compile=True); drop jit_compile, or for Keras pass "
                         "jit_compile=False to model.compile().")


def wait_all(handles: Sequence[Handle]) -> list[Any]:
    """Every handle waited for before the first error is raised (handles.wait_all),
    each interruptibly. (Every op here waits at once, so each submits with ``waited``:
    the runtime thread arms no timer for it.)"""
    return handles_wait_all(handles, interrupts.wait, stop_on=(interrupts.Interrupted,))


_OUTPUTS = OutputBlocks()


def empty(shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """An output buffer TensorFlow can adopt without a copy (see to_tensor)."""
    return _OUTPUTS.one(shape, dtype)


def empty_many(shapes: Sequence[Sequence[int]], dtypes: Sequence[np.dtype]
               ) -> list[np.ndarray]:
    """Output buffers for a group, each one TensorFlow can adopt (see to_tensor)."""
    return _OUTPUTS.many(shapes, dtypes)


def to_tensor(array: np.ndarray, aligned: bool = False) -> tf.Tensor:
    """Zero-copy through DLPack where TensorFlow allows it (an aligned buffer of a plain
    numeric dtype): copying the result was most of an eager allreduce's cost. aligned:
    the array is known to be (from empty or empty_many), which skips a 1 us check."""
    if array.dtype.kind in "iuf" and (aligned or (array.ctypes.data % ALIGN == 0
                                                  and array.flags.c_contiguous)):
        return _from_dlpack(array.__dlpack__())
    return tf.convert_to_tensor(array)


def _host_view(tensor: Any) -> np.ndarray:
    """np.asarray views an eager tensor's buffer (.numpy() copies it); a 0-dim tensor's
    __array__ gives a numpy scalar, which np.asarray refuses."""
    return np.asarray(tensor) if tensor.shape.rank else np.asarray(tensor.numpy())


def run(body: Callable[..., list[np.ndarray]], tensors: Sequence[Any],
        out_dtypes: Sequence[tf.DType], opname: str, aligned: bool = True) -> list[Any]:
    """body(*numpy arrays) -> numpy arrays, eagerly or as one graph op, failing with
    Horovod's error types (errors.py). In a graph, an op with no outputs is returned
    itself (a tf.compat.v1 session runs it). aligned: body's outputs come from empty or
    empty_many (see to_tensor)."""
    if tf.executing_eagerly():
        try:
            outs = body(*[_host_view(t) for t in tensors])
        except Exception as exc:
            errors.raise_eager(exc)
        return [to_tensor(out, aligned) for out in outs]
    _require_xla_free(opname)
    interrupts.install()
    traced = _listing([t.name for t in tensors])

    def graph_body(*inputs: tf.Tensor) -> list[Any]:
        try:
            return [to_tensor(out, aligned) for out in body(*[_host_view(t) for t in inputs])]
        except RankMismatchError as exc:
            if out_dtypes:
                return errors.graph_failure(f"{exc} [tf.function tensors: {traced}]",
                                            len(out_dtypes))
            raise
        except Exception as exc:
            # Add the graph tensors: the core's names for traced ops are counters.
            try:
                wrapped = type(exc)(f"{exc} [tf.function tensors: {traced}]")
            except Exception:  # noqa: BLE001 - a type with another constructor
                raise exc from None
            raise wrapped from exc
    # tf.py_function, not tf.numpy_function: only its kernel can fail with
    # FailedPrecondition (see errors.graph_failure).
    outs = as_one_link(lambda: tf.py_function(
        graph_body, list(tensors), list(out_dtypes),
        name=f"Horovodish{opname.title().replace('_', '')}"))
    return list(outs) if out_dtypes else [outs]  # no outputs: py_function gives the op


@contextlib.contextmanager
def standalone_collectives() -> Iterator[None]:
    """Collectives built inside depend on none built before them in the default graph,
    and the ones built after go on from where the chain was: for an op that a session
    runs alone, before any other collective (BroadcastGlobalVariablesHook's broadcast
    in ``after_create_session``), which must not run the training step's collectives,
    built earlier, too (that needed the step's feeds). Run anything built here on its
    own only: in one ``session.run`` with other collectives the ranks may order them
    differently."""
    graph = tf.compat.v1.get_default_graph()
    previous = getattr(graph, "_horovodish_last_collective", None)
    graph._horovodish_last_collective = None
    try:
        yield
    finally:
        graph._horovodish_last_collective = previous


def as_one_link(build: Callable[[], Any]) -> Any:
    """build() in a graph, as one link of its chain of collectives: for an op that holds
    collectives in a function of its own (a ``tf.cond`` branch, which chains its own),
    so that it runs after the collectives built before it and those built after it run
    after it. Returns what build returns."""
    graph = tf.compat.v1.get_default_graph()
    previous = getattr(graph, "_horovodish_last_collective", None)
    with tf.control_dependencies([previous] if previous is not None else []):
        built = build()
    first = tf.nest.flatten(built)[0]
    # On the graph itself (a reference cycle the collector frees with it), not in a table
    # keyed by graph, which the op would keep alive.
    graph._horovodish_last_collective = first if isinstance(first, tf.Operation) else first.op
    return built


def _listing(names: list[str], shown: int = 8) -> str:
    """The first few names: a ResNet's gradients would make a 10 KB message."""
    if len(names) <= shown:
        return ", ".join(names)
    return ", ".join(names[:shown]) + f", ... ({len(names) - shown} more)"


def _set_shapes(outs: list[tf.Tensor], shapes: Callable[[], Sequence[Any]]
                ) -> list[tf.Tensor]:
    """The static shapes of graph outputs (tf.py_function's are unknown). Eager tensors
    have theirs already, so shapes() (a TensorShape per tensor) runs in graphs only."""
    if tf.executing_eagerly():
        return outs
    for out, shape in zip(outs, shapes()):
        out.set_shape(shape)
    return outs


# -- the collectives ------------------------------------------------------------------------
def allreduce(tensors: Sequence[Any], names: Sequence[str], op: ReduceOp, prescale: float,
              postscale: float, process_set: ProcessSet,
              groups: Sequence[Sequence[int]] | None = None) -> list[tf.Tensor]:
    """Reduce tensors; each group (indices into tensors) is submitted as one grouped call."""
    if not tensors:
        return []
    groups = groups or [range(len(tensors))]

    def body(*arrays: np.ndarray) -> list[np.ndarray]:
        if len(arrays) == 1:  # the core's single-tensor submit: no group bookkeeping
            out = empty(arrays[0].shape, arrays[0].dtype)
            wait_all([core.allreduce_async(arrays[0], out, names[0], op, prescale,
                                           postscale, "cpu", process_set, waited=True)])
            return [out]
        # A group's results are views of the runtime's block, where the fused reduction
        # ran: given outputs would cost a copy out of the fusion buffer (a group of 16
        # MiB took 1.5x torch's time). A view at a multiple of 64 bytes into the block
        # becomes a tensor without a copy (to_tensor); any other is copied there.
        handles: list[Handle] = []
        order: list[int] = []
        for group in groups:
            handles += core.grouped_allreduce_async(
                [arrays[i] for i in group], [None] * len(group), [names[i] for i in group],
                op, prescale, postscale, "cpu", process_set, waited=True)
            order += group
        results = wait_all(handles)
        outs: list[np.ndarray] = [None] * len(arrays)  # type: ignore[list-item]
        for index, result in zip(order, results):
            outs[index] = result.reshape(arrays[index].shape)
        return outs

    # Not all outputs are aligned (see body): to_tensor checks each.
    outs = run(body, tensors, [t.dtype for t in tensors], "allreduce", aligned=False)
    return _set_shapes(outs, lambda: [t.shape for t in tensors])


def eager_one(tensor: tf.Tensor, submit: Callable[[np.ndarray], Handle]) -> tf.Tensor:
    """One eager tensor through submit(its numpy view) -> a handle whose result is an
    output from empty(), without run's group and graph layers: for the single-tensor
    calls scripts make most, where those layers cost about as much as the collective
    (eager allreduce of 4 KiB: 44 us a call against torch's 23)."""
    array = _host_view(tensor)
    try:
        out = interrupts.wait(submit(array))
    except Exception as exc:
        errors.raise_eager(exc)
    return to_tensor(out, aligned=True)


def allreduce_eager(tensor: tf.Tensor, name: str, op: ReduceOp, prescale: float,
                    postscale: float, process_set: ProcessSet) -> tf.Tensor:
    return eager_one(tensor, lambda array: core.allreduce_async(
        array, empty(array.shape, array.dtype), name, op, prescale, postscale, "cpu",
        process_set, waited=True))


def broadcast_eager(tensor: tf.Tensor, name: str, root_rank: int,
                    process_set: ProcessSet) -> tf.Tensor:
    return eager_one(tensor, lambda array: core.broadcast_async(
        array, empty(array.shape, array.dtype), root_rank, name, "cpu", process_set,
        waited=True))


def allgather_eager(tensor: tf.Tensor, name: str, process_set: ProcessSet) -> tf.Tensor:
    _require_rows(tensor, name, "allgather", "gather along")
    return eager_one(tensor, lambda array: core.grouped_allgather_async(
        [array], [lambda shape: empty(shape, array.dtype)], [name], "cpu", process_set,
        waited=True)[0])


def reducescatter_eager(tensor: tf.Tensor, name: str, op: ReduceOp, prescale: float,
                        postscale: float, process_set: ProcessSet) -> tf.Tensor:
    _require_rows(tensor, name, "reducescatter", "scatter along")
    rank, size = process_set.rank(), process_set.size()
    return eager_one(tensor, lambda array: core.grouped_reducescatter_async(
        [array], [empty(core.reducescatter_shape(array.shape, rank, size), array.dtype)],
        [name], op, prescale, postscale, "cpu", process_set, waited=True)[0])


def _require_rows(tensor: Any, name: str, opname: str, verb: str) -> None:
    if tensor.shape.rank == 0:
        raise ValueError(f"{opname} of tensor '{name}': a 0-dim tensor has no first "
                         f"dimension to {verb}; reshape it to (1,).")


def allgather(tensors: Sequence[Any], names: Sequence[str],
              process_set: ProcessSet) -> list[tf.Tensor]:
    if not tensors:
        return []
    for tensor in tensors:
        _require_rows(tensor, names[0], "allgather", "gather along")

    def body(*arrays: np.ndarray) -> list[np.ndarray]:
        allocators = [lambda shape, dtype=a.dtype: empty(shape, dtype) for a in arrays]
        return wait_all(core.grouped_allgather_async(arrays, allocators, names, "cpu",
                                                     process_set, waited=True))

    outs = run(body, tensors, [t.dtype for t in tensors], "allgather")
    return _set_shapes(outs, lambda: [tf.TensorShape([None]).concatenate(t.shape[1:])
                                      if t.shape.rank is not None else None
                                      for t in tensors])


def broadcast(tensors: Sequence[Any], names: Sequence[str], root_rank: int,
              process_set: ProcessSet) -> list[tf.Tensor]:
    if not tensors:
        return []

    def body(*arrays: np.ndarray) -> list[np.ndarray]:
        return wait_all([core.broadcast_async(a, empty(a.shape, a.dtype), root_rank, name,
                                              "cpu", process_set, waited=True)
                         for a, name in zip(arrays, names)])

    outs = run(body, tensors, [t.dtype for t in tensors], "broadcast")
    return _set_shapes(outs, lambda: [t.shape for t in tensors])


def alltoall(tensor: Any, splits: Any, name: str,
             process_set: ProcessSet) -> tuple[tf.Tensor, tf.Tensor]:
    """(output, received_splits); splits may be None, a list, or an integer tensor."""
    _require_rows(tensor, name, "alltoall", "split")
    split_tensor = None if splits is None or not tf.is_tensor(splits) else splits
    fixed = None if splits is None or split_tensor is not None else [int(s) for s in splits]

    def body(array: np.ndarray, *split_arrays: np.ndarray) -> list[np.ndarray]:
        parts = [int(s) for s in split_arrays[0].reshape(-1)] if split_arrays else fixed
        kept: list[np.ndarray] = []

        def allocate(shape: tuple[int, ...]) -> np.ndarray:
            kept.append(empty(shape, array.dtype))
            return kept[-1]
        out, received = interrupts.wait(core.alltoall_async(array, parts, allocate, name,
                                                            "cpu", process_set))
        return [out, np.asarray(received, np.int32)]

    inputs = [tensor] + ([split_tensor] if split_tensor is not None else [])
    out, received = run(body, inputs, [tensor.dtype, tf.int32], "alltoall", aligned=False)
    rows = tf.TensorShape([None]).concatenate(tensor.shape[1:]) \
        if tensor.shape.rank is not None else None
    return tuple(_set_shapes([out, received], lambda: [rows, [process_set.size()]]))


def reducescatter(tensors: Sequence[Any], names: Sequence[str], op: ReduceOp, prescale: float,
                  postscale: float, process_set: ProcessSet) -> list[tf.Tensor]:
    if not tensors:
        return []
    rank, size = process_set.rank(), process_set.size()
    for tensor, name in zip(tensors, names):
        _require_rows(tensor, name, "reducescatter", "scatter along")

    def body(*arrays: np.ndarray) -> list[np.ndarray]:
        outs = empty_many([core.reducescatter_shape(a.shape, rank, size) for a in arrays],
                          [a.dtype for a in arrays])
        wait_all(core.grouped_reducescatter_async(arrays, outs, names, op, prescale, postscale,
                                                  "cpu", process_set, waited=True))
        return outs

    def static_shape(shape: tf.TensorShape) -> Any:
        if shape.rank is None:
            return None
        rows = shape[0]
        first = core.reducescatter_shape((rows,), rank, size)[0] if rows is not None else None
        return tf.TensorShape([first]).concatenate(shape[1:])

    outs = run(body, tensors, [t.dtype for t in tensors], "reducescatter")
    return _set_shapes(outs, lambda: [static_shape(t.shape) for t in tensors])


def join() -> tf.Tensor:
    """The last rank to join, once every rank has."""
    body = lambda: [np.asarray(interrupts.wait(core.join_async()), np.int32)]  # noqa: E731
    return _set_shapes(run(body, [], [tf.int32], "join", aligned=False), lambda: [[]])[0]


def barrier(process_set: ProcessSet) -> Any:
    """In a tf.compat.v1 graph, the op for a session to run; else None (eagerly done on
    return; inside tf.function run in program order, and a function may not return it)."""
    def body() -> list[np.ndarray]:
        interrupts.wait(core.barrier_async(process_set))
        return []
    built = run(body, [], [], "barrier")
    return built[0] if built and not tf.inside_function() else None
