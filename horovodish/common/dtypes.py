"""The data types the runtime moves, as names every adapter agrees on.

Tensors cross into the core as numpy arrays; bfloat16 uses ml_dtypes' numpy type so the
ring backend can reduce it natively (MPI has no bfloat16). ml_dtypes is imported only when
a bfloat16 is first met: its import takes about 0.5 s of CPU, paid by every rank of a
job that never uses it (TensorFlow and JAX import it anyway; torch does not).
"""
from __future__ import annotations

import sys

import numpy as np

from .messages import ReduceOp

_NUMPY: dict[str, np.dtype] = {
    "uint8": np.dtype(np.uint8),
    "int8": np.dtype(np.int8),
    "uint16": np.dtype(np.uint16),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "uint32": np.dtype(np.uint32),
    "int64": np.dtype(np.int64),
    "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "bool": np.dtype(np.bool_),
}
_NAMES: dict[np.dtype, str] = {dtype: name for name, dtype in _NUMPY.items()}
# The half-precision floats met so far, which scaling widens to float32 (arithmetic.py):
# bfloat16 joins once loaded.
HALF_PRECISION: set[np.dtype] = {np.dtype(np.float16)}

SUPPORTED = ("uint8", "int8", "uint16", "int16", "int32", "uint32", "int64", "uint64",
             "float16", "bfloat16", "float32", "float64", "bool")
FLOATING = frozenset({"float16", "bfloat16", "float32", "float64"})
# MPI has no standard 16-bit float types, so these reduce in the ring backend.
MPI_REDUCIBLE = frozenset(SUPPORTED) - {"float16", "bfloat16"}


def bfloat16() -> np.dtype:
    """ml_dtypes' bfloat16, imported and registered on first use."""
    dtype = _NUMPY.get("bfloat16")
    if dtype is None:
        import ml_dtypes
        dtype = np.dtype(ml_dtypes.bfloat16)
        HALF_PRECISION.add(dtype)
        _NAMES[dtype] = "bfloat16"
        _NUMPY["bfloat16"] = dtype
    return dtype


def numpy_dtype(name: str) -> np.dtype:
    dtype = _NUMPY.get(name)
    return dtype if dtype is not None else bfloat16() if name == "bfloat16" else _NUMPY[name]


# The name of an array's dtype, or None (then dtype_name converts or says why): the
# lookup alone, where a submit of hundreds of small tensors pays for every call.
known_dtype_name = _NAMES.get


def dtype_name(dtype: np.dtype) -> str:
    """The runtime's name for a numpy dtype; TypeError for one it cannot move."""
    name = _NAMES.get(dtype)  # an array's dtype: no conversion needed
    if name is not None:
        return name
    if "ml_dtypes" in sys.modules:  # the caller's bfloat16, met before ours was loaded
        bfloat16()
    try:
        return _NAMES[np.dtype(dtype)]
    except KeyError:
        raise TypeError(
            f"dtype {np.dtype(dtype)} is not supported; supported: {', '.join(SUPPORTED)}"
        ) from None


def check_reduction(dtype: str, op: ReduceOp, prescale: float, postscale: float,
                    opname: str, tensor_name: str) -> None:
    """Reject reductions that make no sense for the dtype, before anything is sent."""
    if op == ReduceOp.ADASUM and dtype not in FLOATING:
        raise TypeError(f"{opname} of tensor '{tensor_name}': op Adasum needs a floating-point "
                        f"tensor, not {dtype}.")
    if dtype == "bool":
        if op in (ReduceOp.AVERAGE, ReduceOp.ADASUM):
            raise TypeError(
                f"{opname} of tensor '{tensor_name}': op {op.name.capitalize()} is not defined for bool "
                "tensors; use Sum (logical or), Min or Product (logical and), or Max."
            )
        if prescale != 1.0 or postscale != 1.0:
            raise TypeError(
                f"{opname} of tensor '{tensor_name}': scale factors are not defined for bool tensors."
            )
