"""The operation manager: per collective, an ordered list of backends; the first enabled runs."""
from __future__ import annotations

from ..messages import ReduceOp, RequestType
from .backends.base import Backend
from .cuda import DEVICE_CUDA


class OperationManager:
    def __init__(self, backends: list[Backend]) -> None:
        self.backends = backends

    def choose(self, kind: RequestType, dtype: str, nbytes: int, tensors: int = 1,
               op: ReduceOp | None = None, device: str = "cpu") -> Backend:
        """device: the response's; only CUDA views (DEVICE_CUDA) go to a device-memory
        backend, and only there (host-staged CUDA tensors are numpy views)."""
        memory = "cuda" if device == DEVICE_CUDA else "host"
        for backend in self.backends:
            if backend.memory == memory and backend.enabled(kind, dtype, nbytes, tensors, op):
                return backend
        if memory == "cuda":
            raise RuntimeError(f"no backend for {kind.opname} of CUDA tensors here: the "
                               "NCCL backend is not in this runtime")
        raise RuntimeError(f"no backend can run {kind.opname} on {dtype} data")
