"""The job's PMI-1 server (horovodish/common/world/pmi_server.py), in one process: a
server thread and clients speaking its protocol over real sockets. What a real MPICH
makes of it is tested with real ranks (tests/launcher/test_world_launchers.py); here,
every hostile or broken client the server must survive, and the layout and protocol
it serves."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from horovodish.common.world import pmi_server
from horovodish.common.world.node_layout import nodes_of, process_mapping
from horovodish.common.world.pmi_server import PmiServer, ServerConfig
from horovodish.common.world.pmi_wire import parse_command

KEY = "k" * 32


class Server:
    """A PmiServer serving in a thread; its log lines and exit code kept."""

    def __init__(self, size: int, start_timeout: float = 20.0) -> None:
        self.log: list[str] = []
        self.server = PmiServer(ServerConfig(size, KEY, "test-run", start_timeout,
                                             "127.0.0.1"), self.log.append)
        self.port = self.server.bind()
        self.code: int | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.code = self.server.serve()

    def connect(self) -> "Client":
        return Client(socket.create_connection(("127.0.0.1", self.port), timeout=10))

    def ended(self, timeout: float = 10.0) -> int | None:
        self.thread.join(timeout)
        return self.code


class Client:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def greet(self, rank: int, role: str = "pmi", key: str = KEY, size: int = 2,
              host: str = "hostA/boot/net:[1]") -> None:
        fields = {"key": key, "rank": rank, "size": size, "role": role}
        if role == "pmi":
            fields["host"] = host
        self.send((json.dumps(fields) + "\n").encode())

    def answer(self) -> dict:
        line = self.reader.readline()
        assert line, "the server closed the connection without an answer"
        return json.loads(line)

    def command(self, line: str) -> dict[str, str]:
        self.send((line + "\n").encode())
        return parse_command(self.reader.readline().decode().rstrip("\n"))

    def closed(self) -> bool:
        """The server closed this connection (after whatever it sent)."""
        self.sock.settimeout(10)
        try:
            while self.reader.readline():
                pass
        except OSError:
            return True
        return True

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def form(server: Server, size: int = 2, hosts: tuple[str, ...] = ()) -> tuple[list, list]:
    """Every rank greets (PMI, then watch); returns (pmi clients, watch clients) and
    each PMI client's answer is checked to be ok."""
    pmi = [server.connect() for _ in range(size)]
    for rank, client in enumerate(pmi):
        client.greet(rank, size=size, host=hosts[rank] if hosts else "hostA/b/n")
    answers = [client.answer() for client in pmi]
    assert all(answer.get("ok") for answer in answers), answers
    watch = [server.connect() for _ in range(size)]
    for rank, client in enumerate(watch):
        client.greet(rank, "watch", size=size)
        assert client.answer() == {"ok": True}
    return pmi, watch


def finish(pmi: list) -> None:
    for client in pmi:
        client.send(b"cmd=barrier_in\n")
    for client in pmi:
        assert parse_command(client.reader.readline().decode().strip())["rc"] == "0"
    for client in pmi:
        assert client.command("cmd=finalize")["cmd"] == "finalize_ack"
        client.close()


def test_a_whole_job_the_way_mpich_speaks_to_it():
    server = Server(2)
    pmi, watch = form(server, hosts=("h1/b/n", "h2/b/n"))
    a, b = pmi
    assert a.command("cmd=init pmi_version=1 pmi_subversion=1") == {
        "cmd": "response_to_init", "pmi_version": "1", "pmi_subversion": "1", "rc": "0"}
    assert a.command("cmd=get_maxes")["vallen_max"] == "1024"
    assert a.command("cmd=get_appnum")["appnum"] == "0"
    kvs = a.command("cmd=get_my_kvsname")["kvsname"]
    assert b.command("cmd=get_my_kvsname")["kvsname"] == kvs
    assert a.command("cmd=get_universe_size")["size"] == "2"
    mapping = a.command(f"cmd=get kvsname={kvs} key=PMI_process_mapping")
    assert mapping["value"] == "(vector,(0,2,1))"  # one rank on each of two hosts
    # A value with escaped spaces comes back as it went in.
    assert a.command(rf"cmd=put kvsname={kvs} key=card0 value=a\ b\\c")["rc"] == "0"
    assert b.command(f"cmd=get kvsname={kvs} key=card0")["value"] == r"a\ b\\c"
    assert b.command(f"cmd=get kvsname={kvs} key=missing")["rc"] == "-1"
    assert a.command(f"cmd=put kvsname={kvs} key={'x' * 65} value=1")["rc"] == "-1"
    assert a.command("cmd=lookup_name service=s") == {
        "cmd": "lookup_result", "rc": "-1", "msg": r"lookup_name\ is\ not\ supported"}
    finish(pmi)
    assert server.ended() == 0
    for client in watch:
        assert client.answer() == {"end": "every rank finalized MPI"}
    assert not server.log, server.log


def test_layout_from_host_identities_not_from_launcher_ranks():
    assert nodes_of(["a", "a", "b", "b"]) == [0, 0, 1, 1]
    assert nodes_of(["b", "a", "b", "a"]) == [0, 1, 0, 1]
    assert process_mapping([0, 0, 1, 1]) == "(vector,(0,2,2))"
    assert process_mapping([0, 0, 0]) == "(vector,(0,1,3))"
    assert process_mapping([0, 1, 0, 1]) == "(vector,(0,2,1),(0,2,1))"
    assert process_mapping([0, 0, 1]) == "(vector,(0,1,2),(1,1,1))"
    server = Server(3)
    pmi, _ = form(server, 3, hosts=("x/1/n", "y/1/n", "x/1/n"))
    assert pmi[0].command("cmd=get key=PMI_process_mapping")["value"] == \
        "(vector,(0,2,1),(0,1,1))"
    finish(pmi)
    assert server.ended() == 0


def test_wrong_key_bad_rank_duplicate_and_garbage_are_refused_and_the_job_forms():
    server = Server(2)
    first = server.connect()
    first.greet(0)
    cases = [
        (lambda c: c.greet(1, key="wrong"), "wrong job key"),
        (lambda c: c.greet(1, key=None), "wrong job key"),                    # missing
        (lambda c: c.greet(7), "rank 7 is not in 0..1"),
        (lambda c: c.greet(-1), "rank -1 is not in 0..1"),
        (lambda c: c.greet(1, size=3), "this job has 2 ranks"),
        (lambda c: c.greet(0), "rank 0 has connected already"),
        (lambda c: c.greet(1, "watch"), "rank 1 has no PMI connection"),
        (lambda c: c.send(b"GET / HTTP/1.1\r\n"), "not a greeting"),
        (lambda c: c.send(b"\xff\xfe\x00garbage\n"), "not a greeting"),
        (lambda c: c.send(b"[1, 2]\n"), "a JSON object was expected"),
        (lambda c: c.greet(1, role="boss"), "unknown role"),
    ]
    for act, reason in cases:
        client = server.connect()
        act(client)
        answer = client.answer()
        assert reason in answer["error"], (reason, answer)
        assert client.closed()
    second = server.connect()
    second.greet(1)
    assert first.answer()["ok"] and second.answer()["ok"]
    assert len([line for line in server.log if "refused" in line]) == len(cases)
    for client, rank in ((first, 0), (second, 1)):
        watch = server.connect()
        watch.greet(rank, "watch")
        assert watch.answer() == {"ok": True}
    finish([first, second])
    assert server.ended() == 0


def test_a_5_mb_line_and_held_connections_slow_nothing(monkeypatch):
    monkeypatch.setattr(pmi_server, "HELLO_SECONDS", 0.5)
    server = Server(2)
    held = [server.connect() for _ in range(10)]           # never say a word
    slow = server.connect()
    slow.send(b'{"key": "' + b"k" * 100)                    # half a line, then nothing
    time.sleep(0.8)
    for client in [*held, slow]:
        assert client.closed()
    assert "sent no greeting within 0.5 s" in "\n".join(server.log), server.log
    flood = server.connect()
    sent = threading.Thread(target=lambda: _send_quietly(flood, b"x" * (5 << 20) + b"\n"))
    sent.start()
    held = [server.connect() for _ in range(50)]           # more, while the job forms
    started = time.monotonic()
    pmi, _ = form(server)
    assert time.monotonic() - started < 2.0, "the job waited for hostile connections"
    sent.join(10)
    for client in [*held, flood]:
        assert client.closed()  # once the job is whole, if not before
    log = "\n".join(server.log)
    assert "sent a line of more than 4096 bytes" in log, log
    assert len(server.log) <= 21, "a flood of refusals floods the log"
    finish(pmi)
    assert server.ended() == 0


def _send_quietly(client: Client, data: bytes) -> None:
    try:
        client.send(data)
    except OSError:
        pass  # the server dropped it midway: what it should do


def test_a_rank_that_dies_ends_the_job_on_every_rank():
    server = Server(3)
    pmi, watch = form(server, 3)
    pmi[0].send(b"cmd=barrier_in\n")             # rank 0 waits in a barrier
    pmi[1].close()                               # rank 1 dies
    reply = parse_command(pmi[0].reader.readline().decode().strip())
    assert reply["cmd"] == "barrier_out" and reply["rc"] == "-1"
    for client in (watch[0], watch[2]):
        assert "rank 1 (on hostA) exited or was killed before it finalized MPI" in \
            client.answer()["abort"]
    for client in (pmi[0], pmi[2]):
        client.close()
    assert server.ended() == 1


def test_mpi_abort_on_one_rank_reaches_the_others():
    server = Server(2)
    pmi, watch = form(server)
    pmi[1].send(rb"cmd=abort exitcode=3 message=out\ of\ memory" + b"\n")
    assert watch[0].answer()["abort"] == \
        "rank 1 called MPI_Abort (exit code 3): out of memory"
    for client in pmi:
        client.close()
    assert server.ended() == 1


def test_ranks_that_never_arrive_are_named_to_those_that_did():
    server = Server(3, start_timeout=1.0)
    arrived = server.connect()
    arrived.greet(1, size=3)
    answer = arrived.answer()
    assert "rank(s) 0, 2 of 3 did not reach the PMI server within the start timeout " \
        "(1 s)" in answer["error"], answer
    arrived.close()
    assert server.ended() == 1


def test_nothing_connects_once_the_job_is_whole():
    server = Server(2)
    pmi, _ = form(server)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).recv(1)
    finish(pmi)
    assert server.ended() == 0
