"""Which ranks share a host: from an identity each rank reports, never from LOCAL_RANK.

Why not the launcher's LOCAL_RANK: Spark's TorchDistributor starts every process as a
torchrun of one (LOCAL_RANK=0 on every process of a host), Kubeflow runs one pod per
rank, a plain srun says nothing of it. What MPI needs is which processes can share
memory: the same kernel (boot id), the same host name and network namespace (emulated
or containerised hosts on one kernel stay apart, as they are apart on their links). MPI
reads the layout from the PMI server's ``PMI_process_mapping``; shared memory, the
hierarchical allreduce and ``local_rank()``/``cross_rank()`` follow from it.
"""
from __future__ import annotations

import os
import socket


def host_identity() -> str:
    """This process's host, as a string without spaces: host name, boot id, network
    namespace."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as source:
            parts.append(source.read().strip())
    except OSError:
        pass
    try:
        parts.append(os.readlink("/proc/self/ns/net"))
    except OSError:
        pass
    return "/".join(parts).replace(" ", "_")


def host_name(identity: str) -> str:
    """The host-name part of an identity (for messages)."""
    return identity.split("/", 1)[0]


def nodes_of(identities: list[str]) -> list[int]:
    """The node number of every rank (nodes numbered in order of their lowest rank)."""
    numbers: dict[str, int] = {}
    return [numbers.setdefault(identity, len(numbers)) for identity in identities]


def process_mapping(nodes: list[int]) -> str:
    """MPICH's ``PMI_process_mapping`` for the node of every rank: ``(vector,(start,
    count,ranks),...)``, each block ``count`` consecutive nodes holding ``ranks``
    consecutive ranks each; ``(vector,(0,2,2))`` is ranks 0-1 on node 0, 2-3 on node 1.
    MPICH reads the blocks in turn, wrapping round to the first when ranks remain."""
    runs: list[tuple[int, int]] = []  # (node, ranks in a row)
    for node in nodes:
        if runs and runs[-1][0] == node:
            runs[-1] = (node, runs[-1][1] + 1)
        else:
            runs.append((node, 1))
    blocks: list[list[int]] = []  # [first node, nodes, ranks each]
    for node, count in runs:
        last = blocks[-1] if blocks else None
        if last is not None and last[2] == count and last[0] + last[1] == node:
            last[1] += 1
        else:
            blocks.append([node, 1, count])
    return "(vector," + ",".join(f"({a},{b},{c})" for a, b, c in blocks) + ")"
