"""Allreduce in two levels across hosts: shared memory inside each host, the network
only between hosts, each rank carrying a 1/local_size slice of the data across.

Per piece of the fused group (as the shared-memory backend cuts them):

  1. every rank packs its inputs into its segment of the host's shared memory; each
     reduces its slice (1/local_size of the piece) across the host's segments
     (a reduce-scatter inside the host, no message);
  2. it allreduces that slice with the ranks of the same local rank on the other hosts
     (the cross communicator: a ring for large slices, MPI for small ones);
  3. every rank copies the whole reduced piece out of shared memory (the allgather
     inside the host, again no message).

Between H hosts each host then sends 2(H-1)/H of the buffer, the minimum for an
allreduce, where a flat ring over all p ranks sends 2(p-1)/p of it (1.5x the minimum on
2 hosts of 2 ranks); docs/scaling.md has the model, docs/tuning.md the figures. It needs
every host to run the same number of ranks (each slice then has one partner per host)
and more than one rank on a host; otherwise it is never chosen, and the flat backends
run. Asked for (HOROVODISH_HIERARCHICAL_ALLGATHER), it runs allgathers in two levels too.
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
from mpi4py import MPI

from ...dtypes import MPI_REDUCIBLE, known_dtype_name
from ...messages import ReduceOp, RequestType
from ...peer_wait import Patience
from .mpi import MPIBackend
from .ring import RingBackend
from .shm import SharedMemoryBackend

log = logging.getLogger("horovodish")

# Below this (the whole group) the flat MPI allreduce wins: two barriers and a cross
# allreduce of a slice cost more than MPI's latency-bound small-message path
# (docs/tuning.md, the small-tensor burst across hosts).
HIERARCHICAL_THRESHOLD = 256 << 10
# Per rank's segment half: larger than on one host so that each piece's slice crosses
# the network in few, large messages.
PIECE_BYTES = 8 << 20
# Slices below this cross the network through MPI's allreduce, above through the ring.
CROSS_RING_BYTES = 256 << 10


def host_communicator(comm: MPI.Comm) -> MPI.Comm:
    """The ranks of comm on this rank's host, in rank order (MPI's shared-memory split).
    Collective over comm."""
    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())


class Topology:
    """Where the ranks of a communicator sit: the communicators of this rank's host
    (local) and of its peers of the same local rank on the other hosts (cross).
    Collective over comm."""

    def __init__(self, comm: MPI.Comm) -> None:
        rank = comm.Get_rank()
        self.local = host_communicator(comm)
        self.cross = comm.Split(self.local.Get_rank(), key=rank)
        self.local_sizes: list[int] = comm.allgather(self.local.Get_size())
        self.hosts = sum(1 for s in comm.allgather(self.local.Get_rank() == 0) if s)

    @property
    def homogeneous(self) -> bool:
        return len(set(self.local_sizes)) == 1

    def unsuitable(self) -> str | None:
        """Why a two-level allreduce cannot help here (None: it can)."""
        if self.hosts < 2:
            return "all ranks share one host"
        if not self.homogeneous:
            return (f"hosts run different numbers of ranks ({sorted(set(self.local_sizes))}"
                    "): a slice would have no partner on some hosts")
        if self.local_sizes[0] < 2:
            return "one rank per host: the flat allreduce is already the cross one"
        return None

    def free(self) -> None:
        self.local.Free()
        self.cross.Free()


class HierarchicalBackend(SharedMemoryBackend):
    """Shared memory on the host's ranks, plus the cross-host step in ``reduce_slice``."""

    name = "hierarchical"

    def __init__(self, comm: MPI.Comm, mode: bool | None, cpu_operations: str | None,
                 world_ranks: Sequence[int] | None = None,
                 threshold: int = HIERARCHICAL_THRESHOLD,
                 piece_bytes: int = PIECE_BYTES, gather: bool = False,
                 patience: Patience | None = None) -> None:
        """mode: True/False as HOROVODISH_HIERARCHICAL_ALLREDUCE forces it, None: chosen
        by size unless cpu_operations names a flat backend. gather: run allgathers in
        two levels too (HOROVODISH_HIERARCHICAL_ALLGATHER). Collective over comm."""
        self.choice = mode
        self.gather = gather
        self.cpu_operations = cpu_operations
        self.topology: Topology | None = None
        self._cross_ring: RingBackend | None = None
        self._cross_mpi: MPIBackend | None = None
        world = list(world_ranks) if world_ranks is not None else list(range(comm.Get_size()))
        wanted = mode is not False or gather
        topology = Topology(comm) if wanted and comm.Get_size() > 1 else None
        why = topology.unsuitable() if topology else "turned off"
        local = topology.local if topology and why is None else MPI.COMM_SELF
        local_world = local.allgather(world[comm.Get_rank()])
        # Two parts of 8 MiB pieces: more would hold 32 MiB a rank for a small gain.
        super().__init__(local, "shm" if why is None else "off", threshold, piece_bytes,
                         world_ranks=local_world, turns=2, patience=patience)
        # Every rank of comm must agree, not only those of one host.
        if why is None and not comm.allreduce(self.available, op=MPI.LAND):
            why = "shared memory is unavailable on some host"
            super().close()
        if why is None:
            self.topology = topology
            self._cross_ring = RingBackend(topology.cross, 0, "ring")
            self._cross_mpi = MPIBackend(topology.cross)
            # Each host (numbered by its first rank's cross rank): its ranks of comm, in
            # local rank order, for the allgather's unpacking.
            self._host = host = topology.local.bcast(topology.cross.Get_rank(), root=0)
            where = comm.allgather((host, topology.local.Get_rank()))
            self._host_ranks = [
                [r for _, r in sorted((lr, r) for r, (h, lr) in enumerate(where) if h == hid)]
                for hid in range(topology.hosts)]
        elif topology is not None:
            topology.free()
        if why is not None and (mode or gather) and comm.Get_rank() == 0 and \
                topology is not None and topology.hosts > 1:  # (one host: no news)
            log.warning("hierarchical allreduce unavailable (%s); using the flat one", why)

    def enabled(self, kind: RequestType, dtype: str, nbytes: int, tensors: int = 1,
                op: ReduceOp | None = None) -> bool:
        if self.topology is None:
            return False
        if kind == RequestType.ALLGATHER:
            return self.gather
        if kind != RequestType.ALLREDUCE or self.choice is False:
            return False
        if self.choice:
            return True
        return self.cpu_operations is None and nbytes >= self.threshold

    def reduce_slice(self, reduced: np.ndarray, op: ReduceOp) -> None:
        """This rank's slice, reduced over its host, reduced over the hosts. Every rank of
        the cross communicator has the same local rank, hence a slice of the same size."""
        if reduced.size == 0:
            return
        if reduced.nbytes >= CROSS_RING_BYTES or known_dtype_name(reduced.dtype) not in MPI_REDUCIBLE:
            self._cross_ring.allreduce(reduced, op)
        else:
            self._cross_mpi.allreduce(reduced, op)

    def allgatherv(self, send: np.ndarray, recv: np.ndarray, counts: list[int]) -> None:
        """Horovod's hierarchical allgather: each host's first rank gathers its host's
        blocks, the first ranks allgather the hosts' blocks between hosts (each block
        crosses the network once per host, not once per rank), and each broadcasts the
        whole result inside its host."""
        local, cross = self.topology.local, self.topology.cross
        item = send.dtype.itemsize
        host = self._host_ranks[self._host]
        packed = np.empty(sum(counts[r] for r in host), send.dtype)
        local.Gatherv(_bytes(send), [_bytes(packed), [counts[r] * item for r in host],
                                     _offsets([counts[r] * item for r in host]), MPI.BYTE],
                      root=0)
        if local.Get_rank() == 0:
            totals = [sum(counts[r] for r in ranks) * item for ranks in self._host_ranks]
            everything = np.empty(sum(totals) // item, send.dtype)
            cross.Allgatherv(_bytes(packed), [_bytes(everything), totals, _offsets(totals),
                                              MPI.BYTE])
            starts = _offsets(counts)
            position = 0
            for ranks in self._host_ranks:
                for r in ranks:
                    recv[starts[r]:starts[r] + counts[r]] = everything[position:position + counts[r]]
                    position += counts[r]
        local.Bcast(_bytes(recv), root=0)

    def close(self) -> None:
        super().close()
        if self.topology is not None:
            self.topology.free()
            self.topology = None


def _bytes(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1).view(np.uint8)


def _offsets(counts: list[int]) -> list[int]:
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64).tolist() \
        if counts else []
