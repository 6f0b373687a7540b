"""What the JAX adapter hands the core and gives back: numpy views of host arrays in,
and handles whose results come back as JAX arrays."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

from ..common.runtime.handles import Handle as _CoreHandle


class Handle:
    """An asynchronous collective's completion: ``synchronize(handle)`` returns its
    result as JAX arrays (or raises the error the negotiation or backend produced)."""

    def __init__(self, handles: Sequence[_CoreHandle], finish: Callable[[list], Any]) -> None:
        self._handles, self._finish = list(handles), finish

    def done(self) -> bool:
        return all(h.done() for h in self._handles)

    def wait(self) -> Any:
        results, error = [], None
        for handle in self._handles:  # every one waited, so no name stays in flight
            try:
                results.append(handle.wait())
            except Exception as exc:  # noqa: BLE001 (raised after the others)
                error = error or exc
        if error is not None:
            raise error
        return self._finish(results)


def host_array(tensor: Any, opname: str) -> np.ndarray:
    """The array's host memory as numpy, without a copy where JAX allows."""
    if isinstance(tensor, jax.core.Tracer):
        raise ValueError(
            f"horovodish.jax.{opname} was called inside a traced function (jax.jit, "
            "jax.grad, vmap...): a collective cannot run there. Call it outside: compute "
            "gradients with a jitted function, then reduce them, as DistributedOptimizer "
            "does.")
    return np.asarray(tensor)
