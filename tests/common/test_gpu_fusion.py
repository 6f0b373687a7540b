"""GPU fusion's plan and kernel, on CPU: the layout, the table, and the kernel's own
source, compiled by nvcc where there is one (no GPU needed to compile) and run on the
host through a small emulation of CUDA's grid (g++, fake_cuda.host_kernel), against
Horovod's CPU arithmetic.

What this cannot show: NVRTC (CuPy's compiler) accepting the source, the PTX
conversions of float16 (emulated here with _Float16), and speed. tests/gpu does.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from horovodish.common.execution.arithmetic import divide_toward_zero, scale_into
from horovodish.common.execution.gpu_fusion import (
    CHUNK_ELEMENTS, INTEGER, _TYPES, copy_table, kernel_name, kernel_source, pack_pointers, plan_layout, scale_arguments,
    storage_dtype, unpack_pointers)

from .fake_cuda import host_kernel

DTYPES = sorted(_TYPES)


def test_layout_puts_tensors_back_to_back_and_splits_blocks_by_size():
    layout = plan_layout((3, 0, 10, 8, 1), chunk=4)
    assert layout.offsets == (0, 3, 3, 13, 21)
    assert layout.first_block == (0, 1, 1, 4, 6, 7)  # 1, 0, 3, 2 and 1 blocks
    assert layout.total == 22 and layout.blocks == 7
    assert plan_layout(()).total == 0 and plan_layout(()).blocks == 0


def test_layout_is_cached_by_counts():
    assert plan_layout((5, 6)) is plan_layout((5, 6))


def test_table_holds_pointers_counts_and_first_blocks():
    layout = plan_layout((4, 9), chunk=4)
    sources, destinations = pack_pointers(layout, buffer=1000, itemsize=4, inputs=[7, 0])
    assert destinations == [1000, 1016]
    table = copy_table(layout, sources, destinations)
    assert table.dtype == np.int64
    assert table.tolist() == [7, 0, 1000, 1016, 4, 9, 0, 1, 4]
    sources, destinations = unpack_pointers(layout, 1000, 4, [0, 55])
    assert (sources, destinations) == ([1000, 1016], [0, 55])
    with pytest.raises(ValueError, match="2 tensors"):
        copy_table(layout, [1], [2])


def test_scale_arguments():
    assert scale_arguments("float32", 0.5, 0) == (0.5, 1)
    assert scale_arguments("int32", 1.0, 4) == (1.0, 4)
    with pytest.raises(ValueError, match="integer"):
        scale_arguments("float16", 1.0, 2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_source_names_its_types(dtype):
    source = kernel_source(dtype)
    storage, compute, _ = _TYPES[dtype]
    assert f'extern "C" __global__ void {kernel_name(dtype)}(' in source
    assert f"{storage}* out" in source and f"{compute} factor" in source
    assert "#include" not in source  # NVRTC in a wheel-only install may have no headers
    assert storage_dtype(dtype).itemsize == {"float64": 8, "int64": 8, "float32": 4,
                                             "int32": 4, "float16": 2, "bfloat16": 2,
                                             "int16": 2}.get(dtype, 1)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_every_kernel_compiles_with_nvcc(tmp_path):
    for dtype in DTYPES:
        source = tmp_path / f"{dtype}.cu"
        source.write_text(kernel_source(dtype))
        result = subprocess.run(["nvcc", "--ptx", "-arch=sm_90", "-Werror", "all-warnings",
                                 "-o", str(tmp_path / f"{dtype}.ptx"), str(source)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"{dtype}:\n{result.stderr}"
        assert kernel_name(dtype) in (tmp_path / f"{dtype}.ptx").read_text()


# -- the kernel run on the host ------------------------------------------------------------
HOST_CHUNK = 64  # small chunks: many blocks per tensor, on few elements


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("no g++ to run the kernel on the host")
    folder = tmp_path_factory.mktemp("kernels")
    return {dtype: host_kernel(dtype, folder, chunk=HOST_CHUNK) for dtype in DTYPES}


def _launch(run, layout, sources, destinations, scale=1.0, divisor=1, threads=32):
    table = copy_table(layout, sources, destinations)
    scale, divisor = scale_arguments("int32" if divisor > 1 else "float32", scale, divisor)
    run(table.ctypes.data, len(layout.counts), scale, divisor, layout.blocks, threads)


def _values(dtype: str, count: int, rng: np.random.Generator) -> np.ndarray:
    """Test data as the runtime's numpy dtype (bfloat16 through ml_dtypes)."""
    if dtype == "bool":
        return rng.integers(0, 2, count).astype(np.bool_)
    if dtype in INTEGER:
        info = np.iinfo(np.dtype(dtype))
        low, high = max(info.min, -1000), min(info.max, 1000)
        return rng.integers(low, high, count).astype(np.dtype(dtype))
    numpy_type = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    return (rng.standard_normal(count) * 100).astype(numpy_type)


def _bits(array: np.ndarray, dtype: str) -> np.ndarray:
    return array.view(storage_dtype(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_pack_then_unpack_of_ragged_tensors(host_kernels, dtype):
    """Pack (prescaled, a joined rank's zeros), then unpack (postscaled or divided,
    a missing output skipped): Horovod's CPU arithmetic, bit for bit."""
    run = host_kernels[dtype]
    rng = np.random.default_rng(len(dtype))
    counts = (1, 0, HOST_CHUNK, 3 * HOST_CHUNK + 5, 17, 0, 2 * HOST_CHUNK - 1)
    tensors = [_values(dtype, count, rng) for count in counts]
    tensors[4] = None  # a joined rank: zeros
    layout = plan_layout(counts, chunk=HOST_CHUNK)
    buffer = np.full(layout.total, 7, dtype=tensors[0].dtype)
    prescale = 1.0 if dtype == "bool" else 0.37
    sources = [t.ctypes.data if t is not None else 0 for t in tensors]
    _launch(run, layout, *pack_pointers(layout, buffer.ctypes.data, buffer.itemsize,
                                        sources), scale=prescale)
    expected = np.zeros_like(buffer)
    for tensor, offset, count in zip(tensors, layout.offsets, counts):
        if tensor is not None:
            scale_into(expected[offset:offset + count], tensor, prescale)
    np.testing.assert_array_equal(_bits(buffer, dtype), _bits(expected, dtype))

    outputs = [np.full(count, 3, dtype=buffer.dtype) for count in counts]
    outputs[2] = None  # no output on this rank: left alone
    divisor = 3 if dtype in INTEGER and dtype != "bool" else 1
    postscale = 1.0 if divisor > 1 or dtype == "bool" else 1.9
    _launch(run, layout, *unpack_pointers(layout, buffer.ctypes.data, buffer.itemsize,
                                          [o.ctypes.data if o is not None else 0
                                           for o in outputs]),
            scale=postscale, divisor=divisor)
    for output, offset, count in zip(outputs, layout.offsets, counts):
        if output is None:
            continue
        want = buffer[offset:offset + count].copy()
        if divisor > 1:
            divide_toward_zero(want, divisor)
        else:
            scale_into(want, want, postscale)
        np.testing.assert_array_equal(_bits(output, dtype), _bits(want, dtype))


def test_bfloat16_rounds_to_nearest_even_and_keeps_nan(host_kernels):
    run = host_kernels["bfloat16"]
    values = np.array([1.0, 1.00390625, 1.01171875, -3.5, np.inf, np.nan, 0.0, -0.0],
                      dtype=ml_dtypes.bfloat16)
    out = np.zeros_like(values)
    layout = plan_layout((values.size,), chunk=HOST_CHUNK)
    for scale in (1.0, 1.0 + 2 ** -9, 3.0):
        _launch(run, layout, [values.ctypes.data], [out.ctypes.data], scale=scale)
        want = np.empty_like(values)
        scale_into(want, values, scale)
        np.testing.assert_array_equal(_bits(out, "bfloat16"), _bits(want, "bfloat16"))


def test_the_real_chunk_covers_a_resnet_sized_layout():
    """The production chunk on ResNet-50's 161 gradient sizes: every element belongs
    to exactly one block (checked on the plan; a grid this size is slow to emulate)."""
    counts = tuple(resnet50_gradient_counts())
    layout = plan_layout(counts)
    assert len(counts) == 161 and layout.total == 25_557_032
    owned = np.diff(layout.first_block) * CHUNK_ELEMENTS
    assert (owned >= np.array(counts)).all()
    assert (owned - np.array(counts) < CHUNK_ELEMENTS).all()


def resnet50_gradient_counts() -> list[int]:
    from gpu.resnet50 import resnet50_parameter_shapes  # tests/gpu, importable: no GPU needed
    return [int(np.prod(shape)) for shape in resnet50_parameter_shapes()]
