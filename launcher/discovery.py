"""Where an elastic job may run: the hosts and slots there are, minus what failed.

Why its own module: the elastic loop (elastic.py) asks one question again and again
("which slots can the next job use?") while hosts come and go; the answer combines what
the discovery script (or a fixed -H list) says with what the launcher has seen fail, and
each part is pure enough to test on its own.

* A discovery script (``--host-discovery-script``, Horovod's contract) is an executable
  that prints one ``host`` or ``host:slots`` per line (``--slots-per-host`` for lines
  without a count); it is run again every few seconds, never through a shell.
* A lost host is dropped whole; a rank killed on a host that is still there costs that
  host one slot (on one host, 4 ranks of which one was killed go on as 3). Without
  ``--blacklist-cooldown-range`` a drop is for the rest of the job (Horovod's default);
  with ``MIN MAX`` it lasts MIN seconds doubled for each earlier drop of the host, plus
  a random part of up to MIN, at most MAX (Horovod's cooldown), and the slots then count
  again.
"""
from __future__ import annotations

import math
import random
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .hosts import Host

DISCOVERY_TIMEOUT = 30.0


def parse_discovery(text: str, default_slots: int) -> dict[str, int]:
    """``host`` / ``host:slots`` lines -> {host: slots}, in order; blank lines skipped.
    Raises ValueError naming the line that is neither."""
    found: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        name, colon, count = line.partition(":")
        try:
            slots = int(count) if colon else default_slots
        except ValueError:
            slots = -1
        if not name or " " in name or slots < 1:
            raise ValueError(f"line {number}: {raw.strip()!r} is not 'host' or "
                             "'host:slots' with slots >= 1")
        found[name] = slots
    return found


class FixedHosts:
    """-H / --hostfile (or this host alone): the same hosts every time."""

    def __init__(self, hosts: Sequence[Host], default_slots: int) -> None:
        self.hosts = {h.name: h.slots or default_slots for h in hosts}

    def find(self) -> dict[str, int]:
        return dict(self.hosts)


class DiscoveryScript:
    """Runs the script (argv of one path, no shell) and parses what it prints."""

    def __init__(self, path: str, default_slots: int,
                 timeout: float = DISCOVERY_TIMEOUT) -> None:
        self.path = path
        self.default_slots = default_slots
        self.timeout = timeout

    def find(self) -> dict[str, int]:
        """Raises RuntimeError saying why when the script fails or prints nonsense."""
        try:
            done = subprocess.run([self.path], capture_output=True, text=True,
                                  errors="replace", timeout=self.timeout,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"host discovery script {self.path}: {exc}") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [""])[-1]
            raise RuntimeError(f"host discovery script {self.path} exited with code "
                               f"{done.returncode}" + (f": {last}" if last else ""))
        try:
            return parse_discovery(done.stdout, self.default_slots)
        except ValueError as exc:
            raise RuntimeError(f"host discovery script {self.path}: {exc}") from None


@dataclass
class _Drop:
    slots: int | None  # None: the whole host
    until: float


@dataclass
class Blacklist:
    """Hosts and slots taken out after failures, for a cooldown or for good."""

    cooldown: tuple[float, float] | None = None
    clock: Callable[[], float] = time.monotonic
    jitter: Callable[[], float] = random.random
    _drops: dict[str, list[_Drop]] = field(default_factory=dict)
    _count: dict[str, int] = field(default_factory=dict)

    def drop(self, host: str, slots: int | None = None) -> float:
        """Take out ``slots`` of host (None: all of it); returns the cooldown (inf: for
        the rest of the job)."""
        self._count[host] = count = self._count.get(host, 0) + 1
        if self.cooldown is None:
            delay = math.inf
        else:
            low, high = self.cooldown
            delay = min(high, low * 2 ** (count - 1) + self.jitter() * low)
        self._drops.setdefault(host, []).append(_Drop(slots, self.clock() + delay))
        return delay

    def apply(self, hosts: Mapping[str, int]) -> dict[str, int]:
        """hosts less what is dropped now (hosts left with no slot are left out)."""
        now = self.clock()
        left: dict[str, int] = {}
        for name, slots in hosts.items():
            active = [d for d in self._drops.get(name, []) if d.until > now]
            if any(d.slots is None for d in active):
                continue
            slots -= sum(d.slots for d in active)  # type: ignore[misc]
            if slots > 0:
                left[name] = slots
        return left


def plan(hosts: Mapping[str, int], order: Sequence[str], max_np: int | None) -> list[Host]:
    """The hosts of the next job: hosts seen in earlier jobs first (in ``order``; so
    ranks stay on the hosts that have the commits, rank 0 on the oldest), then new
    ones, taking slots until max_np."""
    names = [n for n in order if n in hosts] + [n for n in hosts if n not in order]
    chosen: list[Host] = []
    left = math.inf if max_np is None else max_np
    for name in names:
        take = min(hosts[name], left)
        if take <= 0:
            break
        chosen.append(Host(name, int(take), "colon"))
        left -= take
    return chosen


def slots_of(hosts: Sequence[Host]) -> int:
    return sum(h.slots or 0 for h in hosts)


def describe(hosts: Sequence[Host] | Mapping[str, int]) -> str:
    """'h1:2,h2:2' (or 'no host')."""
    items = hosts.items() if isinstance(hosts, Mapping) else \
        [(h.name, h.slots) for h in hosts]
    return ",".join(f"{name}:{slots}" for name, slots in items) or "no host"


def host_of_rank(hosts: Sequence[Host], rank: int) -> str | None:
    """The host that runs world rank ``rank``: Hydra and Open MPI fill the hosts of a
    ``-hosts h1:2,h2:2`` list in order (ranks 0, 1 on h1, ...)."""
    for host in hosts:
        if rank < (host.slots or 0):
            return host.name
        rank -= host.slots or 0
    return None
