"""``horovodish.run(fn, ...)``: Horovod's ``horovod.run``, a job that runs a Python
function on every rank and returns each rank's value.

    import horovodish
    results = horovodish.run(train, args=(epochs,), np=2, hosts="localhost:2")  # rank order

The job is an ordinary horovodishrun job (``horovodishrun -np N [-H ...] [--gloo]
python -m horovodish.launcher.function_task``), with the same flags Horovod's ``run``
maps to its launcher's. The function, cloudpickled, reaches every rank in a file of a
temporary directory of this process; each rank sends its outcome back over one TCP
connection to a listener here, which takes only connections that show this job's key
(multiprocessing's HMAC handshake), so ranks on other hosts report the same way. A rank
that raises fails the call with a RuntimeError naming that rank and its error (Horovod
returned nothing and printed the ranks' output; the output is printed here too).
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import threading
from multiprocessing.connection import Listener
from typing import Any, Callable

import cloudpickle

RESULT_ADDRESS_VARIABLE = "HOROVODISH_RESULT_ADDRESS"
RESULT_KEY_VARIABLE = "HOROVODISH_RESULT_KEY"


def run(func: Callable[..., Any], args: tuple = (), kwargs: dict | None = None,
        np: int = 1, min_np: int | None = None, max_np: int | None = None,
        slots: int | None = None, reset_limit: int | None = None, hosts: str | None = None,
        hostfile: str | None = None, start_timeout: int | None = None,
        ssh_port: int | None = None, ssh_identity_file: str | None = None,
        disable_cache: bool | None = None, output_filename: str | None = None,
        verbose: int | None = None, use_gloo: bool | None = None,
        use_mpi: bool | None = None, mpi_args: str | None = None,
        network_interface: str | None = None, executable: str | None = None) -> list[Any]:
    """Run ``func(*args, **kwargs)`` on ``np`` ranks; every rank's return value, in rank
    order. Horovod's arguments; ``min_np``/``max_np`` (an elastic function job) are not
    supported: an elastic job runs a script (``horovodishrun --min-np ...``)."""
    if min_np is not None or max_np is not None or reset_limit is not None:
        raise NotImplementedError("horovodish.run: an elastic job (min_np, max_np, "
                                  "reset_limit) runs a script: horovodishrun --min-np N "
                                  "--max-np M ... python train.py (docs/elastic.md)")
    if output_filename is not None:
        raise NotImplementedError("horovodish.run: output_filename is not supported; each "
                                  "rank's output goes to this process's stdout and stderr")
    if np < 1:
        raise ValueError(f"horovodish.run: np must be >= 1, got {np}")
    flags = _launcher_flags(np, slots, hosts, hostfile, start_timeout, ssh_port,
                            ssh_identity_file, disable_cache, verbose, use_gloo, mpi_args,
                            network_interface)
    python = executable or sys.executable
    with tempfile.TemporaryDirectory(prefix="horovodish-run-") as folder:
        payload = os.path.join(folder, "function.pkl")
        with open(payload, "wb") as out:
            cloudpickle.dump((func, tuple(args), dict(kwargs or {})), out)
        key = secrets.token_hex(16)
        with _Outcomes(np, key, _reachable_address(hosts, hostfile)) as outcomes:
            env = {**os.environ, RESULT_ADDRESS_VARIABLE: outcomes.address,
                   RESULT_KEY_VARIABLE: key}
            command = [python, "-m", "horovodish.launcher", *flags, python, "-m",
                       "horovodish.launcher.function_task", payload]
            code = subprocess.run(command, env=env).returncode
            found = outcomes.collected()
    return _values_or_raise(found, np, code)


def _launcher_flags(np: int, slots: int | None, hosts: str | None, hostfile: str | None,
                    start_timeout: int | None, ssh_port: int | None,
                    ssh_identity_file: str | None, disable_cache: bool | None,
                    verbose: int | None, use_gloo: bool | None, mpi_args: str | None,
                    network_interface: str | None) -> list[str]:
    """horovodishrun's flags for Horovod's run() arguments."""
    flags = ["-np", str(np)]
    for flag, value in (("-H", hosts), ("--hostfile", hostfile), ("--slots", slots),
                        ("--start-timeout", start_timeout), ("-p", ssh_port),
                        ("-i", ssh_identity_file), ("--mpi-args", mpi_args),
                        ("--network-interface", network_interface)):
        if value is not None:
            flags += [flag, str(value)]
    if disable_cache:
        flags.append("--disable-cache")
    if verbose:
        flags.append("--verbose")
    if use_gloo:
        flags.append("--gloo")
    return flags


class _Outcomes:
    """The listener the ranks report to, and what they reported ({rank: outcome})."""

    def __init__(self, size: int, key: str, where: str) -> None:
        self.size = size
        self.listener = Listener(("0.0.0.0", 0), authkey=key.encode())
        port = self.listener.address[1]
        self.address = f"{where}:{port}"
        self.found: dict[int, tuple] = {}
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._accept, daemon=True,
                                       name="horovodish-run-results")
        self.closed = False

    def __enter__(self) -> "_Outcomes":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True
        self.listener.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                connection = self.listener.accept()
            except (OSError, EOFError):  # closed, or a connection without the key
                if self.closed:
                    return
                continue
            with connection:
                try:
                    rank, outcome = cloudpickle.loads(connection.recv_bytes())
                except (OSError, EOFError):
                    continue
            with self.lock:
                self.found[int(rank)] = outcome

    def collected(self) -> dict[int, tuple]:
        with self.lock:
            return dict(self.found)


def _reachable_address(hosts: str | None, hostfile: str | None) -> str:
    """This host's address as the ranks dial it: loopback when every rank is here, else
    the address this host has toward the first other host (as DriverWorld's server)."""
    from horovodish.common.world.rendezvous import addresses_toward

    from .hosts import parse_hostfile, parse_hosts
    from .remote import is_local
    listed = parse_hosts(hosts) if hosts else \
        parse_hostfile(open(hostfile).read()) if hostfile else []
    others = [host.name for host in listed if not is_local(host.name)]
    return addresses_toward(others[0])[0] if others else "127.0.0.1"


def _values_or_raise(found: dict[int, tuple], size: int, code: int) -> list[Any]:
    raised = {rank: outcome for rank, outcome in found.items() if outcome[0] == "error"}
    own = {r: o for r, o in raised.items() if not o[1].startswith("HorovodInternalError")}
    for rank, outcome in sorted((own or raised).items()):
        raise RuntimeError(f"horovodish.run: rank {rank} failed: {outcome[1]}\n{outcome[2]}")
    missing = [rank for rank in range(size) if rank not in found]
    if code != 0 or missing:
        raise RuntimeError(f"horovodish.run: the job exited with code {code}; ranks "
                           f"{missing or 'all'} reported no result (their output is above)")
    return [found[rank][1] for rank in range(size)]
