"""An entry: a request plus the tensor views it reads and writes, and its handle."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .handles import Handle
from .messages import Request


@dataclass(slots=True)
class Entry:
    request: Request
    tensor: np.ndarray | None
    handle: Handle
    # Known-shape outputs (allreduce, broadcast, reducescatter) are allocated at submit;
    # allgather and alltoall learn their output shape from the response and ask `allocate`.
    # An allreduce without an output gets a view of a runtime-owned result block.
    output: np.ndarray | None = None
    allocate: Callable[[tuple[int, ...]], np.ndarray] | None = None
