"""The torch suite's core on the oldest torch horovodish supports: torch 2.0.1, the newest
that Horovod builds against. Gradient hooks go through torch 2.0's gradient accumulators
there (horovodish/torch/grad_ready.py), so DistributedOptimizer (per-tensor, flat and
sharded), SyncBatchNorm, elastic and every collective run the same tests as on today's
torch, in a pytest of that interpreter.

The interpreter is ``.venv-torch2.0/bin/python`` (README: set up), or the one named by
HOROVODISH_OLDEST_TORCH_PYTHON; without either the test skips."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = os.environ.get("HOROVODISH_OLDEST_TORCH_PYTHON",
                        str(ROOT / ".venv-torch2.0" / "bin" / "python"))
# Every op and dtype; the optimizer with flat buckets, SyncBatchNorm and Adasum; elastic
# state and retry; the sharded optimizer with a checkpoint moved from 2 ranks to 3.
SELECTED = ["tests/torch/test_collectives.py::test_every_op_dtype_and_shape[2]",
            "tests/torch/test_training.py::test_optimizer_collective_gradients_and_sync_batch_norm[2]",
            "tests/torch/test_training.py::test_adasum_delta_optimizer[2]",
            "tests/torch/test_training.py::test_elastic_state_and_retry",
            "tests/torch/test_zero.py::test_sharded_optimizer_on_2_and_3_ranks_with_a_checkpoint_from_2_to_3"]


@pytest.mark.skipif(not Path(PYTHON).exists(),
                    reason=f"no Python with torch 2.0 at {PYTHON} (README: set up)")
def test_the_torch_suite_core_on_torch_2_0():
    version = subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, timeout=120).stdout.strip()
    assert version.startswith("2.0."), f"{PYTHON} has torch {version!r}, not 2.0"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = os.pathsep.join([str(Path(PYTHON).parent), env.get("PATH", "")])
    done = subprocess.run([PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SELECTED],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and f"{len(SELECTED)} passed" in out, out[-6000:]
