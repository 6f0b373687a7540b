"""The PyTorch examples run and reach their stated results."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from multirank import assert_ok, run_ranks

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.mark.parametrize("np", [1, 2])
def test_digits_reaches_95_percent(np):
    result = run_ranks(EXAMPLES / "pytorch_digits.py", np, timeout=180)
    assert_ok(result)
    lines = re.findall(r"^test accuracy: (\d\.\d+)$", result.stdout, re.MULTILINE)
    assert len(lines) == 1, f"rank 0 alone must print the accuracy once:\n{result.stdout}"
    assert float(lines[0]) >= 0.95, result.stdout
    assert re.search(rf"^ranks: {np}, wall time: [\d.]+ s$", result.stdout, re.MULTILINE), \
        result.stdout


def test_synthetic_benchmark_runs():
    result = run_ranks(EXAMPLES / "pytorch_synthetic_benchmark.py", 2,
                       args=["--model", "mlp", "--num-warmup-batches", "1",
                             "--num-batches-per-iter", "2", "--num-iters", "2",
                             "--fp16-allreduce"], timeout=120)
    assert_ok(result)
    assert re.search(r"Total img/sec on 2 CPU\(s\): [\d.]+", result.stdout), result.stdout


def test_ddp_compare_runs_and_matches_ddp_updates():
    result = run_ranks(EXAMPLES / "pytorch_ddp_compare.py", 2,
                       args=["--steps", "3", "--rounds", "2", "--warmup", "1"], timeout=120)
    assert_ok(result)
    match = re.search(r"ratio horovodish / DDP: [\d.]+x \(median of per-round ratios\); largest "
                      r"weight difference between the two models: (\S+)$", result.stdout, re.MULTILINE)
    assert match, result.stdout
    assert float(match.group(1)) < 1e-5, result.stdout  # both did the same averaged updates
