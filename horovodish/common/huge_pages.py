"""Whether this process's memory can get transparent huge pages, and what to tell a job
that runs without glibc's tunable for them.

glibc's ``glibc.malloc.hugetlb=1`` (which ``horovodishrun`` gives every rank) puts what
malloc maps on huge pages: MPI's own buffers and TensorFlow's tensors. Without it MPI
moved them 4 KiB page by page, and large collectives ran 1.3 to 1.7 times slower on a
2-core x86 machine (docs/tuning.md, section 4). It only takes effect when a process
starts, so a job started with plain ``mpirun`` can only be told.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

MALLOC_TUNABLE = "glibc.malloc.hugetlb"


def kernel_mode(path: Path = Path("/sys/kernel/mm/transparent_hugepage/enabled")) -> str:
    """The kernel's transparent huge page mode (always, madvise, never), or "unknown"."""
    try:
        text = path.read_text()
        return text[text.index("[") + 1:text.index("]")]
    except (OSError, ValueError):
        return "unknown"


def malloc_setting(environ: Mapping[str, str]) -> str:
    """The value this process's GLIBC_TUNABLES gives glibc.malloc.hugetlb ("unset" if
    none: glibc's default, no huge pages asked for)."""
    for item in environ.get("GLIBC_TUNABLES", "").split(":"):
        name, _, value = item.partition("=")
        if name == MALLOC_TUNABLE:
            return value
    return "unset"


def missing_tunable_hint(environ: Mapping[str, str], mode: str) -> str | None:
    """What to tell a job whose ranks run without the tunable where the kernel gives
    huge pages only to memory that asks (mode madvise, the usual default); None where
    there is nothing to gain (mode always gives them anyway, never not at all), or the
    tunable is named (with any value: ``=0`` keeps glibc's default and silences this)."""
    if malloc_setting(environ) != "unset" or mode != "madvise":
        return None
    return (f"the ranks run without GLIBC_TUNABLES={MALLOC_TUNABLE}=1, and this "
            "machine's kernel gives transparent huge pages only to memory that asks for "
            "them (mode madvise), so MPI's buffers and TensorFlow's tensors sit in 4 KiB "
            "pages (large collectives ran 1.3-1.7x slower in them: docs/tuning.md). "
            "horovodishrun sets it; "
            f"with another launcher, set GLIBC_TUNABLES={MALLOC_TUNABLE}=1 in the ranks' "
            "environment (mpirun: -x with Open MPI, -genv with MPICH; torchrun, srun and "
            f"the others pass their own environment on), or {MALLOC_TUNABLE}=0 to keep "
            "glibc's default without this warning (docs/configuration.md).")
