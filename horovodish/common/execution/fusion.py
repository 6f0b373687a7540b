"""Fusion planning: which ready responses share one collective.

Planning groups allreduce responses with the same op, dtype, device and scale factors,
in order of first appearance, up to the fusion threshold in bytes. Every rank plans from
the same response list, so every rank fuses identically. The memory a fused group goes
through is buffers.py's.
"""
from __future__ import annotations

import operator

from ..messages import RequestType, Response
from .cuda import DEVICE_CUDA


# A tensor in device memory this large goes alone: NCCL reads it where it is and writes
# its output, whereas fusing it copies it in and out of the fusion buffer (four times
# its bytes through GPU memory, 11 us for 8 MiB at an H100's 3 TB/s), which costs
# about what the separate NCCL launch it saves does. On the GPU machine, 20 calls of
# 64 MiB kept in flight were fused in pairs and spent more on the copies than the
# calls cost (docs/gpu.md).
DEVICE_UNFUSED_BYTES = 8 << 20


def plan_fusion(responses: list[Response], threshold: int) -> list[list[Response]]:
    groups: list[list[Response]] = []
    open_groups: dict[tuple, tuple[list[Response], int]] = {}
    for response in responses:
        if (response.type != RequestType.ALLREDUCE or response.error is not None
                or threshold == 0 or (response.device == DEVICE_CUDA
                                      and response.nbytes >= DEVICE_UNFUSED_BYTES)):
            groups.append([response])
            continue
        key = response.fusion_key
        nbytes = response.nbytes
        current = open_groups.get(key)
        if current is not None and current[1] + nbytes <= threshold:
            current[0].append(response)
            open_groups[key] = (current[0], current[1] + nbytes)
        else:
            group = [response]
            groups.append(group)
            open_groups[key] = (group, nbytes)
    return groups


class FusionPlanner:
    """plan_fusion, remembering the last plan: in steady state every cycle brings the
    same cached response objects in the same order, and re-planning hundreds of small
    tensors costs more than checking that nothing changed."""

    def __init__(self) -> None:
        self._responses: list[Response] = []
        self._threshold = -1
        self._groups: list[list[Response]] = []

    def plan(self, responses: list[Response], threshold: int) -> list[list[Response]]:
        if not (threshold == self._threshold and len(responses) == len(self._responses)
                and all(map(operator.is_, responses, self._responses))):
            self._groups = plan_fusion(responses, threshold)
            self._responses, self._threshold = responses, threshold
        return self._groups
