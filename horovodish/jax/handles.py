"""What the JAX adapter hands the core and gives back: numpy views of host arrays in;
results in aligned host memory of the adapter's own, which JAX adopts without a copy,
and handles that return them as JAX arrays."""
from __future__ import annotations

from math import prod
from typing import Any, Callable, Sequence

import jax
import numpy as np

from ..common.execution.fusion import aligned_empty
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


def host_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """Memory for a result: fresh (never written again once the result is handed out)
    and aligned as XLA's CPU client needs to adopt it rather than copy it."""
    return aligned_empty(prod(shape), np.dtype(dtype)).reshape(tuple(shape))


def jax_array(result: np.ndarray) -> jax.Array:
    """A result as a JAX array on the default device. On CPU it shares the result's
    memory where XLA allows (aligned, a dtype JAX keeps): copying a large gradient into
    JAX cost more than reducing it. JAX arrays are immutable, and nothing here writes a
    result again after this, so sharing is safe; JAX keeps the memory alive."""
    return jax.device_put(result, may_alias=True)
