"""The TensorFlow / Keras examples run and reach their stated results."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from multirank import (assert_digits_example, assert_ok, assert_synthetic_benchmark,
                       run_ranks)

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.mark.parametrize("np", [2])
def test_keras_digits_reaches_95_percent(np):
    assert_digits_example(run_ranks(EXAMPLES / "keras_digits.py", np, timeout=180), np)


def test_synthetic_benchmark_runs():
    assert_synthetic_benchmark(EXAMPLES / "tensorflow2_synthetic_benchmark.py")


def test_mwms_compare_runs_and_matches_mwms_updates():
    """The many-variable model (8 blocks: 34 variables in flat buckets; the default 40
    blocks take twice as long to build and trace), against MWMS and plain Keras:
    the same averaged updates as MWMS, and the time each adds per variable."""
    result = run_ranks(EXAMPLES / "keras_mwms_compare.py", 2,
                       args=["--steps", "4", "--rounds", "1", "--warmup", "1",
                             "--model", "many", "--blocks", "8"], timeout=180)
    assert_ok(result)
    assert "34 variables (8 x Dense(64)" in result.stdout, result.stdout
    assert re.search(r"^time horovodish adds per variable: -?[\d.]+ us", result.stdout,
                     re.MULTILINE), result.stdout
    match = re.search(r"ratio horovodish / MWMS: [\d.]+x; largest weight difference between "
                      r"the two models: (\S+) \(largest change from the initial weights: "
                      r"(\S+)\)$", result.stdout, re.MULTILINE)
    assert match, result.stdout
    assert float(match.group(1)) < 1e-5, result.stdout  # both did the same averaged updates
    assert float(match.group(2)) > 1e-4, result.stdout  # and they did train
