"""Elastic training, the framework-neutral part: the State protocol and the retrying ``run``.

Each adapter (``horovodish.torch.elastic``, ``horovodish.tensorflow.elastic``) adds the
states that know its models and optimizers, and says which exceptions mean that a
collective failed: eagerly that is ``HorovodInternalError`` everywhere, but TensorFlow
reports an error raised inside ``tf.function`` as a ``tf.errors.OpError`` carrying only
the message, so its ``run`` passes ``is_failure``.

Hosts never change (there is no elastic launcher), so ``check_host_updates`` never
interrupts; a failed collective is what ``run`` recovers from.
"""
from __future__ import annotations

import copy
import functools
from typing import Any, Callable

from .api import lifecycle, objects
from .errors import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["ObjectState", "State", "run"]


class State:
    """Base: reset callbacks and the commit protocol, independent of the framework."""

    def __init__(self, **kwargs: Any) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self._known = dict(kwargs)
        for key, value in kwargs.items():
            setattr(self, key, value)

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save a restore point (call it every few batches)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Hosts never change without an elastic launcher; nothing to do yet."""

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """Plain picklable attributes (epoch, batch, ...): deep-copied on save, replaced on
    restore, rank 0's by ``broadcast_object`` on sync. Subclasses add their framework's
    members by extending save/restore/sync."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._saved: dict[str, Any] = {}

    def _attributes(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self._known}

    def save(self) -> None:
        self._saved = copy.deepcopy(self._attributes())

    def restore(self) -> None:
        for key, value in copy.deepcopy(self._saved).items():
            setattr(self, key, value)

    def sync(self) -> None:
        """Make every rank's attributes rank 0's, and that the restore point."""
        for key, value in objects.broadcast_object(self._attributes(), 0).items():
            setattr(self, key, value)
        self.save()


def _is_internal_error(exc: BaseException) -> bool:
    return isinstance(exc, HorovodInternalError)


def _reset() -> None:
    lifecycle.shutdown()
    lifecycle.init()


def run(func: Callable[..., Any],
        is_failure: Callable[[BaseException], bool] = _is_internal_error) -> Callable[..., Any]:
    """Retry func(state, ...) from the last commit after a failed collective.

    Before every attempt the state is synced from rank 0. When ``is_failure(exc)`` (by
    default: exc is a HorovodInternalError), the state is restored to its last commit,
    horovodish is shut down and re-initialized, the reset callbacks run, and func is
    called again. Any other exception propagates.
    """
    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        skip_sync = False
        while True:
            try:  # a sync that fails (a peer lost meanwhile) is retried too
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = bool(getattr(interrupt, "skip_sync", False))
            except Exception as exc:  # noqa: BLE001 - re-raised unless a failed collective
                if not is_failure(exc):
                    raise
                state.restore()
                skip_sync = False
            _reset()
            state.on_reset()
    return wrapper
