"""The negotiation's MPI transport on an MPI without persistent collectives (Open MPI
4.x: Allreduce_init raises NotImplementedError), found on the GPU machine: the runtime
died at its first cycle with two or more ranks there."""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from horovodish.common.negotiation.mpi_transport import MPITransport


class _Mpi3Comm:
    """COMM_SELF as an MPI-3 library shows it: no Allreduce_init."""

    def __init__(self) -> None:
        self.posted = 0

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 1

    def Allreduce_init(self, *args, **kwargs):
        raise NotImplementedError

    def Iallreduce(self, send, recv, op):
        self.posted += 1
        return MPI.COMM_SELF.Iallreduce(send, recv, op=op)

    def Dup(self) -> "_Mpi3Comm":
        """Negotiation then runs on a communicator of its own: here, this one."""
        self.dups = getattr(self, "dups", 0) + 1
        return self

    def Free(self) -> None:
        self.freed = True


def test_negotiation_falls_back_to_iallreduce_without_persistent_collectives():
    comm = _Mpi3Comm()
    transport = MPITransport(comm)
    transport.size = 2  # past the one-rank short cut: the MPI path is the one under test
    for cycle in range(3):
        words = np.array([cycle, 2 ** 63 + cycle, 7], dtype=np.uint64)
        pending = transport.start_allreduce_and(words)
        assert pending.wait()
        np.testing.assert_array_equal(pending.result(), words)
    assert comm.posted == 3  # one Iallreduce a cycle
    assert comm.dups == 1  # on a communicator of its own, made once
    transport.close()
    assert comm.freed
