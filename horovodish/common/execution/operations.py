"""The operation manager: per collective, an ordered list of backends; the first enabled runs."""
from __future__ import annotations

from ..messages import ReduceOp, RequestType
from .backends.base import Backend


class OperationManager:
    def __init__(self, backends: list[Backend]) -> None:
        self.backends = backends

    def choose(self, kind: RequestType, dtype: str, nbytes: int, tensors: int = 1,
               op: ReduceOp | None = None) -> Backend:
        for backend in self.backends:
            if backend.enabled(kind, dtype, nbytes, tensors, op):
                return backend
        raise RuntimeError(f"no backend can run {kind.opname} on {dtype} data")
