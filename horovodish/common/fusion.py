"""Fusion: which ready responses share one collective, and the buffer they share.

Planning groups allreduce responses with the same op, dtype, device and scale factors,
in order of first appearance, up to the fusion threshold in bytes. Every rank plans from
the same response list, so every rank fuses identically.
"""
from __future__ import annotations

import numpy as np

from .messages import RequestType, Response


def plan_fusion(responses: list[Response], threshold: int) -> list[list[Response]]:
    groups: list[list[Response]] = []
    open_groups: dict[tuple, tuple[list[Response], int]] = {}
    for response in responses:
        if response.type != RequestType.ALLREDUCE or response.error is not None or threshold == 0:
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


class FusionBuffers:
    """One persistent buffer per dtype, grown on demand, never allocated per cycle."""

    def __init__(self) -> None:
        self._buffers: dict[np.dtype, np.ndarray] = {}

    def get(self, dtype: np.dtype, count: int) -> np.ndarray:
        buf = self._buffers.get(dtype)
        if buf is None or buf.size < count:
            grown = max(count, 2 * buf.size if buf is not None else 0)
            buf = np.empty(grown, dtype=dtype)
            self._buffers[dtype] = buf
        return buf[:count]
