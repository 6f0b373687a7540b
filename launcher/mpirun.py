"""Find ``mpirun`` and tell MPICH Hydra from Open MPI.

Why: the two take different flags (``-genv`` vs ``-x``, ``-f`` vs ``--hostfile``), and the
``mpirun`` that matches this Python environment (e.g. the ``mpich`` wheel in the venv) should
win over whatever happens to be first on PATH.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

NAMES = ("mpirun", "mpiexec")
MISSING_MESSAGE = ("horovodishrun: no mpirun found; install one with: pip install mpich "
                   '(or pip install "horovodish[mpich]")')


@dataclass(frozen=True)
class MpiRun:
    """An mpirun executable and its flavour: "mpich" (Hydra), "openmpi" or "unknown"."""

    path: str
    flavour: str


def find_mpirun(exe_dir: str | os.PathLike | None = None,
                search_path: str | None = None) -> str | None:
    """Path of mpirun/mpiexec: next to the interpreter first, then on PATH; None if absent.

    ``exe_dir`` defaults to the directory of ``sys.executable`` (not resolved: in a venv
    that is the venv's bin); ``search_path`` defaults to ``$PATH``.
    """
    exe_dir = Path(exe_dir if exe_dir is not None else os.path.dirname(sys.executable))
    for name in NAMES:
        candidate = exe_dir / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    path = os.environ.get("PATH", os.defpath) if search_path is None else search_path
    for name in NAMES:
        found = shutil.which(name, path=path)
        if found:
            return found
    return None


def classify(version_text: str) -> str:
    """Flavour from ``mpirun --version`` output."""
    if "HYDRA build details" in version_text or "Intel(R) MPI" in version_text:
        return "mpich"
    if any(s in version_text for s in ("Open MPI", "OpenRTE", "mpirun (Open MPI)")):
        return "openmpi"
    return "unknown"


def detect_flavour(path: str, timeout: float = 20.0) -> str:
    """Run ``path --version`` and classify it; "unknown" when it fails or says nothing known."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL, errors="replace")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return classify(out.stdout + out.stderr)


def locate(exe_dir: str | None = None, search_path: str | None = None) -> MpiRun | None:
    """Find mpirun and detect its flavour in one step; None when there is no mpirun."""
    path = find_mpirun(exe_dir, search_path)
    return None if path is None else MpiRun(path, detect_flavour(path))
