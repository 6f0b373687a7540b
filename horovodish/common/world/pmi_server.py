"""The PMI-1 server of a job that no MPI process manager started: what Hydra's proxies
are to ``mpirun``, for exactly one job.

It runs as a process of its own (``serve.py``, started by ``server_process``; rank 0 or
a driver starts it), so that no rank's interpreter, blocked in ``MPI_Init`` or
``MPI_Finalize`` with its lock held, can stall it. One thread, one ``selectors`` loop, no blocking call: a client
that sends nothing, sends half a line or sends megabytes holds up nothing else.

A connection first sends one greeting line (``pmi_wire.greeting``: the job key, its
rank, the job's size, its role):

* role ``pmi`` (with the rank's host identity): answered once every rank has arrived,
  with the node layout; from then on the connection is that rank's MPICH PMI-1 client
  (the rank hands the socket to MPICH as ``PMI_FD``). Ranks that do not arrive within
  the start timeout are named to every rank that did.
* role ``watch``: the rank's ear. When a rank's PMI connection ends before it finalized
  MPI (it died, or was killed), or a rank calls ``MPI_Abort``, every watch connection
  hears ``{"abort": reason}`` and its rank ends; after a clean end it hears
  ``{"end": ...}``.

A greeting with a wrong key, a rank out of range or already taken, a size that is not
the job's, a line that is not JSON or is too long, or none within HELLO_SECONDS is
refused, the connection closed, and the refusal logged; none of these touches the job.
The listening socket closes once every rank has both connections, so nothing can
connect afterwards. The server ends when every PMI connection has closed.
"""
from __future__ import annotations

import hmac
import json
import os
import secrets
import selectors
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import node_layout
from .pmi_wire import (GREETING_LIMIT, LINE_LIMIT, WireError, escape, format_command,
                       greeting, parse_command, read_greeting)

HELLO_SECONDS = 10.0     # for a new connection's greeting
LINGER_SECONDS = 30.0    # after an abort, for the ranks to go
OUTPUT_LIMIT = 1 << 20   # bytes queued for a client that does not read
MAPPING_LIMIT = 900      # PMI values are at most 1024 bytes (Hydra's limit, ours too)
KEY_LIMIT, VALUE_LIMIT, KVSNAME_LIMIT = 64, 1024, 256


@dataclass
class ServerConfig:
    size: int
    key: str
    run_id: str
    start_timeout: float
    host: str = ""                       # address to listen on ("" = every interface)
    ports: tuple[int, ...] = (0,)        # candidates in order (0 = any free port)

    @classmethod
    def from_json(cls, text: str) -> "ServerConfig":
        data = json.loads(text)
        return cls(int(data["size"]), str(data["key"]), str(data["run_id"]),
                   float(data["start_timeout"]), str(data.get("host", "")),
                   tuple(int(p) for p in data.get("ports", (0,))))


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    peer: str
    deadline: float | None
    role: str = "new"                    # new, waiting (pmi, before all arrived), pmi, watch
    rank: int = -1
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    closing: bool = False                # close once outbuf is sent
    in_multiline: bool = False           # inside an mcmd= block (spawn; refused)


class PmiServer:
    """One job's PMI-1 service; ``bind()`` then ``serve()`` (see the module docstring)."""

    def __init__(self, config: ServerConfig,
                 log: Callable[[str], None] | None = None) -> None:
        self.config = config
        # Fresh for every server: MPICH names its shared-memory segments after it, and a
        # killed job's segments would otherwise meet the next run's.
        self.kvsname = f"horovodish_{os.getpid()}_{secrets.token_hex(6)}"
        self._log = log or (lambda text: sys.stderr.write(
            f"horovodish PMI server: {text}\n"))
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._pmi: dict[int, _Connection] = {}
        self._watch: dict[int, _Connection] = {}
        self._hosts: dict[int, str] = {}
        self._nodes: list[int] = []
        self._kvs: dict[str, str] = {}
        self._barrier: set[int] = set()
        self._finalized: set[int] = set()
        self._formed = False
        self._aborted: str | None = None
        self._abort_deadline = 0.0
        self._start_deadline = time.monotonic() + config.start_timeout
        self._refusals = 0
        self.port = 0

    # -- setting up --------------------------------------------------------------------
    def bind(self) -> int:
        """Listen on the first free candidate port; returns it. OSError naming every
        port tried when none is free."""
        errors = []
        for port in self.config.ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.config.host, port))
            except OSError as exc:
                sock.close()
                errors.append(f"{port}: {exc.strerror or exc}")
                continue
            sock.listen(max(128, 2 * self.config.size))
            sock.setblocking(False)
            self._listener = sock
            self._selector.register(sock, selectors.EVENT_READ, None)
            self.port = sock.getsockname()[1]
            return self.port
        raise OSError(f"cannot listen on port {', '.join(errors)}")

    # -- the loop ----------------------------------------------------------------------
    def serve(self) -> int:
        """Serve until the job ends; 0 after a clean end, 1 after an abort."""
        while not self._finished():
            now = time.monotonic()
            self._expire(now)
            if self._finished():
                break
            for key, mask in self._selector.select(self._wait_time(now)):
                if key.data is None:
                    self._accept()
                    continue
                conn: _Connection = key.data
                if mask & selectors.EVENT_READ:
                    self._receive(conn)
                if mask & selectors.EVENT_WRITE and conn.sock.fileno() >= 0:
                    self._flush(conn)
        self._shut()
        return 1 if self._aborted else 0

    def _finished(self) -> bool:
        if self._aborted:
            return not self._pmi or time.monotonic() >= self._abort_deadline
        return self._formed and not self._pmi

    def _wait_time(self, now: float) -> float:
        deadlines = [conn.deadline for conn in self._connections() if conn.deadline]
        deadlines.append(self._abort_deadline if self._aborted else
                         self._start_deadline if not self._formed else now + 5.0)
        return max(0.0, min(deadlines) - now)

    def _connections(self) -> list[_Connection]:
        return [key.data for key in self._selector.get_map().values()
                if key.data is not None]

    def _expire(self, now: float) -> None:
        for conn in self._connections():
            if conn.deadline is None or now < conn.deadline:
                continue
            if conn.role == "new":
                self._refuse(conn, f"sent no greeting within {HELLO_SECONDS:g} s")
            elif conn.role == "refused":
                self._drop(conn)
        if not self._formed and not self._aborted and now >= self._start_deadline:
            missing = [r for r in range(self.config.size) if r not in self._pmi]
            self._abort(f"rank(s) {_ranks(missing)} of {self.config.size} did not reach "
                        f"the PMI server within the start timeout "
                        f"({self.config.start_timeout:g} s); check that every rank was "
                        "started and can reach rank 0's host")

    # -- connections -------------------------------------------------------------------
    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: refuse this one and go on
                self._log(f"accept failed: {exc}")
                return
            peer = f"{address[0]}:{address[1]}"
            pending = sum(conn.role == "new" for conn in self._connections())
            if pending >= max(64, 2 * self.config.size):
                sock.close()
                self._note_refusal(f"{peer}: refused, {pending} connections already "
                                   "wait to greet")
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(sock, peer, time.monotonic() + HELLO_SECONDS)
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _receive(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._lost(conn)
            return
        if conn.closing:
            return
        conn.inbuf += data
        while not conn.closing and conn.sock.fileno() >= 0:
            end = conn.inbuf.find(b"\n")
            limit = GREETING_LIMIT if conn.role == "new" else LINE_LIMIT
            if end < 0:
                if len(conn.inbuf) > limit:
                    self._too_long(conn, limit)
                return
            if end > limit:
                self._too_long(conn, limit)
                return
            line = bytes(conn.inbuf[:end])
            del conn.inbuf[:end + 1]
            if conn.role == "new":
                self._greeted(conn, line)
            elif conn.role == "pmi":
                self._command(conn, line.decode("utf-8", "replace").rstrip("\r"))
            # (waiting, watch: nothing is expected from the client; ignored)

    def _too_long(self, conn: _Connection, limit: int) -> None:
        if conn.role == "new":
            self._refuse(conn, f"sent a line of more than {limit} bytes")
        else:
            self._log(f"rank {conn.rank} sent a PMI line of more than {limit} bytes; "
                      "its connection is dropped")
            self._drop(conn)
            self._lost(conn)

    def _send(self, conn: _Connection, data: bytes) -> None:
        if conn.sock.fileno() < 0:
            return
        conn.outbuf += data
        if len(conn.outbuf) > OUTPUT_LIMIT:
            self._log(f"{self._who(conn)} does not read its replies; dropped")
            self._drop(conn)
            self._lost(conn)
            return
        self._flush(conn)

    def _flush(self, conn: _Connection) -> None:
        try:
            sent = conn.sock.send(conn.outbuf) if conn.outbuf else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(conn)
            self._lost(conn)
            return
        del conn.outbuf[:sent]
        if conn.closing and not conn.outbuf:
            self._drop(conn)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        if self._selector.get_key(conn.sock).events != events:
            self._selector.modify(conn.sock, events, conn)

    def _drop(self, conn: _Connection) -> None:
        if conn.sock.fileno() >= 0:
            self._selector.unregister(conn.sock)
            conn.sock.close()

    def _refuse(self, conn: _Connection, reason: str) -> None:
        self._note_refusal(f"{conn.peer}: refused: {reason}")
        # (A peer that never reads the refusal loses its connection a little later.)
        conn.role, conn.deadline, conn.closing = "refused", time.monotonic() + 5.0, True
        self._send(conn, greeting(error=f"the PMI server of job {self.config.run_id} "
                                        f"refused this connection: {reason}"))

    def _note_refusal(self, text: str) -> None:
        """Log refusals, but not a flood of them: the first 20, then one in 100."""
        self._refusals += 1
        if self._refusals <= 20 or self._refusals % 100 == 0:
            suffix = f" ({self._refusals} refusals so far)" if self._refusals > 20 else ""
            self._log(text + suffix)

    def _who(self, conn: _Connection) -> str:
        return f"rank {conn.rank}" if conn.rank >= 0 else conn.peer

    # -- greetings ---------------------------------------------------------------------
    def _greeted(self, conn: _Connection, line: bytes) -> None:
        try:
            hello = read_greeting(line)
        except WireError as exc:
            self._refuse(conn, str(exc))
            return
        key, rank, size, role = (hello.get("key"), hello.get("rank"), hello.get("size"),
                                 hello.get("role"))
        if not isinstance(key, str) or not hmac.compare_digest(
                key.encode("utf-8", "replace"), self.config.key.encode()):
            self._refuse(conn, "wrong job key")
        elif not isinstance(size, int) or size != self.config.size:
            self._refuse(conn, f"this job has {self.config.size} ranks, the greeting "
                               f"says {size!r}")
        elif not isinstance(rank, int) or isinstance(rank, bool) or \
                not 0 <= rank < self.config.size:
            self._refuse(conn, f"rank {rank!r} is not in 0..{self.config.size - 1}")
        elif self._aborted:
            self._refuse(conn, f"the job was aborted: {self._aborted}")
        elif role == "pmi":
            self._pmi_greeting(conn, rank, hello.get("host"))
        elif role == "watch":
            if rank not in self._pmi or rank in self._watch:
                self._refuse(conn, f"rank {rank} has no PMI connection" if rank not in
                             self._pmi else f"rank {rank} is watched already")
                return
            conn.role, conn.rank, conn.deadline = "watch", rank, None
            self._watch[rank] = conn
            self._send(conn, greeting(ok=True))
            if self._formed and len(self._watch) == self.config.size:
                self._close_listener()
        else:
            self._refuse(conn, f"unknown role {role!r}")

    def _pmi_greeting(self, conn: _Connection, rank: int, host: Any) -> None:
        if rank in self._pmi:
            self._refuse(conn, f"rank {rank} has connected already (from "
                               f"{self._pmi[rank].peer})")
            return
        if not isinstance(host, str) or not host or len(host) > 512:
            self._refuse(conn, "no host identity")
            return
        conn.role, conn.rank, conn.deadline = "waiting", rank, None
        self._pmi[rank] = conn
        self._hosts[rank] = host
        if len(self._pmi) == self.config.size:
            self._form()

    def _form(self) -> None:
        """Every rank is here: the layout, and each rank's go-ahead."""
        self._nodes = node_layout.nodes_of([self._hosts[r] for r in range(self.config.size)])
        count = max(self._nodes) + 1
        self._formed = True
        for rank, conn in sorted(self._pmi.items()):
            conn.role = "pmi"
            self._send(conn, greeting(ok=True, nodes=count, node=self._nodes[rank],
                                      local_size=self._nodes.count(self._nodes[rank])))

    def _close_listener(self) -> None:
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
            # Connections that began greeting and are now pointless go too.
            for conn in self._connections():
                if conn.role == "new":
                    self._refuse(conn, "every rank of the job is connected")

    # -- PMI-1 -------------------------------------------------------------------------
    def _command(self, conn: _Connection, line: str) -> None:
        if conn.in_multiline:  # an mcmd block (spawn) runs to endcmd; refused then
            if line == "endcmd":
                conn.in_multiline = False
                self._send(conn, format_command("spawn_result", rc=-1,
                                                msg=escape("spawn is not supported")))
            return
        if line.startswith("mcmd="):
            conn.in_multiline = True
            return
        try:
            fields = parse_command(line)
        except WireError as exc:
            self._log(f"rank {conn.rank}: {exc}")
            self._send(conn, format_command("error", rc=-1, msg=escape(str(exc))))
            return
        cmd = fields.get("cmd", "")
        handler = getattr(self, f"_pmi_{cmd}", None)
        if handler is None:
            self._send(conn, format_command(_REPLIES.get(cmd, cmd), rc=-1,
                                            msg=escape(f"{cmd} is not supported")))
            return
        handler(conn, fields)

    def _pmi_init(self, conn: _Connection, fields: dict[str, str]) -> None:
        self._send(conn, format_command("response_to_init", pmi_version=1, pmi_subversion=1,
                                        rc=0))

    def _pmi_get_maxes(self, conn: _Connection, fields: dict[str, str]) -> None:
        self._send(conn, format_command("maxes", kvsname_max=KVSNAME_LIMIT,
                                        keylen_max=KEY_LIMIT, vallen_max=VALUE_LIMIT, rc=0))

    def _pmi_get_appnum(self, conn: _Connection, fields: dict[str, str]) -> None:
        self._send(conn, format_command("appnum", appnum=0, rc=0))

    def _pmi_get_my_kvsname(self, conn: _Connection, fields: dict[str, str]) -> None:
        self._send(conn, format_command("my_kvsname", kvsname=self.kvsname, rc=0))

    def _pmi_get_universe_size(self, conn: _Connection, fields: dict[str, str]) -> None:
        self._send(conn, format_command("universe_size", size=self.config.size, rc=0))

    def _pmi_put(self, conn: _Connection, fields: dict[str, str]) -> None:
        key, value = fields.get("key", ""), fields.get("value", "")
        if not key or len(key) > KEY_LIMIT or len(value) > VALUE_LIMIT:
            self._send(conn, format_command("put_result", rc=-1, msg=escape(
                f"a key of 1 to {KEY_LIMIT} bytes and a value of at most {VALUE_LIMIT}")))
            return
        self._kvs[key] = value
        self._send(conn, format_command("put_result", rc=0))

    def _pmi_get(self, conn: _Connection, fields: dict[str, str]) -> None:
        key = fields.get("key", "")
        value = self._kvs.get(key)
        if key == "PMI_process_mapping":
            mapping = node_layout.process_mapping(self._nodes)
            # (Too long for one value: MPICH then finds the layout by host names.)
            value = mapping if len(mapping) <= MAPPING_LIMIT else None
        if value is None:
            self._send(conn, format_command("get_result", rc=-1,
                                            msg=escape(f"key {key} not found")))
        else:
            self._send(conn, format_command("get_result", rc=0, value=value))

    def _pmi_barrier_in(self, conn: _Connection, fields: dict[str, str]) -> None:
        if self._aborted:
            self._send(conn, format_command("barrier_out", rc=-1, msg="job_aborted"))
            return
        self._barrier.add(conn.rank)
        if len(self._barrier) == self.config.size:
            self._barrier.clear()
            for waiting in list(self._pmi.values()):
                self._send(waiting, format_command("barrier_out", rc=0))

    def _pmi_finalize(self, conn: _Connection, fields: dict[str, str]) -> None:
        self._finalized.add(conn.rank)
        self._send(conn, format_command("finalize_ack", rc=0))

    def _pmi_abort(self, conn: _Connection, fields: dict[str, str]) -> None:
        message = fields.get("message", "").replace("\\ ", " ").replace("\\\\", "\\")
        self._abort(f"rank {conn.rank} called MPI_Abort (exit code "
                    f"{fields.get('exitcode', '?')})" + (f": {message}" if message else ""))

    # -- the end -----------------------------------------------------------------------
    def _lost(self, conn: _Connection) -> None:
        """A connection ended (the peer closed it or it was dropped)."""
        self._drop(conn)
        if conn.role in ("waiting", "pmi") and self._pmi.get(conn.rank) is conn:
            del self._pmi[conn.rank]
            self._barrier.discard(conn.rank)
            if conn.rank not in self._finalized and not self._aborted:
                host = node_layout.host_name(self._hosts.get(conn.rank, "?"))
                when = "before every rank had arrived" if not self._formed else \
                    "before it finalized MPI"
                self._abort(f"rank {conn.rank} (on {host}) exited or was killed {when}")
        elif conn.role == "watch" and self._watch.get(conn.rank) is conn:
            del self._watch[conn.rank]

    def _abort(self, reason: str) -> None:
        """End the job: every rank hears why (its watch connection, or its greeting's
        answer, or its pending barrier's), and the server waits LINGER_SECONDS at most
        for them to go."""
        if self._aborted:
            return
        self._aborted = reason
        self._abort_deadline = time.monotonic() + LINGER_SECONDS
        self._log(f"ending the job: {reason}")
        for conn in self._connections():
            if conn.role == "watch":
                self._send(conn, greeting(abort=reason))
            elif conn.role == "waiting":
                self._send(conn, greeting(error=reason))
            elif conn.role == "pmi" and conn.rank in self._barrier:
                self._send(conn, format_command("barrier_out", rc=-1, msg="job_aborted"))
        self._barrier.clear()
        self._close_listener()

    def _shut(self) -> None:
        if not self._aborted:
            for conn in self._watch.values():
                self._send(conn, greeting(end="every rank finalized MPI"))
        deadline = time.monotonic() + 2.0
        while any(conn.outbuf for conn in self._connections()) and \
                time.monotonic() < deadline:
            for key, mask in self._selector.select(0.1):
                if key.data is not None and mask & selectors.EVENT_WRITE:
                    self._flush(key.data)
        for conn in self._connections():
            self._drop(conn)
        if self._listener is not None:
            self._listener.close()
        self._selector.close()


# Replies to requests the server refuses, by request (so the client reads a reply of
# the kind it waits for, with its error).
_REPLIES = {"publish_name": "publish_result", "unpublish_name": "unpublish_result",
            "lookup_name": "lookup_result", "spawn": "spawn_result",
            "initack": "initack", "singinit": "singinit_info"}


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:16]))
    return shown + (f" and {len(ranks) - 16} more" if len(ranks) > 16 else "")
