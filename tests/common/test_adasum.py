"""Adasum on 2 and 4 ranks against numpy; a clear error on 3."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "adasum_worker.py"


@pytest.mark.parametrize("np", [2, 3, 4])
def test_adasum(np):
    result = run_ranks(WORKER, np)
    assert_ok(result)
    assert result.stdout.count("OK rank") == np, result.stdout
