"""GPU fusion: one kernel launch copies N tensors into (or out of) a fusion buffer.

A fused group of CUDA tensors is packed into one device buffer, reduced by one NCCL
call, and copied out; the copies are one launch each way, not one copy per tensor.
The kernel reads a table of (source pointer, destination pointer, count, first block)
per tensor; block b finds its tensor by a binary search of the first-block column and
copies its chunk of CHUNK_ELEMENTS elements, scaled on the way (prescale into the
buffer, postscale or an integer Average's exact division out of it). A source pointer
of 0 writes zeros (a joined rank's contribution), a destination of 0 skips the tensor
(a joined rank has no output).

Everything up to the launch is a pure function of the layout and the pointers
(``plan_layout``, ``copy_table``, ``kernel_source``), tested on CPU: the source is
compiled with nvcc where there is one, and run on the host through a small emulation
of CUDA's grid (tests/common/test_gpu_fusion.py). ``BatchedCopier`` (CuPy) compiles
the kernels and keeps the uploaded tables, cached by their contents: training repeats
its layouts and, with PyTorch's caching allocator, usually its addresses too, so a
step uploads nothing.
"""
from __future__ import annotations

import ctypes
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

THREADS_PER_BLOCK = 256
# 16 elements per thread: enough work per block to hide the table search.
CHUNK_ELEMENTS = 16 * THREADS_PER_BLOCK

# dtype name -> (C type stored, C type computed in when scaling, numpy type of the
# CuPy buffers: bfloat16 as its int16 bits, which CuPy and DLPack both carry).
# Half types compute in float and round once (Horovod's CPU arithmetic, arithmetic.py);
# integers in double, truncated toward zero by the conversion back.
_TYPES: dict[str, tuple[str, str, str]] = {
    "float32": ("float", "float", "float32"),
    "float64": ("double", "double", "float64"),
    "float16": ("unsigned short", "float", "float16"),
    "bfloat16": ("unsigned short", "float", "int16"),
    "uint8": ("unsigned char", "double", "uint8"),
    "bool": ("unsigned char", "double", "bool"),
    "int8": ("signed char", "double", "int8"),
    "int16": ("short", "double", "int16"),
    "int32": ("int", "double", "int32"),
    "int64": ("long long", "double", "int64"),
}
INTEGER = frozenset({"uint8", "bool", "int8", "int16", "int32", "int64"})


def storage_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of CuPy buffers holding dtype (bfloat16 as int16)."""
    return np.dtype(_TYPES[dtype][2])


@dataclass(frozen=True)
class Layout:
    """Where each tensor of a group sits in the fusion buffer, in elements, and which
    blocks of the launch copy it: tensor i owns blocks first_block[i] to
    first_block[i + 1] - 1."""
    counts: tuple[int, ...]
    offsets: tuple[int, ...]
    first_block: tuple[int, ...]  # len(counts) + 1 entries

    @property
    def total(self) -> int:
        return self.offsets[-1] + self.counts[-1] if self.counts else 0

    @property
    def blocks(self) -> int:
        return self.first_block[-1]


@lru_cache(maxsize=256)
def plan_layout(counts: tuple[int, ...], chunk: int = CHUNK_ELEMENTS) -> Layout:
    """Tensors back to back, and the launch's blocks split among them by size."""
    offsets, first_block, offset, block = [], [], 0, 0
    for count in counts:
        offsets.append(offset)
        first_block.append(block)
        offset += count
        block += -(-count // chunk)
    first_block.append(block)
    return Layout(tuple(counts), tuple(offsets), tuple(first_block))


def copy_table(layout: Layout, sources: Sequence[int], destinations: Sequence[int]
               ) -> np.ndarray:
    """The kernel's table: sources, destinations, counts, then first blocks (int64)."""
    n = len(layout.counts)
    if len(sources) != n or len(destinations) != n:
        raise ValueError(f"a layout of {n} tensors needs {n} sources and destinations")
    table = np.empty(4 * n + 1, dtype=np.int64)
    table[:n] = sources
    table[n:2 * n] = destinations
    table[2 * n:3 * n] = layout.counts
    table[3 * n:] = layout.first_block
    return table


def pack_pointers(layout: Layout, buffer: int, itemsize: int,
                  inputs: Sequence[int]) -> tuple[list[int], list[int]]:
    """(sources, destinations) that copy the inputs into the buffer (0: zeros)."""
    return list(inputs), [buffer + offset * itemsize for offset in layout.offsets]


def unpack_pointers(layout: Layout, buffer: int, itemsize: int,
                    outputs: Sequence[int]) -> tuple[list[int], list[int]]:
    """(sources, destinations) that copy the buffer out to the outputs (0: skipped)."""
    return [buffer + offset * itemsize for offset in layout.offsets], list(outputs)


def scale_arguments(dtype: str, scale: float, divisor: int) -> tuple[float, int]:
    """(scale, divisor) as the kernel takes them: 1.0 and 1 do nothing. Only integers
    divide (an Average's exact division toward zero); floats fold 1/size into scale."""
    if divisor > 1 and dtype not in INTEGER:
        raise ValueError(f"an exact division is for integer types, not {dtype}")
    return float(scale), max(1, int(divisor))


def kernel_name(dtype: str) -> str:
    return f"horovodish_copy_{dtype}"


# Conversions to and from the computing type. Half types are handled as their bits, so
# the source needs no CUDA header (NVRTC may not find one in a wheel-only install):
# float16 with PTX's conversion instructions, bfloat16 by its definition (the top half
# of a float32, rounded to nearest even).
_CONVERSIONS = {
    "float16": """
__device__ __forceinline__ float to_compute(unsigned short x) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x)); return f; }
__device__ __forceinline__ unsigned short from_compute(float f) {
    unsigned short x; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x) : "f"(f)); return x; }
""",
    "bfloat16": """
__device__ __forceinline__ float to_compute(unsigned short x) {
    return __uint_as_float(((unsigned int)x) << 16); }
__device__ __forceinline__ unsigned short from_compute(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16); }
""",
}
_CAST = """
__device__ __forceinline__ {compute} to_compute({storage} x) {{ return ({compute})x; }}
__device__ __forceinline__ {storage} from_compute({compute} x) {{ return ({storage})x; }}
"""

# The body, shared by every dtype. Every thread of a block searches the table (the
# same few cached loads), so the kernel needs no shared memory or barrier.
_KERNEL = """
extern "C" __global__ void {name}(const long long* table, int n, double scale,
                                  long long divisor) {{
    const long long* first_block = table + 3 * (long long)n;
    long long block = (long long)blockIdx.x;
    int lo = 0, hi = n - 1;
    while (lo < hi) {{  /* the last tensor whose first block is <= block */
        int mid = (lo + hi + 1) / 2;
        if (first_block[mid] <= block) lo = mid; else hi = mid - 1;
    }}
    {storage}* out = ({storage}*)table[n + lo];
    if (out == 0) return;
    const {storage}* in = (const {storage}*)table[lo];
    long long count = table[2 * (long long)n + lo];
    long long begin = (block - first_block[lo]) * {chunk}LL;
    long long end = begin + {chunk}LL < count ? begin + {chunk}LL : count;
    {compute} factor = ({compute})scale;
    for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {{
        {storage} value = in == 0 ? ({storage})0 : in[i];
        if (divisor != 1) {{
            out[i] = value / ({storage})divisor;
        }} else if (scale != 1.0) {{
            out[i] = from_compute(to_compute(value) * factor);
        }} else {{
            out[i] = value;
        }}
    }}
}}
"""


def conversion_source(dtype: str) -> str:
    storage, compute, _ = _TYPES[dtype]
    return _CONVERSIONS.get(dtype) or _CAST.format(storage=storage, compute=compute)


def kernel_body(dtype: str, chunk: int = CHUNK_ELEMENTS) -> str:
    storage, compute, _ = _TYPES[dtype]
    return _KERNEL.format(name=kernel_name(dtype), storage=storage, compute=compute,
                          chunk=chunk)


def kernel_source(dtype: str) -> str:
    """The CUDA C source of dtype's copy kernel (compiled by NVRTC through CuPy)."""
    return conversion_source(dtype) + kernel_body(dtype)


class BatchedCopier:
    """Launches the copy kernel on one device (CuPy): compiled kernels per dtype, and
    uploaded tables cached by their contents (least recently used dropped first)."""

    def __init__(self, cupy: Any, max_tables: int = 64) -> None:
        self._cupy = cupy
        self._kernels: dict[str, Any] = {}
        self._tables: OrderedDict[bytes, tuple[Any, Any, Any]] = OrderedDict()
        self._max_tables = max_tables

    def launch(self, dtype: str, layout: Layout, sources: Sequence[int],
               destinations: Sequence[int], stream: Any, scale: float = 1.0,
               divisor: int = 1) -> None:
        """Enqueue one copy of every tensor of layout on stream (nothing waits)."""
        if layout.blocks == 0:
            return
        scale, divisor = scale_arguments(dtype, scale, divisor)
        table = self._device_table(copy_table(layout, sources, destinations), stream)
        kernel = self._kernels.get(dtype)
        if kernel is None:
            kernel = self._cupy.RawKernel(kernel_source(dtype), kernel_name(dtype))
            self._kernels[dtype] = kernel
        with stream:
            kernel((layout.blocks,), (THREADS_PER_BLOCK,),
                   (table, np.int32(len(layout.counts)), np.float64(scale),
                    np.int64(divisor)))

    def _device_table(self, table: np.ndarray, stream: Any) -> Any:
        key = table.tobytes()
        cached = self._tables.get(key)
        if cached is not None:
            self._tables.move_to_end(key)
            return cached[0]
        cupy = self._cupy
        # Pinned host memory, so that the upload is asynchronous; each table keeps its
        # own, never rewritten while its copy may still be pending.
        pinned = cupy.cuda.alloc_pinned_memory(table.nbytes)
        np.frombuffer(pinned, dtype=np.int64, count=table.size)[:] = table
        with stream:
            device = cupy.empty(table.size, dtype=np.int64)
        device.data.copy_from_host_async(ctypes.c_void_p(pinned.ptr), table.nbytes, stream)
        uploaded = cupy.cuda.Event(block=False, disable_timing=True)
        uploaded.record(stream)
        self._tables[key] = (device, pinned, uploaded)
        while len(self._tables) > self._max_tables:
            _, (_, _, old_upload) = self._tables.popitem(last=False)
            # Its pinned memory goes back to CuPy's pool: the copy from it (issued many
            # groups ago) must be over first. The only host wait here, and not per step.
            old_upload.synchronize()
        return device
