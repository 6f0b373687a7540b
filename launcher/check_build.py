"""``horovodishrun --check-build``: what this installation can do, in Horovod's checkbox style.

Why: the first question on any bug report is "which frameworks, backends and MPI do you
have?"; this answers it by actually importing them, not by reading package metadata.
"""
from __future__ import annotations

import importlib
import subprocess
import sys
from importlib import metadata

from .mpirun import locate

FRAMEWORKS = (("PyTorch", "torch"), ("TensorFlow", "tensorflow"), ("Keras", "keras"))
# Probe groups, each run in its own interpreter, all in parallel: a framework that crashes
# or floods stderr on import cannot take the report down, and the slow imports overlap.
# Keras shares TensorFlow's interpreter because importing it imports TensorFlow anyway.
GROUPS = (("torch",), ("tensorflow", "keras"), ("mpi",), ("nccl",))


def _mpi() -> str:
    import mpi4py
    mpi4py.rc.initialize = False  # MPI_Get_library_version needs no MPI_Init
    mpi4py.rc.finalize = False
    from mpi4py import MPI
    first = MPI.Get_library_version().strip().splitlines()[0]
    return f"{' '.join(first.split())} (mpi4py {mpi4py.__version__})"


def _nccl() -> str:
    from cupy.cuda import nccl, runtime
    if not getattr(nccl, "available", True) or runtime.getDeviceCount() < 1:
        raise RuntimeError("no NCCL or no CUDA device")
    return str(nccl.get_version())


def _check(name: str) -> str:
    """Version string of ``name`` if usable here; raises otherwise."""
    if name == "mpi":
        return _mpi()
    if name == "nccl":
        return _nccl()
    module = importlib.import_module(name)
    return str(getattr(module, "__version__", "unknown version"))


def _box(ok: bool) -> str:
    return "[X]" if ok else "[ ]"


def probe_all(timeout: float = 120.0) -> dict[str, str | None]:
    """Run every probe group; name -> version on success, None on any failure."""
    procs = [subprocess.Popen([sys.executable, "-m", __name__, *group],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, errors="replace")
             for group in GROUPS]
    results: dict[str, str | None] = {name: None for group in GROUPS for name in group}
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        for line in out.splitlines():
            if line.startswith(_TAG):
                name, _, version = line[len(_TAG):].partition(" ")
                results[name] = version.strip()
    return results


_TAG = "@horovodish-probe "


def report() -> str:
    """The full report text."""
    try:
        version = metadata.version("horovodish")
    except metadata.PackageNotFoundError:
        version = "unknown"
    found = probe_all()

    def row(label: str, value: str | None, detail: str | None = None) -> str:
        text = detail if detail is not None else (value or "")
        return f"    {_box(value is not None)} {label}" + (f" {text}" if text else "")

    mpi = found["mpi"]
    runner = locate()
    lines = [f"horovodish v{version}:", "", "Available Frameworks:"]
    lines += [row(label, found[module]) for label, module in FRAMEWORKS]
    lines += ["", "Available Backends:", row("MPI", mpi, ""), row("Ring", mpi, ""),
              row("Shared memory", mpi, "(ranks on one host)"),
              row("Hierarchical", mpi, "(shared memory in each host, network between)"),
              row("NCCL", found["nccl"]), "", "MPI:",
              row("MPI library:", mpi, mpi or "mpi4py not importable"),
              row("mpirun:", runner and runner.path,
                  f"{runner.path} ({runner.flavour})" if runner
                  else "not found (pip install mpich)")]
    return "\n".join(lines)


if __name__ == "__main__":  # probe mode: python -m horovodish.launcher.check_build NAME...
    for _name in sys.argv[1:]:
        try:
            _version = _check(_name)
        except BaseException:  # anything at all means "not available"
            continue
        print(f"{_TAG}{_name} {_version}", flush=True)
