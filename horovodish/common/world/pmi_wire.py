"""MPICH's PMI-1 wire format (``cmd=put kvsname=k key=a value=b``), and the one-line JSON
greeting a connection sends before it (ours: a job key, a rank, a role).

PMI-1 lines are ``key=value`` tokens split by spaces, a value escaping a space or a
backslash with a backslash (MPICH's ``src/pmi/src/pmi_wire.c``). A value is kept as it
came, escapes and all, and handed back the same way, so what a client put is what it
gets.
"""
from __future__ import annotations

import json
from typing import Any

GREETING_LIMIT = 4096   # bytes of a greeting line
LINE_LIMIT = 64 << 10   # bytes of a PMI line (MPICH's own are under 4 KiB)


class WireError(ValueError):
    """A line that is not what the protocol allows."""


def parse_command(line: str) -> dict[str, str]:
    """``cmd=get kvsname=k key=a`` as ``{"cmd": "get", "kvsname": "k", "key": "a"}``."""
    if not line.startswith("cmd="):
        raise WireError(f"a PMI-1 command starts with cmd=, not {line[:40]!r}")
    fields: dict[str, str] = {}
    at, end = 0, len(line)
    while at < end:
        while at < end and line[at] == " ":
            at += 1
        if at >= end:
            break
        start = at
        while at < end and line[at] not in " =":
            at += 1
        key = line[start:at]
        if not key:
            raise WireError(f"a token without a key in {line[:80]!r}")
        value = ""
        if at < end and line[at] == "=":
            at += 1
            start = at
            while at < end and line[at] != " ":
                at += 2 if line[at] == "\\" and at + 1 < end else 1
            value = line[start:at]
        fields[key] = value
    return fields


def format_command(cmd: str, **fields: Any) -> bytes:
    """One reply line; values must already be in wire form (no bare spaces)."""
    parts = [f"cmd={cmd}"] + [f"{key}={value}" for key, value in fields.items()]
    return (" ".join(parts) + "\n").encode()


def escape(text: str) -> str:
    """A free text (a message) as one wire value."""
    return text.replace("\\", "\\\\").replace(" ", "\\ ")


def greeting(**fields: Any) -> bytes:
    """A greeting or a reply to one: a JSON object on one line."""
    return (json.dumps(fields, separators=(",", ":")) + "\n").encode()


def read_greeting(line: bytes) -> dict[str, Any]:
    """A greeting line as a dict; WireError if it is not a JSON object."""
    try:
        value = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"not a greeting ({exc})") from None
    if not isinstance(value, dict):
        raise WireError("not a greeting (a JSON object was expected)")
    return value
