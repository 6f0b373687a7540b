"""MPI set-ups a test may ask a worker for that the test machine does not have, named in
the environment and applied by ``apply`` (tests/worker_support.py calls it on import,
so before the worker's ``init()``):

- ``HOROVODISH_TEST_MPI_VERSION=3.1``: MPI reports that version, as Open MPI 4.x does;
  the negotiation transport then takes its fallback for an MPI without persistent
  collectives (an Iallreduce a cycle, on a communicator of its own).
- ``HOROVODISH_TEST_NO_SHM_EXCHANGE=1``: no shared-memory exchange for the negotiation,
  as if every rank were on a host of its own; eager cycles' data then travels in MPI's
  allgather with the bit vector (negotiation/mpi_transport.py).
- ``HOROVODISH_TEST_HOSTS=N``: the two-level allreduce's topology takes the ranks for N
  hosts of equal size (consecutive ranks share one), though they share one machine:
  so a machine with one GPU checks the hierarchical allreduce of CUDA tensors staged
  through the host (tests/gpu) without emulated hosts' namespaces.
"""
from __future__ import annotations

from collections.abc import Mapping

MPI_VERSION = "HOROVODISH_TEST_MPI_VERSION"
NO_SHM_EXCHANGE = "HOROVODISH_TEST_NO_SHM_EXCHANGE"
HOSTS = "HOROVODISH_TEST_HOSTS"


def apply(environ: Mapping[str, str]) -> None:
    """Apply every variant that environ names; none named, nothing is imported."""
    if environ.get(MPI_VERSION):
        from mpi4py import MPI
        version = tuple(int(part) for part in environ[MPI_VERSION].split("."))
        MPI.Get_version = lambda: version
    if environ.get(NO_SHM_EXCHANGE):
        from horovodish.common.negotiation import shm_exchange
        shm_exchange.ShmExchange.open = classmethod(lambda cls, *args: None)
    if environ.get(HOSTS):
        from horovodish.common.execution.backends import hierarchical
        hosts = int(environ[HOSTS])

        def emulated_host(comm):
            rank, size = comm.Get_rank(), comm.Get_size()
            return comm.Split(rank // -(-size // hosts), key=rank)
        hierarchical.host_communicator = emulated_host
