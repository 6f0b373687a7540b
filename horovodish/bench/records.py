"""Measurement records: one JSON file per run, with what was measured, on what, how.

A record is ``{"kind", "time", "command", "machine", "figures"}``: ``kind`` names what
wrote it (``bench``, ``horovod-suites``, ``gpu``), ``time`` is UTC in ISO form,
``command`` the command line that reproduces it (records kept from before this format
carry only a date and a ``sequence`` number that orders them), ``machine`` the hardware and software
(:func:`machine`), ``figures`` whatever that kind measures. Records live in a folder
(``docs/records`` in the repository) and are never edited: the history of a figure is
the series of its records, and ``python -m horovodish.bench.render`` puts the latest of
each kind into the docs.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import horovodish


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2 ** 20, 1)
    except OSError:
        pass
    return None


def _commit() -> str | None:
    """The source tree's commit, when horovodish runs from a git checkout."""
    source = Path(horovodish.__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _versions() -> dict[str, str]:
    """Installed versions (from package metadata: nothing is imported for this)."""
    versions = {"python": platform.python_version(), "horovodish": horovodish.__version__}
    for module, package in (("numpy", "numpy"), ("mpi4py", "mpi4py"), ("torch", "torch"),
                            ("tensorflow", "tensorflow-cpu"), ("tensorflow", "tensorflow"),
                            ("keras", "keras"), ("jax", "jax"), ("cupy", "cupy")):
        loaded = sys.modules.get(module)
        if loaded is not None:
            versions[module] = str(getattr(loaded, "__version__", "?"))
            continue
        try:
            versions.setdefault(module, metadata.version(package))
        except metadata.PackageNotFoundError:
            pass
    mpi4py = sys.modules.get("mpi4py.MPI")
    if mpi4py is not None:
        versions["mpi"] = " ".join(mpi4py.Get_library_version().splitlines()[0].split())
    return versions


def machine() -> dict[str, Any]:
    """The hardware and software a figure was measured on."""
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "memory_gib": _memory_gib(),
            "system": f"{platform.system()} {platform.release()}",
            "versions": _versions(), "commit": _commit()}


def write(folder: str | Path, kind: str, figures: Any, command: str,
          extra_machine: dict[str, Any] | None = None) -> Path:
    """Write a new record into ``folder``; returns its path."""
    now = datetime.datetime.now(datetime.timezone.utc)
    record = {"kind": kind, "time": now.isoformat(timespec="seconds"), "command": command,
              "machine": {**machine(), **(extra_machine or {})}, "figures": figures}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}-{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def load(folder: str | Path, kind: str) -> list[dict[str, Any]]:
    """Every record of ``kind`` in ``folder``, oldest first."""
    records = []
    for path in sorted(Path(folder).glob(f"{kind}-*.json")):
        record = json.loads(path.read_text())
        if record.get("kind") == kind:
            records.append(record)
    return sorted(records, key=lambda r: (r["time"], r.get("sequence", 0)))


def bench_kind(ranks: int) -> str:
    """The kind of a ``python -m horovodish.bench`` record: ``bench`` at 2 ranks (the
    reference run the docs' tables show), ``bench-<n>-ranks`` otherwise, so that a run
    at another size never takes the place of the reference run's tables."""
    return "bench" if ranks == 2 else f"bench-{ranks}-ranks"


def load_bench_runs(folder: str | Path) -> list[dict[str, Any]]:
    """Every bench record at any number of ranks, oldest first."""
    runs = [r for path in Path(folder).glob("bench-*.json")
            for r in [json.loads(path.read_text())]
            if re.fullmatch(r"bench(-\d+-ranks)?", r.get("kind", ""))]
    return sorted(runs, key=lambda r: (r["time"], r.get("sequence", 0)))


def latest(folder: str | Path, kind: str) -> dict[str, Any] | None:
    records = load(folder, kind)
    return records[-1] if records else None
