"""The arithmetic every backend shares: reductions, scaling and integer Average.

Kept in one place so that every path (fusion buffer, shared memory, reducescatter)
rounds exactly alike, and alike with Horovod (tests/common/test_scaling.py).
"""
from __future__ import annotations

import numpy as np

from ..dtypes import HALF_PRECISION, bfloat16
from ..messages import ReduceOp

REDUCE_UFUNC = {
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}
BOOL_UFUNC = {
    ReduceOp.SUM: np.logical_or,
    ReduceOp.MAX: np.logical_or,
    ReduceOp.MIN: np.logical_and,
    ReduceOp.PRODUCT: np.logical_and,
}


def reduce_ufunc(dtype: np.dtype, op: ReduceOp) -> np.ufunc:
    """The elementwise reduction for op; Average arrives here as Sum."""
    table = BOOL_UFUNC if dtype == np.bool_ else REDUCE_UFUNC
    return table[op]


def divide_toward_zero(buf: np.ndarray, divisor: int) -> None:
    """Integer Average, in place: the quotient truncated toward zero (-3 / 2 is -1), as
    Horovod's scaling by 1/size and C's cast give it; exact for every int64."""
    if np.issubdtype(buf.dtype, np.unsignedinteger):
        np.floor_divide(buf, divisor, out=buf)
        return
    inexact = np.remainder(buf, divisor) != 0
    np.floor_divide(buf, divisor, out=buf)
    buf += inexact & (buf < 0)  # a negative quotient that floor took one too far


# Packing many small tensors, scaling the packed buffer in one pass beats one scaled
# copy per tensor: each call costs about 4 us, and a pass over a buffer still in cache
# costs about that per 64 KiB (a 256 x 16 KiB burst's pack: 1.1 ms in 256 calls).
SCALE_ONCE_MEAN_BYTES = 64 << 10


def scale_once(nbytes: int, tensors: int) -> bool:
    """Whether to pack tensors totalling nbytes unscaled and then scale them in one pass
    (elementwise, so the same values either way)."""
    return tensors > 1 and nbytes <= tensors * SCALE_ONCE_MEAN_BYTES


def scale_into(out: np.ndarray, source: np.ndarray, factor: float) -> None:
    """out = source * factor with Horovod's arithmetic per dtype (out may be source)."""
    # Half-precision values are scaled in float32 and rounded once, as Horovod's CPU
    # scaling does (its float16 kernel widens to float); numpy would otherwise multiply
    # in the half type itself and round the factor first. Integers are scaled in
    # float64 and truncated toward zero by the cast back (a float64 product, then C's
    # conversion). (dtypes, not names: an array's dtype.name costs about 2 us, the
    # call's own multiply of a small tensor about 1.)
    dtype = source.dtype
    if dtype in HALF_PRECISION or (dtype.kind == "V" and dtype == bfloat16()):
        np.multiply(source, np.float32(factor), out=out, dtype=np.float32, casting="unsafe")
    else:
        np.multiply(source, factor, out=out, casting="unsafe")
