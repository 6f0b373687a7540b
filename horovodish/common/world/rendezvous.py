"""Where the job's PMI server is, and who starts it: through what the launcher has.

* A driver (horovodishrun without mpirun, Ray, Spark) started the server and put its
  address and key in every rank's environment.
* torchrun's agent hosts a torch ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``, and a
  script that called ``torch.distributed.init_process_group`` first has one too (Ray
  Train's ``TorchTrainer`` does so before the user's function): rank 0 starts the
  server on a free port and publishes its address with a fresh random key in the store,
  under the run id (torchrun's restarts count in it), so a restarted group never reads
  the previous one's; the other ranks read it there.
* Otherwise (a bare environment, a plain ``srun``): rank 0's server listens on
  ``MASTER_PORT`` itself (under Slurm, on a port derived from the job and step ids),
  and the others connect to it there. Once every rank is connected the server stops
  listening, so a ``init_process_group`` called later can take the port.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import secrets
import socket
import struct
import sys
import time
from dataclasses import dataclass
from typing import Any

from .launch_env import Launch
from .pmi_server import ServerConfig
from .server_process import ServerProcess


@dataclass
class Meeting:
    """Where this rank greets the server, with which key; and the server, on the rank
    that started it."""

    addresses: list[tuple[str, int]]
    key: str
    server: ServerProcess | None = None


def meet(launch: Launch, start_timeout: float, deadline: float) -> Meeting:
    """The server's address and key for this rank (rank 0 starts the server first
    where no driver did)."""
    if launch.kind == "driver":
        host, _, port = (launch.server or "").rpartition(":")
        if not host or not port.isdigit() or not launch.secret:
            raise RuntimeError(
                f"horovodish.init(): HOROVODISH_PMI_SERVER={launch.server!r} needs the "
                "form host:port, and HOROVODISH_SECRET the job's key (the driver sets both)")
        return Meeting([(host, int(port))], launch.secret)
    store = _torch_store(launch, deadline)
    if store is not None:
        return _through_store(launch, store, start_timeout, deadline)
    return _at_master_port(launch, start_timeout)


def _torch_store(launch: Launch, deadline: float) -> Any:
    """torch's store of this job: the default process group's, or torchrun's agent's;
    None when there is neither."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return distributed.distributed_c10d._get_default_store()
    if not launch.agent_store or launch.master_addr is None:
        return None
    import torch.distributed as distributed  # torchrun's agent: torch is there
    timeout = datetime.timedelta(seconds=max(1.0, deadline - time.monotonic()))
    try:
        return distributed.TCPStore(launch.master_addr, launch.ports[0], is_master=False,
                                    timeout=timeout)
    except (RuntimeError, OSError) as exc:
        raise RuntimeError(
            f"horovodish.init() on rank {launch.rank}: cannot reach torchrun's store at "
            f"{launch.master_addr}:{launch.ports[0]} (MASTER_ADDR, MASTER_PORT): {exc}") \
            from None


def _through_store(launch: Launch, store: Any, start_timeout: float,
                   deadline: float) -> Meeting:
    name = f"horovodish/{launch.run_id}/pmi_server"
    if launch.rank == 0:
        key = launch.secret or secrets.token_hex(16)
        server = _start_server(launch, key, ("",), (0,), start_timeout)
        hosts = addresses_toward(launch.master_addr)
        store.set(name, json.dumps({"hosts": hosts, "port": server.port, "key": key}))
        return Meeting([("127.0.0.1", server.port)], key, server)
    left = max(1.0, deadline - time.monotonic())
    try:
        store.wait([name], datetime.timedelta(seconds=left))
        where = json.loads(store.get(name))
    except (RuntimeError, OSError, ValueError) as exc:
        raise RuntimeError(
            f"horovodish.init() on rank {launch.rank}: rank 0 did not publish the PMI "
            f"server's address in {launch.launcher}'s store within {left:.0f} s ({exc}); "
            "check that rank 0 started and called hvd.init()") from None
    return Meeting([(host, int(where["port"])) for host in where["hosts"]], where["key"])


def _at_master_port(launch: Launch, start_timeout: float) -> Meeting:
    key = launch.job_key()
    assert launch.master_addr is not None
    if launch.rank == 0:
        server = _start_server(launch, key, ("",), launch.ports, start_timeout)
        return Meeting([("127.0.0.1", server.port)], key, server)
    return Meeting([(launch.master_addr, port) for port in launch.ports], key)


def _start_server(launch: Launch, key: str, hosts: tuple[str, ...], ports: tuple[int, ...],
                  start_timeout: float) -> ServerProcess:
    config = ServerConfig(launch.size, key, launch.run_id, start_timeout, hosts[0], ports)
    try:
        return ServerProcess.start(config)
    except OSError as exc:
        where = ", ".join(map(str, ports))
        raise RuntimeError(
            f"horovodish.init() on rank 0: cannot start the job's PMI server on port(s) "
            f"{where}: {exc}. Another program holds the port: pick a free MASTER_PORT.") \
            from None


def _is_loopback(host: str) -> bool:
    return host.startswith("127.") or host == "::1"


def addresses_toward(master: str | None) -> list[str]:
    """Where the other ranks can reach this host, best first: the address on the route
    to ``master`` (the store's host, which every rank reaches), then the host's other
    addresses, then loopback for the ranks on this host. (A host name may resolve to
    127.0.1.1 on its own host, so the name alone is not enough.)"""
    found = []
    try:
        target = socket.gethostbyname(master) if master else None
    except OSError:
        target = None
    if target and not _is_loopback(target):
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.connect((target, 9))  # no packet is sent: this only picks the route
            found.append(probe.getsockname()[0])
        except OSError:
            pass
        finally:
            probe.close()
    for address in _interface_addresses():
        if address not in found and not _is_loopback(address):
            found.append(address)
    return found + ["127.0.0.1"]


def _interface_addresses() -> list[str]:
    """The IPv4 address of each of this host's interfaces (Linux's SIOCGIFADDR)."""
    addresses = []
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(probe.fileno(), 0x8915,  # SIOCGIFADDR
                                     struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            addresses.append(socket.inet_ntoa(answer[20:24]))
    finally:
        probe.close()
    return addresses
