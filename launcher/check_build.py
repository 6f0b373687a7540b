"""``horovodishrun --check-build``: what this installation can do, in Horovod's checkbox style.

Why: the first question on any bug report is "which frameworks, backends and MPI do you
have?"; this answers it by actually importing them, not by reading package metadata.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from importlib import metadata

from . import allocation
from .mpirun import locate

FRAMEWORKS = (("PyTorch", "torch"), ("TensorFlow", "tensorflow"), ("Keras", "keras"))
# Probe groups, each run in its own interpreter, all in parallel: a framework that crashes
# or floods stderr on import cannot take the report down, and the slow imports overlap.
# Keras shares TensorFlow's interpreter because importing it imports TensorFlow anyway.
GROUPS = (("torch",), ("tensorflow", "keras"), ("mpi",), ("cupy", "nccl", "gpu_path"))


def _mpi() -> str:
    import mpi4py
    mpi4py.rc.initialize = False  # MPI_Get_library_version needs no MPI_Init
    mpi4py.rc.finalize = False
    from mpi4py import MPI
    first = MPI.Get_library_version().strip().splitlines()[0]
    return f"{' '.join(first.split())} (mpi4py {mpi4py.__version__})"


def _cupy() -> str:
    """CuPy with its CUDA runtime (a GPU need not be present: the count says)."""
    from horovodish.common.execution.cuda import cuda_runtime_version, load_cupy
    cupy = load_cupy()
    runtime = cuda_runtime_version()
    try:
        gpus = f"{cupy.cuda.runtime.getDeviceCount()} GPU(s)"
    except Exception:  # a driver without a device raises here
        gpus = "no GPU"
    return f"{cupy.__version__} (CUDA runtime {runtime // 1000}.{runtime % 1000 // 10}, {gpus})"


def _nccl() -> str:
    from horovodish.common.execution.cuda import nccl_version
    code = nccl_version()  # 22805, or 2805 before NCCL 2.9
    major, rest = divmod(code, 10000) if code >= 20900 else divmod(code, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def _gpu_path() -> str:
    """The path this environment gives CUDA tensors (HOROVODISH_GPU_OPERATIONS ...)."""
    from horovodish.common.config import Config
    from horovodish.common.execution.cuda import (AUTO, HOST_STAGED, NCCL,
                                                  choose_gpu_operations, nccl_loads)
    try:
        gpu = choose_gpu_operations(Config.from_env())
    except ValueError as exc:  # what init() would raise
        return f"init() would fail: {exc}"
    names = {NCCL: "NCCL", HOST_STAGED: "staged through host memory, MPI"}
    names[AUTO] = names[NCCL if nccl_loads() else HOST_STAGED] + " (the default)"
    if gpu.allreduce == gpu.others:
        return names[gpu.others]
    return f"allreduce: {names[gpu.allreduce]}; others: {names[gpu.others]}"


def _check(name: str) -> str:
    """Version string of ``name`` if usable here; raises otherwise."""
    if name == "mpi":
        return _mpi()
    if name == "cupy":
        return _cupy()
    if name == "nccl":
        return _nccl()
    if name == "gpu_path":
        return _gpu_path()
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
              row("NCCL (CuPy)", found["nccl"]), "", "CUDA:",
              row("CuPy:", found["cupy"], found["cupy"] or "not importable "
                  "(pip install horovodish[cuda12] or [cuda13])"),
              f"    CUDA tensors: {found['gpu_path'] or 'unknown (the probe failed)'}",
              "", "MPI:",
              row("MPI library:", mpi, mpi or "mpi4py not importable"),
              row("mpirun:", runner and runner.path,
                  f"{runner.path} ({runner.flavour})" if runner
                  else "not found (pip install mpich)"),
              f"    Ranks go to: {allocation.describe(os.environ)}"]
    return "\n".join(lines)


if __name__ == "__main__":  # probe mode: python -m horovodish.launcher.check_build NAME...
    for _name in sys.argv[1:]:
        try:
            _version = _check(_name)
        except BaseException:  # anything at all means "not available"
            continue
        print(f"{_TAG}{_name} {_version}", flush=True)
