"""Horovod's TensorFlow collectives: same names, arguments and semantics, eager or traced.

Floating-point results are differentiable (tf.custom_gradient), with Horovod's gradients:
allreduce -> allreduce with the same op and scale factors; allgather -> the averaged
gradient, this rank's rows; broadcast -> the averaged gradient on the root, zeros
elsewhere; reducescatter -> an allgather (times size for Sum); alltoall -> the reverse
alltoall.
``device_dense``/``device_sparse`` are accepted for compatibility: tensors are staged
through host memory, whatever device they live on.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from ..compat.horovod_paths.common_basics import _basics  # noqa: F401  (Horovod's hvd.mpi_ops._basics)
from ..common import messages as _reduce_ops
from ..compat.horovod_paths.common_util import (gpu_available, get_average_backwards_compatibility_fun,  # noqa: F401
                           num_rank_is_power_2)  # (Horovod's module has them)
from ..common import api
from ..common.compression import Compressor
from ..common.messages import ReduceOp
from ..common.api.process_sets import ProcessSet, global_process_set
from . import ops
from . import errors
from .compression import Compression
from .naming import op_names

from ..common.messages import Adasum, Average, Max, Min, Product, Sum  # noqa: F401
from ..common.messages import resolve_op as _resolve_op

Grads = Callable[[list[tf.Tensor], list[tf.Tensor]], list[Any]]

def public(function: Callable) -> Callable:
    """A public entry point is plain Python to AutoGraph, which would only slow tracing
    down. Marked as AutoGraph's own, AutoGraph calls it as it is, where do_not_convert's
    wrapper cost 1 us on every eager call too."""
    try:
        from tensorflow.python.autograph.impl.api import autograph_artifact
    except ImportError:  # pragma: no cover - a TensorFlow without it
        return tf.autograph.experimental.do_not_convert(function)
    return autograph_artifact(function)


try:  # not type(tf.constant(0)): a tensor at import would fix TF's thread settings
    from tensorflow.python.framework.ops import EagerTensor as _EAGER
except ImportError:  # pragma: no cover - a TensorFlow that moved it: no short path
    _EAGER = None


def _eager_alone(tensor: Any, opname: str) -> bool:
    """An eager tensor in eager code, with no tape or accumulator that could ask for its
    gradient: a single-tensor call then does what _differentiable would, through ops'
    short paths (``ops.eager_one``), without the layers. Not for an eager tensor a
    tf.function captures (the code is not eager there). Checks the dtype, as _tensors."""
    if type(tensor) is not _EAGER or not tf.executing_eagerly() or \
            (tensor.dtype.is_floating and _could_record()):
        return False
    ops.check_dtype(tensor, opname)
    return True


def _tensors(values: Sequence[Any], opname: str) -> list[tf.Tensor]:
    tensors = [v if isinstance(v, tf.Tensor) else tf.convert_to_tensor(v) for v in values]
    for tensor in tensors:
        ops.check_dtype(tensor, opname)
    return tensors


try:
    from tensorflow.python.eager import record as _RECORD  # TF 2.13 and later
except ImportError:  # pragma: no cover - older TensorFlow
    _RECORD = None


def _could_record() -> bool:
    """Whether an eager op now could be recorded by a GradientTape or ForwardAccumulator
    (TensorFlow's own check, internal; where it is missing, assume it could)."""
    return _RECORD is None or _RECORD.could_possibly_record()


def _differentiable(forward: Callable[[list[tf.Tensor]], list[tf.Tensor]], backward: Grads,
                    tensors: list[tf.Tensor]) -> list[tf.Tensor]:
    """forward(xs) -> ys, with backward(dys, xs) -> dxs registered as its gradient.
    Each backward is built from these differentiable collectives in turn, not from the
    raw ops: an outer tape then differentiates the gradient too (a raw op's result is a
    constant to the tape, and second-order gradients came out silently wrong)."""
    if tf.executing_eagerly() and not _could_record():
        # No tape or forward accumulator is active: nothing can ask for this gradient,
        # and tf.custom_gradient's bookkeeping was 3/4 of a small eager allreduce.
        # (Checked first: two calls, where the check below reads every tensor's dtype.)
        return forward(tensors)
    if not any(t.dtype.is_floating for t in tensors):
        return forward(tensors)  # nothing to differentiate; skip the tape bookkeeping

    @tf.custom_gradient
    def apply(*xs: tf.Tensor) -> Any:
        ys = forward(list(xs))

        def grad(*dys: tf.Tensor) -> list[Any]:
            # Upstream gradients may be IndexedSlices (the result fed a gather): densify.
            dys = [tf.zeros_like(y) if d is None else tf.convert_to_tensor(d)
                   for d, y in zip(dys, ys)]
            dxs = backward(list(dys), list(xs))
            return [dx if x.dtype.is_floating else None for dx, x in zip(dxs, xs)]
        return ys, grad
    return list(apply(*tensors))


def _scale(tensors: list[tf.Tensor], factor: float) -> list[tf.Tensor]:
    if factor == 1.0:
        return tensors
    # tf.constant, not tf.cast: a Python float would pass through float32 first.
    return [t * tf.constant(factor, t.dtype) if t.dtype.is_floating else t for t in tensors]


# -- allreduce -----------------------------------------------------------------------------
def _allreduce(tensors: list[tf.Tensor], op: ReduceOp, prescale: float, postscale: float,
               names: list[str], process_set: ProcessSet,
               groups: Sequence[Sequence[int]] | None = None) -> list[tf.Tensor]:
    """ops.allreduce (groups: see there), differentiable to any order."""
    def backward(dys: list[tf.Tensor], _: list[tf.Tensor]) -> list[tf.Tensor]:
        return _allreduce(dys, op, prescale, postscale,
                          op_names(None, dys, "allreduce.grad", process_set), process_set)
    return _differentiable(lambda xs: ops.allreduce(xs, names, op, prescale, postscale,
                                                    process_set, groups), backward, tensors)


def _sparse_allreduce(slices: tf.IndexedSlices, op: ReduceOp, prescale: float,
                      postscale: float, name: str | None,
                      process_set: ProcessSet) -> tf.IndexedSlices:
    """Allgather of values and indices: duplicates add up when the slices are applied.
    Average divides the values by the number of ranks as Horovod does, with TensorFlow's
    true division: integer values come back floating (uint8 as float32, int32 as
    float64). Scale factors are for DistributedGradientTape's predivide factor only (the
    public allreduce refuses them for IndexedSlices, as Horovod's does)."""
    if op not in (Sum, Average):
        raise NotImplementedError(
            f"allreduce of IndexedSlices '{name or 'unnamed'}': only Sum and Average are "
            f"defined for sparse gradients, not {op.name.capitalize()}; pass "
            "sparse_as_dense=True or convert with tf.convert_to_tensor.")
    names = [f"{name}.values", f"{name}.indices"] if name else None
    values, indices = grouped_allgather([slices.values, slices.indices], name=None,
                                        process_set=process_set, _names=names)
    values = _scale([values], prescale * postscale)[0]
    if op == Average:
        values = values / tf.constant(process_set.size(), values.dtype)
    return tf.IndexedSlices(values, indices, slices.dense_shape)


def _refuse_sparse_scaling(prescale: float, postscale: float, name: str | None) -> None:
    if prescale != 1.0 or postscale != 1.0:
        raise NotImplementedError(
            f"allreduce of IndexedSlices '{name or 'unnamed'}': prescale_factor and "
            "postscale_factor are not supported for IndexedSlices (as in Horovod); scale "
            "the values yourself, or pass sparse_as_dense=True.")


@public
def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "",
              device_sparse: str = "", compression: Compressor = Compression.none,
              op: ReduceOp | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: str | None = None,
              process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> Any:
    """Reduce a tensor (or tf.IndexedSlices) across ranks; Average unless op says otherwise.
    (``ignore_name_scope``, here and below: names never take the name scope anyway.)"""
    op = _resolve_op(average, op)
    process_set = errors.resolve(process_set)
    if compression is Compression.none and _eager_alone(tensor, "allreduce"):
        return ops.allreduce_eager(tensor, op_names(name, (tensor,), "allreduce",
                                                    process_set)[0],
                                   op, prescale_factor, postscale_factor, process_set)
    if isinstance(tensor, tf.IndexedSlices):
        if op in (Sum, Average):
            _refuse_sparse_scaling(prescale_factor, postscale_factor, name)
        return _sparse_allreduce(tensor, op, prescale_factor, postscale_factor, name,
                                 process_set)
    compressed, ctx = compression.compress(_tensors([tensor], "allreduce")[0])
    reduced = _allreduce([compressed], op, prescale_factor, postscale_factor,
                         op_names(name, [compressed], "allreduce", process_set), process_set)
    return compression.decompress(reduced[0], ctx)


@public
def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression: Compressor = Compression.none, op: ReduceOp | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set,
                      name: str | None = None, ignore_name_scope: bool = False) -> list[Any]:
    """Reduce several tensors in one submission, so they fuse into few collectives."""
    op = _resolve_op(average, op)
    process_set = errors.resolve(process_set)
    # An eager tensor's exact type first: isinstance against IndexedSlices goes through
    # ABC machinery, twice per tensor of a gradient list.
    sparse = [type(t) is not _EAGER and isinstance(t, tf.IndexedSlices) for t in tensors]
    if not any(sparse) and compression is Compression.none:  # the common case, one pass
        return _allreduce(_tensors(tensors, "grouped_allreduce"), op, prescale_factor,
                          postscale_factor, op_names(name, tensors, "allreduce", process_set),
                          process_set)
    dense = [i for i, is_sparse in enumerate(sparse) if not is_sparse]
    results: list[Any] = list(tensors)
    for i, tensor in enumerate(tensors):
        if sparse[i]:
            if op in (Sum, Average):
                _refuse_sparse_scaling(prescale_factor, postscale_factor, name)
            results[i] = _sparse_allreduce(tensor, op, prescale_factor, postscale_factor,
                                           f"{name}.{i}" if name else None, process_set)
    packed = [compression.compress(t) for t in _tensors([tensors[i] for i in dense],
                                                         "grouped_allreduce")]
    names = op_names(name, tensors, "allreduce", process_set)
    reduced = _allreduce([p[0] for p in packed], op, prescale_factor, postscale_factor,
                         [names[i] for i in dense], process_set)
    for i, out, (_, ctx) in zip(dense, reduced, packed):
        results[i] = compression.decompress(out, ctx)
    return results


# -- allgather -----------------------------------------------------------------------------
@public
def grouped_allgather(tensors: Sequence[Any], name: str | None = None,
                      process_set: ProcessSet = global_process_set,
                      _names: list[str] | None = None,
                      ignore_name_scope: bool = False) -> list[tf.Tensor]:
    process_set = errors.resolve(process_set)
    tensors = _tensors(tensors, "allgather")
    names = _names or op_names(name, tensors, "allgather", process_set)

    def backward(dys: list[tf.Tensor], xs: list[tf.Tensor]) -> list[tf.Tensor]:
        reduced = _allreduce(dys, Average, 1.0, 1.0,
                             op_names(None, dys, "allgather.grad", process_set), process_set)
        firsts = [tf.shape(x, out_type=tf.int64)[:1] for x in xs]
        dims = ops.allgather(firsts, op_names(None, firsts, "allgather.grad_dims",
                                              process_set), process_set)
        rank = process_set.rank()
        return [g[tf.reduce_sum(d[:rank]):tf.reduce_sum(d[:rank + 1])]
                for g, d in zip(reduced, dims)]
    return _differentiable(lambda xs: ops.allgather(xs, names, process_set), backward, tensors)


@public
def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenate every rank's tensor along the first dimension (sizes may differ)."""
    if _eager_alone(tensor, "allgather"):
        process_set = errors.resolve(process_set)
        return ops.allgather_eager(tensor, op_names(name, (tensor,), "allgather",
                                                    process_set)[0], process_set)
    return grouped_allgather([tensor], name, process_set)[0]


# -- broadcast -----------------------------------------------------------------------------
def _broadcast(tensors: list[tf.Tensor], root_rank: int, names: list[str],
               process_set: ProcessSet) -> list[tf.Tensor]:
    def backward(dys: list[tf.Tensor], _: list[tf.Tensor]) -> list[tf.Tensor]:
        reduced = _allreduce(dys, Average, 1.0, 1.0,
                             op_names(None, dys, "broadcast.grad", process_set), process_set)
        if api.rank() == root_rank:
            return reduced
        # Zeros that still depend on the allreduce: in a graph, tf.zeros_like of a static
        # shape is a constant, so a session fetching this gradient skipped the allreduce
        # (and the collectives chained before it) on non-root ranks only, and the root
        # waited for good.
        with tf.control_dependencies(reduced):
            return [tf.zeros_like(g) for g in reduced]
    return _differentiable(lambda xs: ops.broadcast(xs, names, root_rank, process_set),
                           backward, tensors)


@public
def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """root_rank's tensor on every rank (root_rank is a world rank)."""
    process_set = errors.resolve(process_set)
    if _eager_alone(tensor, "broadcast"):
        return ops.broadcast_eager(tensor, op_names(name, (tensor,), "broadcast",
                                                    process_set)[0], root_rank, process_set)
    tensors = _tensors([tensor], "broadcast")
    return _broadcast(tensors, root_rank, op_names(name, tensors, "broadcast", process_set),
                      process_set)[0]


@public
def broadcast_(variables: Sequence[Any], root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> list[Any]:
    """In place: assign root_rank's values to the variables (tf.Variable, a tf.compat.v1
    RefVariable or keras.Variable); returns their new values, as Horovod does. In a graph
    the assignments happen when a session runs those values."""
    process_set = errors.resolve(process_set)
    variables = list(variables)
    values = _tensors(variables, "broadcast_")
    names = op_names(name, values, "broadcast", process_set)
    results = []
    for variable, value in zip(variables, ops.broadcast(values, names, root_rank, process_set)):
        assigned = variable.assign(value)  # in a graph: the value once assigned
        results.append(tf.convert_to_tensor(variable) if tf.executing_eagerly()
                       else tf.identity(assigned))
    return results


# -- alltoall ------------------------------------------------------------------------------
@public
def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send splits[i] rows to rank i. With splits, returns (output, received_splits)."""
    process_set = errors.resolve(process_set)
    tensors = _tensors([tensor], "alltoall")
    op_name = op_names(name, tensors, "alltoall", process_set)[0]
    received: list[tf.Tensor] = []

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        out, got = ops.alltoall(xs[0], splits, op_name, process_set)
        received.append(got)
        return [out]

    def backward(dys: list[tf.Tensor], _: list[tf.Tensor]) -> list[tf.Tensor]:
        # Back along the received splits, also without splits given: ranks whose first
        # dimensions differ receive row counts their size need not divide.
        return [alltoall(dys[0], received[0], op_names(None, dys, "alltoall.grad",
                                                       process_set)[0],
                         process_set=process_set)[0]]
    output = _differentiable(forward, backward, tensors)[0]
    return output if splits is None else (output, received[0])


# -- reducescatter -------------------------------------------------------------------------
@public
def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: Compressor = Compression.none, op: ReduceOp = Average,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          name: str | None = None,
                          ignore_name_scope: bool = False) -> list[tf.Tensor]:
    """Reduce across ranks, keep this rank's rows (low ranks get the extra ones)."""
    op = ReduceOp(op)
    process_set = errors.resolve(process_set)
    packed = [compression.compress(t) for t in _tensors(tensors, "reducescatter")]
    inputs = [p[0] for p in packed]
    names = op_names(name, inputs, "reducescatter", process_set)
    # Horovod's gradient: the allgather of the upstream gradients, times size for Sum (so
    # size times the exact gradient of the ranks' summed losses, for Sum and Average alike).
    factor = prescale_factor * postscale_factor * (process_set.size() if op == Sum else 1)

    def backward(dys: list[tf.Tensor], _: list[tf.Tensor]) -> list[tf.Tensor]:
        gathered = grouped_allgather(dys, process_set=process_set, _names=op_names(
            None, dys, "reducescatter.grad", process_set))
        return _scale(gathered, factor)
    outs = _differentiable(lambda xs: ops.reducescatter(xs, names, op, prescale_factor,
                                                        postscale_factor, process_set),
                           backward, inputs)
    return [compression.decompress(o, p[1]) for o, p in zip(outs, packed)]


@public
def reducescatter(tensor: Any, device_dense: str = "", compression: Compressor = Compression.none,
                  op: ReduceOp = Average, name: str | None = None,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0, ignore_name_scope: bool = False) -> tf.Tensor:
    if compression is Compression.none and _eager_alone(tensor, "reducescatter"):
        process_set = errors.resolve(process_set)
        return ops.reducescatter_eager(
            tensor, op_names(name, (tensor,), "reducescatter", process_set)[0], ReduceOp(op),
            prescale_factor, postscale_factor, process_set)
    return grouped_reducescatter([tensor], device_dense, compression, op, process_set,
                                 prescale_factor, postscale_factor, name)[0]


# -- synchronization -----------------------------------------------------------------------
@public
def join() -> tf.Tensor:
    """Signal that this rank has no more data; the others' allreduces continue with this
    rank contributing zeros. Returns the rank that joined last, once all have joined."""
    api.state()
    return ops.join()


@public
def barrier(process_set: ProcessSet = global_process_set) -> Any:
    """Block until every rank (of the set) reaches the barrier. In a tf.compat.v1 graph
    this returns the op, which waits when a session runs it (as Horovod's does)."""
    return ops.barrier(errors.resolve(process_set))


# Horovod's module-level helpers: average= or op= to the op a call means; Adasum's old
# rank-count check.
handle_average_backwards_compatibility = get_average_backwards_compatibility_fun(_reduce_ops)
check_num_rank_power_of_2 = num_rank_is_power_2
