"""The PyTorch examples run and reach their stated results."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from multirank import (assert_digits_example, assert_ok, assert_synthetic_benchmark,
                       run_ranks)

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.mark.parametrize("np", [2])
def test_digits_reaches_95_percent(np):
    assert_digits_example(run_ranks(EXAMPLES / "pytorch_digits.py", np, timeout=180), np)


def test_synthetic_benchmark_runs():
    assert_synthetic_benchmark(EXAMPLES / "pytorch_synthetic_benchmark.py")


def test_ddp_compare_runs_and_matches_ddp_updates():
    """Both definition orders, small buckets (several per step): DDP and ours must end on
    the same weights, and every ratio line is printed."""
    result = run_ranks(EXAMPLES / "pytorch_ddp_compare.py", 2,
                       args=["--steps", "3", "--rounds", "2", "--warmup", "2",
                             "--definition-order", "both", "--bucket-cap-mb", "4"],
                       timeout=180)
    assert_ok(result)
    for order in ("use", "reversed"):
        assert re.search(rf"ratio horovodish / DDP \({order} order\): [\d.]+x", result.stdout), \
            result.stdout
    for who in ("horovodish", "ddp"):
        assert re.search(rf"{who}: reversed / use definition order: [\d.]+x", result.stdout), \
            result.stdout
    match = re.search(r"largest weight difference between DDP and horovodish: (\S+)",
                      result.stdout)
    assert match, result.stdout
    assert float(match.group(1)) < 1e-5, result.stdout  # both did the same averaged updates


def test_elastic_digits_reaches_95_percent():
    """Under the elastic launcher, with no failure (the tests in test_elastic_jobs.py
    kill ranks): it trains to the stated accuracy."""
    result = run_ranks(EXAMPLES / "pytorch_elastic_digits.py", 2, timeout=180,
                       args=["--epochs", "15", "--pace", "0"], launcher_args=["--min-np", "1"])
    assert_digits_example(result, 2)
    assert "generation 1: 2 ranks, pids " in result.stdout, result.stdout


def test_powersgd_compare_runs_and_sends_less():
    """The PowerSGD example (made for the emulated cluster) on one host, a small MLP: both
    step times are printed, and PowerSGD sends what its rank predicts: per matrix
    (rows + columns) x rank floats, biases exactly."""
    result = run_ranks(EXAMPLES / "pytorch_powersgd_compare.py", 2, timeout=180,
                       args=["--widths", "64,128,128,10", "--rank", "2", "--rounds", "2",
                             "--steps", "2"])
    assert_ok(result)
    assert re.search(r"powersgd-2 / exact: [\d.]+x step time", result.stdout), result.stdout
    match = re.search(r"bytes a step per rank: exact (\d+) .*, powersgd-2 (\d+) ",
                      result.stdout)
    assert match, result.stdout
    params = 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10
    compressed = (128 + 64) * 2 + (128 + 128) * 2 + (10 + 128) * 2 + 128 + 128 + 10
    assert (int(match.group(1)), int(match.group(2))) == (params * 4, compressed * 4)
