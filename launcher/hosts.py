"""Host lists: parse ``-H`` and ``--hostfile`` once, render them in the syntax each mpirun wants.

Why: Hydra hostfiles say ``host:N`` and reject ``slots=``; Open MPI hostfiles say
``host slots=N`` and reject ``host:N``. Users should be able to bring either.
"""
from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass

_COLON = re.compile(r"^(?P<host>[^\s:=]+):(?P<slots>\S+)$")
_SLOTS = re.compile(r"^(?P<host>[^\s:=]+)\s+slots\s*=\s*(?P<slots>\S+)(?:\s+.*)?$")
_BARE = re.compile(r"^(?P<host>[^\s:=]+)$")


@dataclass(frozen=True)
class Host:
    """One host and its slot count (``None``: let mpirun decide, usually 1 or #cores)."""

    name: str
    slots: int | None = None
    style: str = "bare"  # how it was written: "colon", "slots" or "bare"


def _slots(text: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{where}: slot count {text!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"{where}: slot count must be >= 1, got {value}")
    return value


def parse_hosts(spec: str) -> list[Host]:
    """Parse ``-H host1:2,host2:2,host3`` into hosts; raise ValueError on bad syntax."""
    hosts = []
    for item in spec.split(","):
        item = item.strip()
        m = _COLON.match(item) or _BARE.match(item)
        if not m:
            raise ValueError(f"bad host entry {item!r} (expected host or host:slots)")
        slots = m.groupdict().get("slots")
        hosts.append(Host(m["host"], _slots(slots, item) if slots else None,
                          "colon" if slots else "bare"))
    return hosts


def parse_hostfile(text: str) -> list[Host]:
    """Parse hostfile lines ``host slots=N``, ``host:N`` or ``host``; ``#`` starts a comment."""
    hosts = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        for style, pattern in (("colon", _COLON), ("slots", _SLOTS), ("bare", _BARE)):
            m = pattern.match(line)
            if m:
                slots = m.groupdict().get("slots")
                where = f"line {lineno}"
                hosts.append(Host(m["host"], _slots(slots, where) if slots else None, style))
                break
        else:
            raise ValueError(f"line {lineno}: cannot parse {raw.strip()!r} "
                             "(expected 'host slots=N', 'host:N' or 'host')")
    if not hosts:
        raise ValueError("no hosts in file")
    return hosts


def hosts_arg(hosts: list[Host]) -> str:
    """``host:N,...``: the ``-hosts``/``-H`` syntax both Hydra and Open MPI (>= 4) accept."""
    return ",".join(h.name if h.slots is None else f"{h.name}:{h.slots}" for h in hosts)


def render_hostfile(hosts: list[Host], flavour: str) -> str:
    """Hostfile text in the native syntax of ``flavour`` ("openmpi" or Hydra otherwise)."""
    lines = []
    for h in hosts:
        if h.slots is None:
            lines.append(h.name)
        elif flavour == "openmpi":
            lines.append(f"{h.name} slots={h.slots}")
        else:
            lines.append(f"{h.name}:{h.slots}")
    return "\n".join(lines) + "\n"


def hostfile_for(path: str, hosts: list[Host], flavour: str) -> tuple[str, bool]:
    """Path of a hostfile this mpirun understands and whether it is a temp file to delete.

    Always rewritten from the parsed hosts, even when the user's syntax is native: what
    we accept (``#`` comments after a host, say) is not always what mpirun accepts (Hydra
    refuses an inline ``#``)."""
    del path  # parsed already into hosts
    fd, tmp = tempfile.mkstemp(prefix="horovodish-hosts-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write(render_hostfile(hosts, flavour))
    return tmp, True
