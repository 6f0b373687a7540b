"""Suites that cannot run here say so: the cluster tests fail under CI (CI=true) when the
machine cannot build the emulated cluster, and skip with the reason elsewhere; the GPU
suite, skipped without a GPU, gets a section of the run's summary that says what did
not run and how to run it. Each case is a pytest run of its own, in a subprocess."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A test of the cluster suite that needs no cluster of its own, only the machine.
CLUSTER_TEST = "tests/cluster/test_cluster.py::test_a_killed_creator_leaves_nothing_behind"


def _pytest(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "CI"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *args], cwd=ROOT, env={**environ, **env}, capture_output=True,
                          text=True, timeout=300)


# No tool on PATH: the emulated cluster needs ip, tc, nsenter and unshare (and root).
NO_TOOLS = {"PATH": "/nonexistent"}


def test_cluster_tests_fail_under_ci_when_the_machine_cannot_build_a_cluster():
    result = _pytest(CLUSTER_TEST, CI="true", **NO_TOOLS)
    assert result.returncode != 0, result.stdout
    assert "1 error" in result.stdout, result.stdout  # the fixture's failure, not a skip
    assert "CI=true, yet the cluster tests cannot run: the emulated cluster needs " \
        in result.stdout, result.stdout


def test_cluster_tests_skip_with_the_reason_elsewhere():
    result = _pytest(CLUSTER_TEST, **NO_TOOLS)
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout, result.stdout
    assert "the emulated cluster needs " in result.stdout, result.stdout


def _has_gpu() -> bool:
    import torch
    return torch.cuda.is_available()


@pytest.mark.skipif(_has_gpu(), reason="a GPU is here: tests/gpu runs")
def test_a_skipped_gpu_suite_is_named_in_the_summary_with_how_to_run_it():
    result = _pytest("tests/gpu")
    assert result.returncode == 0, result.stdout
    assert "GPU suite not run" in result.stdout, result.stdout
    assert "tests in tests/gpu did not run: no CUDA device" in result.stdout, result.stdout
    assert "bash tests/gpu/run_on_gpu.sh" in result.stdout, result.stdout
