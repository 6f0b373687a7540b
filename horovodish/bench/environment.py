"""What memory the run had: whether huge pages backed MPI's and the frameworks' buffers.

Ratios against MPI depend on it as much as on the runtime. glibc's
``glibc.malloc.hugetlb=1`` (which ``horovodishrun`` gives the ranks) made raw
``MPI_Allreduce`` 1.3 to 1.7 times faster at 1 and 64 MiB on a 2-core x86 machine,
and it covers TensorFlow's tensors; PyTorch's own switch covers torch's (docs/tuning.md,
section 4). The bench records both with its figures, so that runs are compared with
runs of the same kind.
"""
from __future__ import annotations

import os
from typing import Mapping

from ..common.huge_pages import kernel_mode, malloc_setting

__all__ = ["describe", "huge_pages", "kernel_mode", "malloc_setting"]


def huge_pages(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The run's huge-page settings, for its figures."""
    return {"kernel": kernel_mode(), "malloc": malloc_setting(environ),
            "torch": environ.get("THP_MEM_ALLOC_ENABLE", "unset")}


def describe(settings: Mapping[str, str]) -> str:
    """One line for the printed report."""
    malloc = {"1": "on", "unset": "off (glibc's default)"}.get(settings["malloc"],
                                                               settings["malloc"])
    return (f"huge pages: kernel mode {settings['kernel']}; for what malloc maps (MPI's "
            f"buffers, TensorFlow's tensors) {malloc}; torch's switch "
            f"{settings['torch']}. Ratios against MPI are comparable only between runs "
            "with the same settings (docs/tuning.md)")
