"""Shared by the TensorFlow workers: quiet TF, per-dtype tolerances, deterministic per-rank
data. The workers check and report through tests/worker_support.py."""
from __future__ import annotations

import os
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402


def quiet_tensorflow() -> None:
    """Retracing notes (the workers trace on purpose) would bury the failures."""
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")


# worker_support.close(..., tol=FLOAT_TOL[dtype]) is np.allclose(rtol=tol, atol=tol); an
# integer or bool dtype (no entry: tol 0) compares exactly.
FLOAT_TOL = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-5, "float64": 1e-12}
F64_TOL = FLOAT_TOL["float64"]


def data(rank: int, name: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Rank's input for name: small integers, so sums are exact in every float type."""
    gen = np.random.default_rng(zlib.crc32(f"{name}/{rank}".encode()))
    if dtype == "bool":
        return gen.integers(0, 2, shape).astype(bool)
    low = 0 if dtype.startswith("uint") else -3
    values = gen.integers(low, 4, shape)
    if dtype == "bfloat16":
        import ml_dtypes
        return values.astype(ml_dtypes.bfloat16)
    return values.astype(dtype)
