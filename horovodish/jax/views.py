"""JAX arrays as the core's views, and results back as JAX arrays on the input's device.

- A CPU array reaches the core as a numpy view of its memory (no copy); its result is
  written to fresh aligned host memory that JAX adopts without a copy.
- An array on a CUDA device, where init()'s choice sends the call to NCCL, reaches the
  core as a view of its device memory (pointer, device, shape, dtype: a ``DeviceArray``,
  as torch's CUDA tensors do); its result is written to CuPy memory on that device and
  comes back to JAX through DLPack, without a copy. JAX has no stream to order on, so
  the input is waited for (``block_until_ready``) before it is submitted, and the host
  waits for the result's completion event before JAX sees it.
- Any other array on an accelerator is staged through host memory (device
  ``cuda/host``) and its result put back on its device.

Collectives that only move bytes (broadcast, allgather, alltoall) also take PRNG key
arrays (``jax.random.key``), as their key data (uint32).
"""
from __future__ import annotations

from math import prod
from typing import Any, Sequence

import jax
import numpy as np

from ..common.api import collectives as core
from ..common.execution.cuda import DEVICE_CUDA, DEVICE_CUDA_STAGED, DeviceArray, load_cupy
from ..common.execution.buffers import aligned_empty
from ..common.messages import ReduceOp, RequestType

_CUDA = 2  # DLPack's device type for CUDA memory (kDLCUDA)
MOVES_ONLY = frozenset({RequestType.BROADCAST, RequestType.ALLGATHER, RequestType.ALLTOALL})


def host_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """Memory for a result: fresh (never written again once the result is handed out)
    and aligned as XLA's CPU client needs to adopt it rather than copy it."""
    return aligned_empty(prod(shape), np.dtype(dtype)).reshape(tuple(shape))


def jax_array(result: np.ndarray, device: Any = None) -> jax.Array:
    """A host result as a JAX array (on ``device``, else the default device). On CPU it
    shares the result's memory where XLA allows (aligned, a dtype JAX keeps): copying a
    large gradient into JAX cost more than reducing it. JAX arrays are immutable, and
    nothing here writes a result again after this, so sharing is safe; JAX keeps the
    memory alive."""
    return jax.device_put(result, device, may_alias=True)


def check_not_traced(tensor: Any, opname: str) -> None:
    if isinstance(tensor, jax.core.Tracer):
        raise ValueError(
            f"horovodish.jax.{opname} was called inside a traced function (jax.jit, "
            "jax.grad, vmap...): a collective cannot run there. Call it outside: compute "
            "gradients with a jitted function, then reduce them, as DistributedOptimizer "
            "does.")


def _accelerator(tensor: Any) -> Any:
    """The one non-CPU device a JAX array lives on, or None (host memory)."""
    if not isinstance(tensor, jax.Array):
        return None
    devices = tensor.devices()
    if len(devices) != 1:
        return None  # spread over several devices: np.asarray gathers it to the host
    device = next(iter(devices))
    return None if device.platform == "cpu" else device


class View:
    """One array as the core sees it (``array``, ``device``), memory for its result
    (``empty``), and the way back to a JAX array (``result``)."""

    __slots__ = ("array", "device", "_home", "_key_impl", "_dtype")

    def __init__(self, array: Any, device: str, home: Any, key_impl: Any,
                 dtype: np.dtype) -> None:
        self.array, self.device = array, device
        self._home, self._key_impl, self._dtype = home, key_impl, dtype

    @property
    def on_device(self) -> bool:
        return self.device == DEVICE_CUDA

    def empty(self, shape: Sequence[int]) -> Any:
        if not self.on_device:
            return host_empty(shape, self.array.dtype)
        return cuda_empty(tuple(shape), self.array.dtype, self.array.device.id)

    def result(self, out: Any) -> jax.Array:
        """The result in JAX, on the input's device, in the input's dtype."""
        if self.on_device:
            array = cuda_to_jax(out)
            if array.dtype != self._dtype:
                array = jax.lax.bitcast_convert_type(array, self._dtype)
        else:
            array = jax_array(out.view(self._dtype) if out.dtype != self._dtype else out,
                              self._home)
        if self._key_impl is not None:
            array = jax.random.wrap_key_data(array, impl=self._key_impl)
        return array


def view(tensor: Any, opname: str, kind: RequestType, op: ReduceOp | None = None) -> View:
    """The core's view of a JAX array (or numpy array) for one collective."""
    check_not_traced(tensor, opname)
    key_impl = None
    if isinstance(tensor, jax.Array) and jax.dtypes.issubdtype(tensor.dtype,
                                                                jax.dtypes.prng_key):
        if kind not in MOVES_ONLY:
            raise TypeError(f"horovodish.jax.{opname}: PRNG keys cannot be reduced; "
                            "broadcast, allgather or alltoall them")
        key_impl, tensor = jax.random.key_impl(tensor), jax.random.key_data(tensor)
    dtype = np.dtype(tensor.dtype)
    accelerator = _accelerator(tensor)
    # An input committed to a device gets its result there; an uncommitted one lives on
    # the default device, where an uncommitted result goes too.
    home = next(iter(tensor.devices())) if isinstance(tensor, jax.Array) and \
        tensor.committed and len(tensor.devices()) == 1 else None
    if accelerator is not None and tensor.__dlpack_device__()[0] == _CUDA and \
            core.cuda_device(kind, dtype.name, op) == DEVICE_CUDA:
        tensor.block_until_ready()  # JAX exposes no stream to order the collective on
        ptr = tensor.unsafe_buffer_pointer() if tensor.size else 0
        return View(DeviceArray(ptr, tensor.__dlpack_device__()[1], tuple(tensor.shape),
                                dtype, tensor), DEVICE_CUDA, home, key_impl, dtype)
    return View(np.asarray(tensor), "cpu" if accelerator is None else DEVICE_CUDA_STAGED,
                home, key_impl, dtype)


# -- CUDA memory -------------------------------------------------------------------------
def cuda_empty(shape: tuple[int, ...], dtype: np.dtype, device: int) -> DeviceArray:
    """Device memory for a result (CuPy's, which keeps it alive), as the core's view.
    Allocated as bytes: CuPy has no bfloat16."""
    cupy = load_cupy()
    with cupy.cuda.Device(device):
        memory = cupy.empty(prod(shape) * dtype.itemsize, dtype=cupy.uint8)
    return DeviceArray(memory.data.ptr, device, shape, dtype, memory)


def wait_for_device(handles: Sequence[Any]) -> None:
    """The host waits for the completion events of the handles' results on the device
    (each distinct event once)."""
    seen: set[int] = set()
    for handle in handles:
        event = getattr(handle, "event", None)
        if event is not None and id(event.event) not in seen:
            seen.add(id(event.event))
            event.event.synchronize()


def cuda_to_jax(out: DeviceArray) -> jax.Array:
    """A result in CuPy memory as a JAX array on the same device, through DLPack (no
    copy). bfloat16 comes back as uint16 (CuPy has no bfloat16); the caller bitcasts."""
    memory = out.owner
    dtype = out.dtype if out.dtype.name != "bfloat16" else np.dtype(np.uint16)
    return jax.dlpack.from_dlpack(memory.view(dtype).reshape(out.shape))
