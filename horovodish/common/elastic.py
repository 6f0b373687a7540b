"""Elastic training, the framework-neutral part: the State protocol and the retrying ``run``.

Each adapter (``horovodish.torch.elastic``, ``horovodish.tensorflow.elastic``) adds the
states that know its models and optimizers, and says which exceptions mean that a
collective failed: eagerly that is ``HorovodInternalError`` everywhere, but TensorFlow
reports an error raised inside ``tf.function`` as a ``tf.errors.OpError`` carrying only
the message, so its ``run`` passes ``is_failure``.

Two ways a job recovers, composed (docs/elastic.md):

* **In the same processes** (any launch): a collective fails while every process is
  alive and stays (a mismatch, a stall shutdown; not another rank's shutdown, whose
  process is ending: that error propagates). ``run`` restores the last commit from memory,
  re-initializes horovodish, syncs and calls the function again.
* **In a new job** (``horovodishrun --min-np ...``, ``torchrun --max-restarts N``): a
  rank or a host is lost, so the job ends (under torchrun, torchrun starts the group
  again), or the launcher found new hosts and the ranks stopped at a commit
  (``HostsUpdatedInterrupt``). Every commit was written to disk on every host
  (``elastic_store``); the new job's first ``sync`` agrees on the newest commit some rank
  can read and broadcasts it from that rank.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import logging
import shutil
import sys
from typing import Any, Callable

import numpy as np

from . import elastic_store
from .api import collectives, lifecycle, objects, process_state
from .errors import HorovodInternalError, HostsUpdatedInterrupt
from .messages import ReduceOp
from .runtime import launcher_link

__all__ = ["ObjectState", "State", "run"]

log = logging.getLogger("horovodish")


class State:
    """Base: reset callbacks and the commit protocol, independent of the framework.

    Subclasses define save/restore (the restore point in memory), ``_sync_from(root)``
    (make every rank's state root's), and for commits on disk ``_payload()`` (the
    restore point as picklable data, large arrays as numpy) and ``_load_payload``."""

    def __init__(self, **kwargs: Any) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self._known = dict(kwargs)
        # The newest commit this process holds (0: none); commits are collective, so
        # every rank counts alike, and a restarted job goes on counting from the commit
        # it resumed.
        self._commit_seq = 0
        for key, value in kwargs.items():
            setattr(self, key, value)

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save a restore point (call it every few batches; collective). Under the
        elastic launcher it is also written to disk on every host before any rank
        returns, and raises HostsUpdatedInterrupt on every rank when hosts were added."""
        self.save()
        self._commit_seq += 1
        self._persist()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Under the elastic launcher, rank 0 asks it whether the hosts changed and
        every rank learns the answer in one small allreduce, which also waits for every
        host's write of this commit; raises HostsUpdatedInterrupt on every rank if so."""
        if not launcher_link.enabled() or not process_state.is_initialized():
            return
        changed = np.zeros(1, dtype=np.int32)
        if process_state.rank() == 0:
            try:
                answer = launcher_link.request({"kind": "commit", "seq": self._commit_seq})
            except OSError as exc:  # the launcher is gone: nothing can restart us anyway
                log.warning("elastic: cannot reach the launcher at commit %d: %s",
                            self._commit_seq, exc)
                answer = None
            changed[0] = bool(answer and answer.get("hosts_changed"))
        collectives.allreduce_async(changed, changed, "elastic.commit", ReduceOp.MAX).wait()
        if changed[0]:
            raise HostsUpdatedInterrupt(
                f"the launcher has a new set of hosts; commit {self._commit_seq} is saved "
                "and the job restarts on them")

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        """Make every rank's state the same (collective): rank 0's, or, in a job the
        elastic launcher restarted, the newest commit that any rank can read."""
        self._sync_from(self._recover())

    def _sync_from(self, root: int) -> None:
        raise NotImplementedError

    def _payload(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} cannot be committed to disk")

    def _load_payload(self, payload: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot be read from disk")

    def _persist(self) -> None:
        """Write the commit on this host if this rank is its first (local rank 0)."""
        folder = elastic_store.directory()
        if folder is None or (process_state.is_initialized()
                              and process_state.local_rank() != 0):
            return
        elastic_store.write(folder, self._commit_seq,
                            {"seq": self._commit_seq, "state": self._payload()})

    def _recover(self) -> int:
        """Agree on the newest commit any rank holds (in memory or on its host's disk),
        load it on the lowest rank that holds it, and return that rank: the root to
        sync from. Without the elastic launcher: rank 0, with no collective."""
        folder = elastic_store.directory()
        if folder is None or not process_state.is_initialized():
            return 0
        on_disk = elastic_store.newest(folder)
        held = objects.allgather_object(max(self._commit_seq, on_disk),
                                        name="elastic.newest_commit")
        best = max(held)
        root = held.index(best)
        if process_state.rank() == root and self._commit_seq < best:
            self._load_payload(elastic_store.read(folder, best)["state"])
            self.restore()
            log.info("elastic: resuming from commit %d (read on rank %d from %s)",
                     best, root, folder)
        self._commit_seq = best
        return root


class ObjectState(State):
    """Plain picklable attributes (epoch, batch, ...): deep-copied on save, replaced on
    restore, the root's by ``broadcast_object`` on sync. Subclasses add their framework's
    members by extending save/restore/_sync_from/_payload/_load_payload."""

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

    def _sync_from(self, root: int) -> None:
        """Make every rank's attributes root's, and that the restore point."""
        for key, value in objects.broadcast_object(self._attributes(), root).items():
            setattr(self, key, value)
        self.save()

    def _payload(self) -> Any:
        return {"attributes": self._saved}

    def _load_payload(self, payload: Any) -> None:
        self._saved = payload["attributes"]


def _is_internal_error(exc: BaseException) -> bool:
    return isinstance(exc, HorovodInternalError)


def _a_rank_left() -> bool:
    """Whether the failure came from another rank's shutdown (its script ended or
    failed): its process is going, so a retry here would wait for it in init() for ever.
    Then the error propagates: under the elastic launcher the job starts again."""
    current = process_state.current()
    return current is not None and bool(current.runtime.ranks_left)


def _forget_commits() -> None:
    """The job is done: remove its commits where nobody else will (under torchrun),
    once no rank can still be reading one."""
    folder = elastic_store.directory()
    if folder is None or not elastic_store.is_job_owned(folder) or \
            not process_state.is_initialized():
        return
    objects.allgather_object(None, name="elastic.done")
    if process_state.local_rank() == 0:
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            folder.parent.rmdir()  # the run's folder, once every host's is gone


def _reset() -> None:
    lifecycle.shutdown()
    lifecycle.init()


def _leave_for_restart(interrupt: HostsUpdatedInterrupt) -> None:
    """MPI cannot grow a running job: every rank ends this one cleanly (its commit is on
    disk) and the launcher starts the next on the new hosts."""
    if process_state.is_initialized() and process_state.rank() == 0:
        sys.stderr.write(f"horovodish: {interrupt}\n")
    lifecycle.shutdown()
    sys.exit(0)


def run(func: Callable[..., Any],
        is_failure: Callable[[BaseException], bool] = _is_internal_error) -> Callable[..., Any]:
    """Retry func(state, ...) from the last commit after a failed collective.

    Before every attempt the state is synced (from rank 0, or from the newest commit on
    disk in a job the elastic launcher restarted). When ``is_failure(exc)`` (by default:
    exc is a HorovodInternalError), the state is restored to its last commit, horovodish
    is shut down and re-initialized, the reset callbacks run, and func is called again.
    A HostsUpdatedInterrupt from a commit under the elastic launcher ends the process
    (exit 0) so that the launcher restarts the job on the new hosts. Any other exception
    propagates.
    """
    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        skip_sync = False
        while True:
            try:  # a sync that fails (a peer lost meanwhile) is retried too
                if not skip_sync:
                    state.sync()
                result = func(state, *args, **kwargs)
                _forget_commits()
                return result
            except HostsUpdatedInterrupt as interrupt:
                if launcher_link.enabled():
                    _leave_for_restart(interrupt)
                skip_sync = bool(getattr(interrupt, "skip_sync", False))
            except Exception as exc:  # noqa: BLE001 - re-raised unless a failed collective
                if not is_failure(exc) or _a_rank_left():
                    raise
                state.restore()
                skip_sync = False
            _reset()
            state.on_reset()
    return wrapper
