"""A fake CuPy (with its NCCL module) on host memory, for the NCCL backend's CPU tests.

Honest where it matters, small elsewhere:
- "device" arrays are numpy arrays; their pointers are real host addresses, so the
  backend's pointer arithmetic (offsets, tables, padded parts) is exercised for real;
- a RawKernel runs the kernel's real body (gpu_fusion.kernel_body), compiled by g++
  with a host emulation of CUDA's grid (host_kernel, also used by test_gpu_fusion), after
  checking that the source it was given is the one the GPU would compile;
- NCCL calls move real bytes between the ranks (threads of one process) through an
  exchange, grouped calls (groupStart/groupEnd) at the group's end as NCCL does.
What it cannot show: stream order. Everything runs at once when enqueued, so a missing
wait on an event goes unnoticed here; tests/gpu checks that on a GPU.
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import subprocess
import threading
import types
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from horovodish.common.execution.gpu_fusion import (
    _TYPES, conversion_source, kernel_body, kernel_name, kernel_source)

_NCCL_NUMPY = {0: np.int8, 1: np.uint8, 2: np.int32, 4: np.int64, 6: np.float16,
               7: np.float32, 8: np.float64, 9: ml_dtypes.bfloat16}
_NCCL_UFUNC = {0: np.add, 1: np.multiply, 2: np.maximum, 3: np.minimum}


def host_bytes(ptr: int, nbytes: int) -> np.ndarray:
    """The nbytes at host address ptr, as a writable uint8 array."""
    if nbytes == 0:
        return np.empty(0, dtype=np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))


class _Memory:
    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    @property
    def ptr(self) -> int:
        return self._array.ctypes.data

    def copy_from_host_async(self, mem: ctypes.c_void_p, nbytes: int,
                             stream: Any = None) -> None:
        # CuPy reads mem.value: a plain int fails there, as it does here.
        host_bytes(self.ptr, nbytes)[:] = host_bytes(mem.value, nbytes)


class FakeArray:
    """A CuPy array's surface the backend uses, over a numpy array."""

    def __init__(self, array: np.ndarray, base: "FakeArray | None" = None,
                 device: int = 0) -> None:
        self.host = array
        self.base = base
        self.device = types.SimpleNamespace(id=device)
        self.data = _Memory(array)

    shape = property(lambda self: self.host.shape)
    size = property(lambda self: self.host.size)
    itemsize = property(lambda self: self.host.itemsize)
    nbytes = property(lambda self: self.host.nbytes)
    dtype = property(lambda self: self.host.dtype)

    def _view(self, array: np.ndarray) -> "FakeArray":
        return FakeArray(array, self.base if self.base is not None else self, self.device.id)

    def __getitem__(self, index: Any) -> "FakeArray":
        return self._view(self.host[index])

    def reshape(self, *shape: Any) -> "FakeArray":
        return self._view(self.host.reshape(*shape))


class _Event:
    _ids = itertools.count(1)

    def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
        self.ptr = next(self._ids)
        self.recorded_on: Any = None

    def record(self, stream: Any = None) -> None:
        self.recorded_on = stream

    def synchronize(self) -> None:
        pass


class _Stream:
    _ids = itertools.count(100)

    def __init__(self, non_blocking: bool = False) -> None:
        self.ptr = next(self._ids)
        self.waited: list[Any] = []

    def wait_event(self, event: Any) -> None:
        self.waited.append(event)

    def __enter__(self) -> "_Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class _Pinned(bytearray):
    """Host memory with an address, readable by np.frombuffer (as CuPy's is)."""

    def __init__(self, nbytes: int) -> None:
        super().__init__(nbytes)
        self.ptr = ctypes.addressof((ctypes.c_char * max(nbytes, 1)).from_buffer(self)) \
            if nbytes else 0


# -- kernels: the real body, compiled for the host --------------------------------------------
_SHIM = """
#include <cstring>
#define __global__
#define __device__
#define __forceinline__ inline
struct Dim { unsigned int x; };
static thread_local Dim blockIdx, threadIdx, blockDim;  // ranks are threads
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
"""
_HALF_ON_HOST = """
static inline float to_compute(unsigned short x) { _Float16 h; memcpy(&h, &x, 2); return (float)h; }
static inline unsigned short from_compute(float f) {
    _Float16 h = (_Float16)f; unsigned short x; memcpy(&x, &h, 2); return x; }
"""
_DRIVER = """
extern "C" void run_grid(const long long* table, int n, double scale, long long divisor,
                         unsigned int blocks, unsigned int threads) {{
    blockDim.x = threads;
    for (unsigned int b = 0; b < blocks; ++b)
        for (unsigned int t = 0; t < threads; ++t) {{
            blockIdx.x = b; threadIdx.x = t;
            {name}(table, n, scale, divisor);
        }}
}}
"""


def host_kernel(dtype: str, folder: Path, chunk: int | None = None) -> Any:
    """dtype's copy kernel compiled for the host: run(table, n, scale, divisor, blocks,
    threads) runs the whole grid."""
    conversions = _HALF_ON_HOST if dtype == "float16" else conversion_source(dtype)
    body = kernel_body(dtype) if chunk is None else kernel_body(dtype, chunk=chunk)
    # Ranks run as threads and each compiles its kernels: every build goes to names of
    # its own and is renamed into place, so no rank loads a library another is writing.
    private = f"{dtype}-{chunk}.{os.getpid()}.{threading.get_ident()}"
    source = folder / f"{private}.cpp"
    source.write_text(_SHIM + conversions + body + _DRIVER.format(name=kernel_name(dtype)))
    built = folder / f"{private}.so"
    result = subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", str(built),
                             str(source)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{dtype}:\n{result.stderr}"
    library = folder / f"{dtype}-{chunk}.so"
    os.replace(built, library)
    run = ctypes.CDLL(str(library)).run_grid
    run.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_double, ctypes.c_longlong,
                    ctypes.c_uint, ctypes.c_uint]
    return run


class _RawKernel:
    def __init__(self, owner: "FakeCupy", source: str, name: str) -> None:
        dtype = next(d for d in _TYPES if kernel_name(d) == name)
        assert source == kernel_source(dtype), "the kernel compiled is not gpu_fusion's"
        self._run = owner.kernel(dtype)
        self._owner, self._name = owner, name
        owner.launches.append(name)

    def __call__(self, grid: tuple, block: tuple, args: tuple) -> None:
        self._owner.calls.append(self._name)
        table, n, scale, divisor = args
        self._run(table.data.ptr, int(n), float(scale), int(divisor), grid[0], block[0])


# -- NCCL: bytes between the ranks -------------------------------------------------------------
class Exchange:
    """Rendezvous of the ranks' threads: each posts a value, all see every value."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._barrier = threading.Barrier(size)
        self._slots: list[Any] = [None] * size

    def everyone(self, rank: int, value: Any) -> list[Any]:
        self._slots[rank] = value
        self._barrier.wait()
        values = list(self._slots)
        self._barrier.wait()
        return values


class _Communicator:
    def __init__(self, nccl: "FakeNccl", size: int, unique_id: bytes, rank: int) -> None:
        problem = nccl.init_failures.get(rank)
        if problem:
            raise RuntimeError(problem)
        nccl.created.append((rank, unique_id))
        self._nccl, self.size, self.rank = nccl, size, rank
        self.destroyed = False
        self.calls: list[str] = []

    def _everyone(self, value: Any) -> list[Any]:
        return self._nccl.exchange.everyone(self.rank, value)

    def _grouped(self, op: tuple) -> bool:
        group = self._nccl.local.__dict__.get("group")
        if group is None:
            return False
        group.append((self, op))
        return True

    def allReduce(self, send: int, recv: int, count: int, datatype: int, op: int,
                  stream: int) -> None:
        self.calls.append("allReduce")
        dtype = np.dtype(_NCCL_NUMPY[datatype])
        mine = host_bytes(send, count * dtype.itemsize).view(dtype).copy()
        values = self._everyone(mine)
        host_bytes(recv, count * dtype.itemsize).view(dtype)[:] = \
            _NCCL_UFUNC[op].reduce(np.stack(values), axis=0)

    def reduceScatter(self, send: int, recv: int, count: int, datatype: int, op: int,
                      stream: int) -> None:
        self.calls.append("reduceScatter")
        dtype = np.dtype(_NCCL_NUMPY[datatype])
        mine = host_bytes(send, count * self.size * dtype.itemsize).view(dtype).copy()
        total = _NCCL_UFUNC[op].reduce(np.stack(self._everyone(mine)), axis=0)
        host_bytes(recv, count * dtype.itemsize).view(dtype)[:] = \
            total[self.rank * count:(self.rank + 1) * count]

    def allGather(self, send: int, recv: int, count: int, datatype: int,
                  stream: int) -> None:
        self.calls.append("allGather")
        nbytes = count * np.dtype(_NCCL_NUMPY[datatype]).itemsize
        parts = self._everyone(host_bytes(send, nbytes).copy())
        host_bytes(recv, nbytes * self.size)[:] = np.concatenate(parts)

    def broadcast(self, send: int, recv: int, count: int, datatype: int, root: int,
                  stream: int) -> None:
        self.calls.append("broadcast")
        nbytes = count * np.dtype(_NCCL_NUMPY[datatype]).itemsize
        op = ("broadcast", root, send if self.rank == root else 0, recv, nbytes)
        if not self._grouped(op):
            _run_group(self._nccl, [(self, op)])

    def send(self, send: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self.calls.append("send")
        nbytes = count * np.dtype(_NCCL_NUMPY[datatype]).itemsize
        assert self._grouped(("send", peer, send, 0, nbytes)), "send outside a group"

    def recv(self, recv: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self.calls.append("recv")
        nbytes = count * np.dtype(_NCCL_NUMPY[datatype]).itemsize
        assert self._grouped(("recv", peer, 0, recv, nbytes)), "recv outside a group"

    def destroy(self) -> None:
        self.destroyed = True


def _run_group(nccl: "FakeNccl", calls: list[tuple[_Communicator, tuple]]) -> None:
    """What one rank's group does, once every rank has ended its group (a group here
    holds at most one broadcast per root, and sends to a peer in order)."""
    if not calls:
        return
    communicator = calls[0][0]
    outgoing = [(kind, peer, host_bytes(send, nbytes).copy() if send else None)
                for _, (kind, peer, send, _, nbytes) in calls]
    everyone = communicator._everyone(outgoing)
    rank = communicator.rank
    received: dict[int, int] = {}
    for _, (kind, peer, _, recv, nbytes) in calls:
        if kind == "broadcast":
            (data,) = [d for k, p, d in everyone[peer] if k == "broadcast" and p == peer]
            host_bytes(recv, nbytes)[:] = data
        elif kind == "recv":
            index = received.get(peer, 0)
            sent = [d for k, p, d in everyone[peer] if k == "send" and p == rank]
            host_bytes(recv, nbytes)[:] = sent[index]
            received[peer] = index + 1


class FakeNccl(types.ModuleType):
    """cupy.cuda.nccl for the ranks of one Exchange."""

    def __init__(self, exchange: Exchange) -> None:
        super().__init__("cupy.cuda.nccl")
        self.available = True
        self.exchange = exchange
        self.local = threading.local()
        self.created: list[tuple[int, bytes]] = []
        self.init_failures: dict[int, str] = {}
        self._ids = itertools.count()
        nccl = self

        class NcclCommunicator(_Communicator):
            def __init__(self, size: int, unique_id: bytes, rank: int) -> None:
                super().__init__(nccl, size, unique_id, rank)
        self.NcclCommunicator = NcclCommunicator

    def get_unique_id(self) -> bytes:
        return f"unique-id-{next(self._ids)}".encode().ljust(128, b"\0")

    def get_version(self) -> int:
        return 22805

    def groupStart(self) -> None:
        self.local.group = []

    def groupEnd(self) -> None:
        calls, self.local.group = self.local.group, None
        by_communicator: dict[int, list] = {}
        for communicator, op in calls:
            by_communicator.setdefault(id(communicator), []).append((communicator, op))
        for group in by_communicator.values():
            _run_group(self, group)


class FakeCupy(types.ModuleType):
    """The cupy module's surface used by horovodish, on host memory."""

    def __init__(self, nccl: FakeNccl, kernel_folder: Path) -> None:
        super().__init__("cupy")
        self._folder = kernel_folder
        self._kernels: dict[str, Any] = {}
        self.launches: list[str] = []  # kernels compiled
        self.calls: list[str] = []  # kernels launched
        self.allocations = 0
        owner = self
        # What was enqueued between streams and events, by handle (nothing is ordered
        # here, but tests can check that the right waits and records were asked for).
        self.waits: list[tuple[int, int]] = []  # (stream, event)
        self.records: list[tuple[int, int]] = []  # (event, stream)
        runtime = types.SimpleNamespace(
            getDevice=lambda: 0,
            eventRecord=lambda event, stream: self.records.append((event, stream)),
            streamWaitEvent=lambda stream, event, flags=0: self.waits.append((stream, event)),
            runtimeGetVersion=lambda: 13000)
        self.cuda = types.ModuleType("cupy.cuda")
        self.cuda.nccl = nccl
        self.cuda.runtime = runtime
        self.cuda.Device = lambda device=0: contextlib.nullcontext()
        self.cuda.Stream = _Stream
        self.cuda.Event = _Event
        self.cuda.alloc_pinned_memory = _Pinned
        self.RawKernel = lambda source, name: _RawKernel(owner, source, name)

    def kernel(self, dtype: str) -> Any:
        if dtype not in self._kernels:
            self._kernels[dtype] = host_kernel(dtype, self._folder)
        return self._kernels[dtype]

    def empty(self, count: int, dtype: Any = np.float32) -> FakeArray:
        self.allocations += 1  # garbage in it, as in fresh device memory
        dtype = np.dtype(dtype)
        return FakeArray(np.full(count * dtype.itemsize, 0x5A, dtype=np.uint8).view(dtype))

    def asarray(self, array: np.ndarray) -> FakeArray:
        return FakeArray(array)
