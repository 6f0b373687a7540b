"""The one way tests start multi-rank jobs: ``run_ranks``, then ``assert_ranks_ok``
for workers written with tests/worker_support.py (or ``assert_ok`` for a bare exit code).

Why one helper: every multi-rank test then goes through the real launcher (so the launcher
is exercised everywhere), gets unbuffered, interleaved stdout+stderr for its failure
message, and can never hang the suite: on timeout the whole job tree is killed and the
test fails with whatever the ranks had printed.

Example (the worker's checks are the functions it passes to worker_support.run_checks)::

    from multirank import assert_ranks_ok, run_ranks

    def test_allreduce():
        result = run_ranks(Path(__file__).parent / "workers" / "allreduce_worker.py", np=2)
        assert_ranks_ok(result, 2, ["sum", "average"])

Ranks run unbuffered and mpirun merges their output by chunks, so a line that a test will
parse should leave a rank in one write: ``sys.stdout.write(f"rank {r}: ...\\n")``, as
worker_support does. (``print`` writes the text and the newline separately, and two ranks'
lines can then mix.)
"""
from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

from horovodish.launcher.process import kill_tree


def run_ranks(script: str | Path, np: int, args: Sequence[str] = (),
              env: Mapping[str, str] | None = None,
              timeout: float = 120, hosts: str | None = None,
              launch_on: Sequence[str] = (),
              launcher_args: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """Run ``horovodishrun -np N [-H hosts] python script args...``; return it with output
    captured.

    ``result.stdout`` holds stdout and stderr of all ranks and the launcher (``stderr`` is
    None). The ranks see ``os.environ`` plus ``env`` plus ``PYTHONUNBUFFERED=1``.
    ``launch_on`` prefixes the launcher's argv (the emulated cluster's on-host h1, say);
    ``launcher_args`` are more of horovodishrun's flags.
    Raises AssertionError (with the output so far) if the job outlives ``timeout`` seconds.
    """
    cmd = [*launch_on, sys.executable, "-m", "horovodish.launcher", "-np", str(np),
           *(["-H", hosts] if hosts else []), *launcher_args,
           sys.executable, str(script), *map(str, args)]
    return run_command(cmd, env, timeout)


def run_command(cmd: Sequence[str], env: Mapping[str, str] | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a job's command (a launcher: torchrun, srun, horovodishrun) as run_ranks
    does: output merged, and on timeout the whole tree killed and the test failed."""
    cmd = [str(part) for part in cmd]
    full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, env=full_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)  # launcher, mpirun, proxies and ranks
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            out = "<output unavailable: a process kept the pipe open>"
        raise AssertionError(f"job timed out after {timeout} s: {' '.join(cmd)}\n"
                             f"--- output ---\n{out}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout=out, stderr=None)


def run_environment_ranks(script: str | Path, np: int, args: Sequence[str] = (),
                          env: Mapping[str, str] | None = None, timeout: float = 120,
                          ranks: Sequence[int] | None = None, port: int | None = None,
                          ) -> subprocess.CompletedProcess:
    """Start ``python script args`` np times with nothing but RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT (a free port) to go on, as Kubeflow's PyTorchJob,
    SageMaker or AzureML start a job; ``ranks``: start only these of the np; ``port``:
    MASTER_PORT (default: a free one). Returns
    every rank's output, merged, with the first non-zero exit code."""
    port = port or free_port()
    base = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1", "WORLD_SIZE": str(np),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    read, write = os.pipe()
    procs = []
    try:
        for rank in (range(np) if ranks is None else ranks):
            procs.append(subprocess.Popen(
                [sys.executable, str(script), *map(str, args)], env={**base, "RANK": str(rank)},
                stdin=subprocess.DEVNULL, stdout=write, stderr=write, start_new_session=True))
    finally:
        os.close(write)
    with os.fdopen(read, errors="replace") as merged:
        reader = _Reader(merged)
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for each in procs:
                    kill_tree(each.pid)
                raise AssertionError(f"job timed out after {timeout} s: {script}\n"
                                     f"--- output ---\n{reader.text(10)}") from None
        out = reader.text(30)
    code = next((p.returncode for p in procs if p.returncode), 0)
    return subprocess.CompletedProcess([str(script)], code, stdout=out, stderr=None)


class _Reader:
    """Reads a pipe to its end in a thread (so that no writer blocks on a full pipe)."""

    def __init__(self, stream) -> None:
        self.chunks: list[str] = []
        self.thread = threading.Thread(target=lambda: self.chunks.extend(stream), daemon=True)
        self.thread.start()

    def text(self, wait: float) -> str:
        self.thread.join(wait)
        return "".join(self.chunks)


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def assert_ok(result: subprocess.CompletedProcess) -> None:
    """Assert the job exited 0; the failure message carries the full output."""
    assert result.returncode == 0, (
        f"job failed with exit code {result.returncode}: {' '.join(map(str, result.args))}\n"
        f"--- output ---\n{result.stdout}")


_CHECK_LINE = re.compile(r"^CHECK (\S+) rank (\d+)/(\d+): (ok|FAILED)(?:: (.*)| \(.*\))?$",
                         re.MULTILINE)
_DONE_LINE = re.compile(r"^DONE rank (\d+)/(\d+): (\d+) passed, (\d+) failed$", re.MULTILINE)
# A rank that ended the job because its check raised while the others did not finish it.
_ABORT_LINE = re.compile(r"^ABORT rank (\d+)/\d+: (.*)$", re.MULTILINE)


def assert_ranks_ok(result: subprocess.CompletedProcess, np: int,
                    checks: Sequence[str] = ()) -> None:
    """Every rank of a worker using tests/worker_support.py ran every check and each
    passed. The failure message says first which rank ended the job, if one did
    (worker_support's ABORT line), then lists each failed or missing check by name and
    rank, then the job's whole output."""
    reports = {(name, int(rank)): (status, detail or "")
               for name, rank, _, status, detail in _CHECK_LINE.findall(result.stdout)}
    done = {int(rank) for rank, *_ in _DONE_LINE.findall(result.stdout)}
    names = list(dict.fromkeys([*checks, *(name for name, _ in reports)]))
    problems = [f"  rank {rank} ended the job: {why}"
                for rank, why in _ABORT_LINE.findall(result.stdout)]
    for name in names:
        for rank in range(np):
            status, detail = reports.get((name, rank), ("missing", ""))
            if status != "ok":
                problems.append(f"  {name} on rank {rank}: {status}"
                                + (f": {detail}" if detail else ""))
    problems += [f"  rank {rank} did not finish its checks" for rank in range(np)
                 if rank not in done]
    if not names:
        problems.append("  no check reported at all")
    if result.returncode != 0 and not problems:
        problems.append(f"  the job exited with code {result.returncode}")
    assert not problems, ("checks failed:\n" + "\n".join(problems)
                          + f"\n--- command ---\n{' '.join(map(str, result.args))}"
                          + f"\n--- output ---\n{result.stdout}")


def assert_digits_example(result: subprocess.CompletedProcess, np: int,
                          accuracy: float = 0.95) -> None:
    """A digits example ran on np ranks, rank 0 alone printed its accuracy, and it is
    at least ``accuracy``."""
    assert_ok(result)
    lines = re.findall(r"^test accuracy: (\d\.\d+)$", result.stdout, re.MULTILINE)
    assert len(lines) == 1, f"rank 0 alone must print the accuracy once:\n{result.stdout}"
    assert float(lines[0]) >= accuracy, result.stdout
    assert re.search(rf"^ranks: {np}, wall time: [\d.]+ s$", result.stdout, re.MULTILINE), \
        result.stdout


def assert_synthetic_benchmark(script: str | Path) -> None:
    """A synthetic benchmark example runs briefly on 2 ranks and prints its total rate."""
    result = run_ranks(script, 2, args=["--model", "mlp", "--num-warmup-batches", "1",
                                        "--num-batches-per-iter", "2", "--num-iters", "2",
                                        "--fp16-allreduce"], timeout=120)
    assert_ok(result)
    assert re.search(r"Total img/sec on 2 CPU\(s\): [\d.]+", result.stdout), result.stdout


def import_worker(script: str | Path) -> ModuleType:
    """A worker script's definitions (its model, data, schedule), for a test's own
    reference in one process: imported from its file, once, as a module named after its
    path (worker folders are not on the path: their scripts' names repeat by area).
    Running it as a script stays guarded by ``__name__ == "__main__"``."""
    path = Path(script).resolve()
    name = "worker:" + str(path)
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
