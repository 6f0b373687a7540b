"""What the runtime does when a cycle fails midway: stop, fail what is pending, and
end the job, after a grace period in which each rank's script can report the error.

Mixed into ``Runtime`` (thread.py). A failed cycle cannot be taken back: other ranks may
be inside a collective this rank will never join, so ending the job is the only way
that none of them waits forever.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from ..peer_wait import PeersNotAnswering

log = logging.getLogger("horovodish")


class FaultPolicy:
    """How a failed cycle ends the runtime and the job (see the module's docstring)."""

    # Runtime's.
    _lock: threading.Lock
    _stopped: bool
    _stop_reason: str
    failed: bool
    controller: Any
    executor: Any

    def _fail(self, exc: BaseException) -> None:
        """A cycle failed midway: stop, failing what is pending, and end the job. Other
        ranks may be inside a collective this rank will never join (a data allreduce
        after the negotiation that agreed on it), and MPI cannot take a collective back:
        they, and this rank's own MPI_Finalize, would wait forever. So the job is
        aborted once this rank's script had the grace period to report the error, or
        at once when it shuts down (``shutdown`` in api/lifecycle.py)."""
        if isinstance(exc, PeersNotAnswering):  # a stall, not a fault of this rank
            with self._lock:
                first = not self._stopped
            if first:
                self._stop_reason = f" by the stall inspector: {exc}"
                exc.end_local_ranks()
                self._end_job_after_grace()
                self._end(self._stop_reason)
            return
        with self._lock:
            first = not self._stopped
            self.failed = self.failed or first  # (not when it had stopped cleanly)
        self._end(f" after an internal error: {exc!r}")
        if first and self.controller.size > 1:
            self._end_job_after_grace()

    def _end_job_after_grace(self, grace: float = 5.0) -> None:
        """A stall shutdown or an internal error ends the job: pending handles fail now
        (so scripts can report and exit); a rank still running after the grace period is
        aborted, so no rank that never calls another collective can keep the job alive."""
        reason = self._stop_reason.strip()
        log.error("shutting down: %s", reason)
        try:  # device work queued for a lost peer ends now (pending handles failed above)
            self.executor.abort(self._stop_reason)
        except Exception as exc:  # noqa: BLE001 (the job ends anyway)
            log.error("aborting device communication failed: %r", exc)

        def abort() -> None:
            from mpi4py import MPI
            log.error("aborting the job %g s after horovodish shut down %s", grace, reason)
            MPI.COMM_WORLD.Abort(1)
        timer = threading.Timer(grace, abort)
        timer.daemon = True
        timer.start()
