"""A rank's side of the PMI server: greet it, wait for the world, hand MPICH the socket,
and keep an ear on the job.

MPICH's PMI-1 client accepts an open socket as ``PMI_FD`` (with ``PMI_RANK`` and
``PMI_SIZE``), as Hydra hands it one. So this rank connects first, shows the job key
and waits in Python, under the start timeout, until every rank has arrived: MPICH is
given only a connection that the server has accepted for this rank, and a rank that
never comes is named here, as an exception, instead of in a hang inside ``MPI_Init``.

The second connection (``watch``) is read by a daemon thread: when the server says the
job is over (a rank died, one called ``MPI_Abort``) or the server is gone before this
process finalized MPI, it says why on stderr and ends the process, so that nothing is
left running, whatever launcher started it.
"""
from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass

from . import node_layout
from .pmi_wire import GREETING_LIMIT, WireError, greeting, read_greeting

RETRY_SECONDS = 0.1
_leaving = False  # set at exit: the server's end is then expected, not news


@dataclass(frozen=True)
class Place:
    """What the server said of this rank's place: its PMI socket and the layout."""

    fd: int
    nodes: int
    node: int
    local_size: int


def join(addresses: list[tuple[str, int]], key: str, rank: int, size: int,
         deadline: float, who: str) -> Place:
    """Greet the server at the first of ``addresses`` that takes this job's key; return
    once every rank has arrived. RuntimeError, naming what went wrong, when the server
    cannot be reached, refuses, or says that ranks are missing, by ``deadline``."""
    sock, address = _greet(addresses, key, rank, size, deadline, who,
                           {"role": "pmi", "host": node_layout.host_identity()})
    try:
        answer = _answer(sock, deadline + 10.0, f"the PMI server at {_show(address)}")
        if "ok" not in answer:
            raise RuntimeError(f"horovodish.init() on rank {rank}: {answer.get('error')}")
        watch, _ = _greet([address], key, rank, size, deadline + 10.0, who, {"role": "watch"})
        ok = _answer(watch, deadline + 10.0, f"the PMI server at {_show(address)}")
        if "ok" not in ok:
            watch.close()
            raise RuntimeError(f"horovodish.init() on rank {rank}: {ok.get('error')}")
    except BaseException:
        sock.close()
        raise
    threading.Thread(target=_listen, args=(watch, rank), name="horovodish-pmi-watch",
                     daemon=True).start()
    return Place(sock.detach(), int(answer.get("nodes", 1)), int(answer.get("node", 0)),
                 int(answer.get("local_size", 1)))


def _greet(addresses: list[tuple[str, int]], key: str, rank: int, size: int,
           deadline: float, who: str, fields: dict) -> tuple[socket.socket, tuple[str, int]]:
    """Connect, retrying until ``deadline`` (rank 0 may not listen yet), to the first
    address whose server does not refuse the key; send the greeting."""
    line = greeting(key=key, rank=rank, size=size, **fields)
    last = "no address to try"
    while True:
        for address in addresses:
            try:
                sock = socket.create_connection(address, timeout=max(
                    0.1, min(5.0, deadline - time.monotonic())))
            except OSError as exc:  # refused, unreachable, a name not resolvable yet
                last = f"{_show(address)}: {exc.strerror or exc}"
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                sock.sendall(line)
            except OSError as exc:
                sock.close()
                last = f"{_show(address)}: {exc.strerror or exc}"
                continue
            if len({port for _, port in addresses}) == 1 or fields["role"] == "watch":
                return sock, address  # (one server, however many ways to reach it)
            # Several candidate ports (derived from a Slurm step): another job's server
            # may hold one of them and refuse this key at once; ours holds the greeting.
            sock.settimeout(0.5)
            try:
                early = sock.recv(GREETING_LIMIT, socket.MSG_PEEK)
            except socket.timeout:
                early = None
            except OSError:
                early = b""
            if early is None or early.startswith(b'{"ok"'):  # (ok: this rank came last)
                return sock, address
            sock.close()
            last = f"{_show(address)}: " + (early.decode("utf-8", "replace").strip()
                                            or "closed the connection")
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"horovodish.init() on rank {rank}: cannot reach the job's PMI server, "
                f"which rank 0 starts when {who} starts a job ({last}). Check that rank 0 "
                "was started and that this host can reach it.")
        time.sleep(RETRY_SECONDS)


def _answer(sock: socket.socket, deadline: float, what: str) -> dict:
    """One greeting line from the server, by ``deadline``."""
    data = bytearray()
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"horovodish.init(): {what} did not answer in time")
        sock.settimeout(left)
        try:
            chunk = sock.recv(GREETING_LIMIT)
        except socket.timeout:
            continue
        except OSError as exc:
            raise RuntimeError(f"horovodish.init(): {what}: {exc}") from None
        if not chunk:
            raise RuntimeError(f"horovodish.init(): {what} closed the connection"
                               + (f" after {bytes(data)!r}" if data else ""))
        data += chunk
        if len(data) > GREETING_LIMIT:
            raise RuntimeError(f"horovodish.init(): {what} sent an overlong answer")
    sock.settimeout(None)
    try:
        return read_greeting(bytes(data))
    except WireError as exc:
        raise RuntimeError(f"horovodish.init(): {what}: {exc}") from None


def _show(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


def expect_end() -> None:
    """The job is ending by design (this process exits, or its driver ends the job):
    the server's end or an abort is no longer news for this rank."""
    global _leaving
    _leaving = True


atexit.register(expect_end)


def _listen(sock: socket.socket, rank: int) -> None:
    """The watch connection's reader (a daemon thread)."""
    reader = sock.makefile("rb")
    for line in reader:
        try:
            message = read_greeting(line)
        except WireError:
            continue
        if "abort" in message and not _leaving:
            _end(rank, f"the job is ending: {message['abort']}")
        if "end" in message:
            return
    if not _leaving and not _mpi_finalized():
        _end(rank, "lost the connection to the job's PMI server (rank 0's host or the "
                   "driver is gone); ending this rank too")


def _mpi_finalized() -> bool:
    MPI = sys.modules.get("mpi4py.MPI")
    try:
        return MPI is not None and MPI.Is_finalized()
    except Exception:  # noqa: BLE001 - a closing interpreter
        return True


def _end(rank: int, text: str) -> None:
    """Say why and end this process at once (its peers are ending too)."""
    try:
        sys.stderr.write(f"horovodish: rank {rank}: {text}\n")
        sys.stderr.flush()
        sys.stdout.flush()
    finally:
        os._exit(1)
