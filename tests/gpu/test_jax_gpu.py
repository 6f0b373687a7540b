"""JAX arrays on a CUDA device through NCCL (tests/gpu/workers/jax_gpu_worker.py) at 1
rank and at 2 ranks on the one GPU (each rank its own NCCL_HOSTID: distinct_hosts.py),
against numpy. Skipped without a GPU (conftest.py) or without a JAX that sees one."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "jax_gpu_worker.py"
DISTINCT_HOSTS = Path(__file__).parent / "distinct_hosts.py"
CHECKS = ["the_nccl_path_is_taken", "allreduce_every_op_and_dtype", "allgather_and_broadcast",
          "pytree_and_optimizer"]


def why_no_jax_gpu() -> str | None:
    """Asked in a child process: JAX must not claim the GPU in the one running pytest."""
    probe = subprocess.run(
        [sys.executable, "-c", "import jax, optax; print(len(jax.devices('gpu')))"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    if probe.returncode != 0 or not probe.stdout.strip().isdigit():
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"JAX (with optax) sees no GPU here: {last}"
    return None


@pytest.mark.parametrize("np", [1, 2])
def test_jax_arrays_on_the_gpu(np):
    reason = why_no_jax_gpu()
    if reason is not None:
        pytest.skip(reason)
    env = {"HOROVODISH_GPU_OPERATIONS": "nccl"}
    script, args = (DISTINCT_HOSTS, [WORKER]) if np > 1 else (WORKER, [])
    result = run_ranks(script, np, args=args, env=env,
                       timeout=float(os.environ.get("HOROVODISH_GPU_TEST_TIMEOUT", 240)))
    assert_ranks_ok(result, np, CHECKS)
