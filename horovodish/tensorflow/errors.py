"""Horovod's TensorFlow error types for failed collectives, eagerly and in graphs.

Horovod's collectives are TensorFlow ops, so their failures are ``tf.errors.OpError``s
with the code of the core's status: ranks that disagree (shape, dtype, root rank, splits)
give ``FailedPreconditionError``; a bad argument on one rank ``InvalidArgumentError``;
anything else (a shutdown, a lost rank) ``UnknownError``. Scripts and Horovod's own tests
catch those types, so ours match:

- eagerly, the core's ``RankMismatchError`` becomes ``HorovodFailedPreconditionError``
  (a ``FailedPreconditionError`` that is still a ``HorovodInternalError``), and a
  ``ValueError``/``TypeError`` from the call an ``InvalidArgumentError`` that is still
  the Python error it was;
- in a graph (tf.function, ``tf.compat.v1`` sessions) an exception raised by the op's
  Python body reaches TensorFlow as ``UnknownError`` whatever its type (``ValueError``
  and ``TypeError`` excepted: ``InvalidArgumentError``). The one way a Python op body
  can fail with ``FailedPrecondition`` is by returning a non-tensor from
  ``tf.py_function``: TensorFlow then reports "Expected EagerTensor, found PyObject of
  type: <the type's name>". ``graph_failure`` returns such objects, whose type is named
  after the error, so the message still says what differed.
"""
from __future__ import annotations

from typing import Any, NoReturn

import tensorflow as tf

from ..common.api import collectives as core
from ..common.api.process_sets import ProcessSet
from ..common.errors import NotAMemberError, RankMismatchError


class HorovodFailedPreconditionError(tf.errors.FailedPreconditionError, RankMismatchError):
    """Ranks disagreed on a collective: Horovod's error type, and still the core's."""

    def __init__(self, message: str) -> None:
        super().__init__(None, None, message)


class HorovodInvalidArgumentError(tf.errors.InvalidArgumentError, ValueError):
    """A bad argument (root rank, splits, a name in flight) found before anything ran."""

    def __init__(self, message: str) -> None:
        super().__init__(None, None, message)


class HorovodInvalidTypeError(tf.errors.InvalidArgumentError, TypeError):
    """A dtype the op does not allow (bool Average, say): InvalidArgument in a graph too."""

    def __init__(self, message: str) -> None:
        super().__init__(None, None, message)


def raise_eager(exc: BaseException) -> NoReturn:
    """Raise what an eager call raises for exc (eager_error): exc itself, or Horovod's
    type from None, so the traceback ends in the user's call."""
    translated = eager_error(exc)
    if translated is exc:
        raise exc
    raise translated from None


def eager_error(exc: BaseException) -> BaseException:
    """The error an eager call raises for exc, raised by the core or by validation."""
    if isinstance(exc, tf.errors.OpError):
        return exc
    if isinstance(exc, RankMismatchError):
        return HorovodFailedPreconditionError(str(exc))
    if isinstance(exc, ValueError):
        return HorovodInvalidArgumentError(str(exc))
    if isinstance(exc, TypeError):
        return HorovodInvalidTypeError(str(exc))
    return exc


class _Failure:
    """Returned from a tf.py_function body in place of a tensor; passes tf.py_function's
    conversion (``__tf_tensor__``, and ``_copy`` for an op placed on another device) so
    that TensorFlow's kernel itself fails the op with FailedPrecondition."""

    backing_device = None

    def __tf_tensor__(self, dtype: Any = None, name: Any = None) -> "_Failure":
        return self

    def _copy(self) -> "_Failure":
        return self


def graph_failure(message: str, outputs: int) -> list[_Failure]:
    """What a graph op's body returns to fail with FailedPreconditionError(message).
    The message is a type name: TensorFlow prints it after its own "found PyObject of
    type:", so it starts a line of its own with ``HorovodInternalError:``, as the other
    graph-mode failures do (hvd.elastic.run looks for that line)."""
    failure = type(f"\nHorovodInternalError: {message}", (_Failure,), {})
    return [failure() for _ in range(outputs)]


def resolve(process_set: ProcessSet | None) -> ProcessSet:
    """core.resolve, with a set this rank is not in raised as Horovod's ops raise it:
    ``InvalidArgumentError`` (still a ValueError), at the call."""
    try:
        return core.resolve(process_set)
    except NotAMemberError as exc:
        raise HorovodInvalidArgumentError(str(exc)) from None
