"""tests/gpu runs only where there is a CUDA device, torch with CUDA and CuPy with NCCL;
elsewhere every test in it is skipped with the reason (CI has no GPU), and the run's
summary says so in a section of its own: how many did not run, why, and how to run them.
On a GPU machine, tests/gpu/run_on_gpu.sh runs them with the GPU benchmark."""
from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def why_no_gpu() -> str | None:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        return f"no torch ({exc})"
    if not torch.cuda.is_available():
        return "no CUDA device (tests/gpu needs a GPU, torch with CUDA and CuPy with NCCL)"
    from horovodish.common.execution.cuda import load_nccl, why_not
    problem = why_not(load_nccl)
    return None if problem is None else f"CuPy's NCCL does not load: {problem}"


# What did not run here: (number of tests, why), for the terminal summary.
_NOT_RUN: list[tuple[int, str]] = []


def pytest_collection_modifyitems(config, items):
    mine = [item for item in items if HERE in Path(str(item.fspath)).parents]
    if not mine:
        return
    reason = why_no_gpu()
    if reason is not None:
        for item in mine:
            item.add_marker(pytest.mark.skip(reason=reason))
        _NOT_RUN.append((len(mine), reason))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """A skipped GPU suite is not a passed one: say so where the run ends."""
    for count, reason in _NOT_RUN:
        terminalreporter.section("GPU suite not run", sep="=", yellow=True, bold=True)
        terminalreporter.line(f"{count} tests in tests/gpu did not run: {reason}.",
                              yellow=True, bold=True)
        terminalreporter.line("Run them on a GPU machine: bash tests/gpu/run_on_gpu.sh "
                              "(docs/gpu.md).")
