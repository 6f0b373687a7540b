"""Ending a multi-host job whose host dropped off the network.

Why: when a host's link dies, nothing fails. MPI's TCP connections to it wait out TCP's
retransmission timeout (many minutes), a collective waits for the lost ranks forever, and
Hydra's control connections are as silent as its data. A rank that dies is different
(its proxy sees it and mpirun ends the job); a lost host must be noticed by someone.

Here the first rank of each host (local rank 0) sends a tiny message every few seconds
to the first ranks of its neighbouring hosts in a ring of hosts, over its own
communicator and from its own thread, and expects theirs. When nothing has arrived from
a neighbour for ``timeout`` seconds (HOROVODISH_HEARTBEAT_TIMEOUT, default 30; 0 turns
it off), it logs which host and ranks it lost and aborts the job: mpirun ends what it
can reach, and the hosts on the far side of the dead link, hearing nothing either, abort
their own side. There mpirun cannot be reached, so the aborting rank first ends the
other ranks of its own host itself (their pids were shared at start): a rank left
behind spun in a shared-memory barrier for its dead neighbour for good. A host busy computing, or ranks stalled in negotiation, still answer:
the thread needs no collective, only the network. Each host watches two neighbours, so
the cost per host stays constant whatever the number of hosts.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from . import launcher_link

log = logging.getLogger("horovodish")

_TAG = 7377
# Between writing why the job ends and MPI_Abort: the abort tears down the launcher's
# output forwarding, and a message still in a proxy's pipe is lost with it (the
# emulated cluster's link test lost every line in about one job in five).
_DRAIN_SECONDS = 1.0


class HostWatchdog:
    """Heartbeats between the first ranks of neighbouring hosts; see the module docstring.

    Build with ``start`` (collective over comm); ``stop`` on shutdown."""

    def __init__(self, leaders: MPI.Comm, hosts: list[tuple[str, list[int]]],
                 timeout: float, host_pids: Sequence[int] = ()) -> None:
        """host_pids: the processes of the other ranks on this host (see _abort)."""
        self.comm = leaders
        self.host_pids = [pid for pid in host_pids if pid != os.getpid()]
        self.hosts = hosts  # per leader rank: (hostname, world ranks on that host)
        self.timeout = timeout
        self.interval = min(5.0, max(0.2, timeout / 6))
        me, count = leaders.Get_rank(), leaders.Get_size()
        self.neighbours = sorted({(me - 1) % count, (me + 1) % count} - {me})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="horovodish-heartbeat",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, comm: MPI.Comm, local: MPI.Comm, timeout: float) -> "HostWatchdog | None":
        """Collective over comm: a watchdog on each host's first rank when the job spans
        hosts and timeout > 0; None elsewhere."""
        if timeout <= 0:
            return None
        rank = comm.Get_rank()
        first = local.Get_rank() == 0
        leader = local.bcast(rank, root=0)  # names this rank's host in the job
        host_pids = local.allgather(os.getpid())
        where = comm.allgather((socket.gethostname(), leader, rank))
        leaders = sorted({lead for _, lead, _ in where})
        if len(leaders) < 2:
            return None
        comm_of_leaders = comm.Split(0 if first else MPI.UNDEFINED, key=rank)
        if not first:
            return None
        hosts = [(where[lead][0], [r for _, of, r in where if of == lead]) for lead in leaders]
        leaders = comm_of_leaders
        return cls(leaders, hosts, timeout, host_pids)

    def _run(self) -> None:
        comm, beat = self.comm, np.zeros(1, dtype=np.uint8)
        inbox = {n: np.zeros(1, dtype=np.uint8) for n in self.neighbours}
        receives = {n: comm.Irecv(inbox[n], source=n, tag=_TAG) for n in self.neighbours}
        sends: dict[int, Any] = {}
        heard = {n: time.monotonic() for n in self.neighbours}
        try:
            while not self._stop.wait(self.interval):
                now = time.monotonic()
                for n in self.neighbours:
                    while receives[n].Test():
                        heard[n] = now
                        receives[n] = comm.Irecv(inbox[n], source=n, tag=_TAG)
                    if n not in sends or sends[n].Test():  # one in flight per neighbour
                        sends[n] = comm.Isend(beat, dest=n, tag=_TAG)
                lost = [n for n in self.neighbours if now - heard[n] > self.timeout]
                if lost:
                    self._abort(lost, now - min(heard[n] for n in lost))
        finally:
            for request in receives.values():
                request.Cancel()
                request.Wait()

    def _abort(self, lost: list[int], silent: float) -> None:
        names = "; ".join(f"host {self.hosts[n][0]} (ranks "
                          f"{', '.join(map(str, self.hosts[n][1]))})" for n in lost)
        message = (f"horovodish: lost contact with {names}: nothing heard from it for "
                   f"{silent:.0f} s (HOROVODISH_HEARTBEAT_TIMEOUT={self.timeout:g}); its "
                   "link or the host is down. Ending the job.")
        log.error(message)
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        # The elastic launcher drops the lost host before it starts the job again.
        launcher_link.notify({"kind": "lost", "text": message,
                              "ranks": [r for n in lost for r in self.hosts[n][1]]})
        time.sleep(_DRAIN_SECONDS)
        for pid in self.host_pids:  # mpirun may be out of reach: this host's ranks end here
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass  # gone already
        try:
            MPI.COMM_WORLD.Abort(1)
        finally:
            os._exit(1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.interval + 1)
        if not self._thread.is_alive():
            self.comm.Free()
