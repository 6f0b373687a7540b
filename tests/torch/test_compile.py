"""torch.compile with DistributedOptimizer (tests/torch/workers/compile_worker.py, 2 ranks):
compiled models end on eager's weights (inductor default and reduce-overhead modes, the
bucketed backend, the sharded optimizer), reductions overlap a compiled backward cut by
hvd.compile_backend, and collectives inside compiled functions run eagerly or fail
clearly under fullgraph=True. Without a C++ compiler inductor cannot run: aot_eager
stands in, and the test says so."""
from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "compile_worker.py"
CHECKS = ["compiled_equals_eager", "overlap_with_compiled_backward",
          "collectives_inside_compiled_functions"]


@pytest.mark.skipif(not hasattr(torch.library, "custom_op"),
                    reason="the worker declares its test op with torch.library.custom_op "
                           f"(torch 2.4); this is torch {torch.__version__}")
def test_torch_compile():
    backend = "inductor" if shutil.which("c++") or shutil.which("g++") else "aot_eager"
    if backend != "inductor":
        warnings.warn("no C++ compiler: torch.compile's inductor replaced by aot_eager")
    result = run_ranks(WORKER, 2, env={"COMPILE_BACKEND": backend}, timeout=300)
    assert_ranks_ok(result, 2, CHECKS)
