"""``horovodishrun --check-build``: what this installation can do, in Horovod's checkbox style.

Why: the first question on any bug report is "which frameworks, backends and MPI do you
have?"; this answers it by actually importing them, not by reading package metadata.
"""
from __future__ import annotations

import subprocess
import sys
from importlib import metadata

from .mpirun import locate

# Each probe runs in its own interpreter, all in parallel: a framework that crashes or
# floods stderr on import cannot take the report down, and the slow imports overlap.
_VERSION = "import importlib; m = importlib.import_module({0!r}); print(getattr(m, '__version__', '?'))"
PROBES = {
    "torch": _VERSION.format("torch"),
    "tensorflow": _VERSION.format("tensorflow"),
    "keras": _VERSION.format("keras"),
    "mpi": ("import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
            "print(' '.join(MPI.Get_library_version().splitlines()[0].split()), "
            "f'(mpi4py {mpi4py.__version__})')"),
    "nccl": ("from cupy.cuda import nccl, runtime; "
             "assert getattr(nccl, 'available', True) and runtime.getDeviceCount() > 0; "
             "print(nccl.get_version())"),
}
FRAMEWORKS = (("PyTorch", "torch"), ("TensorFlow", "tensorflow"), ("Keras", "keras"))


def _box(ok: bool) -> str:
    return "[X]" if ok else "[ ]"


def probe_all(timeout: float = 120.0) -> dict[str, str | None]:
    """Run every probe; name -> first stdout line on success, None on any failure."""
    procs = {name: subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    text=True, errors="replace")
             for name, code in PROBES.items()}
    results: dict[str, str | None] = {}
    for name, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            results[name] = None
            continue
        lines = out.strip().splitlines()
        results[name] = lines[-1].strip() if proc.returncode == 0 and lines else None
    return results


def report() -> str:
    """The full report text."""
    try:
        version = metadata.version("horovodish")
    except metadata.PackageNotFoundError:
        version = "unknown"
    lines = [f"horovodish v{version}:", "", "Available Frameworks:"]
    found = probe_all()
    for label, module in FRAMEWORKS:
        ver = found[module]
        lines.append(f"    {_box(ver is not None)} {label}" + (f" {ver}" if ver else ""))
    mpi_lib = found["mpi"]
    lines += ["", "Available Backends:",
              f"    {_box(mpi_lib is not None)} MPI",
              f"    {_box(mpi_lib is not None)} Ring",
              f"    {_box(found['nccl'] is not None)} NCCL" + (f" {found['nccl']}" if found['nccl'] else ""), "", "MPI:"]
    lines.append(f"    {_box(mpi_lib is not None)} MPI library: {mpi_lib or 'mpi4py not importable'}")
    runner = locate()
    if runner is None:
        lines.append("    [ ] mpirun: not found (pip install mpich)")
    else:
        lines.append(f"    [X] mpirun: {runner.path} ({runner.flavour})")
    return "\n".join(lines)
