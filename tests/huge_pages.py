"""Whether a range of this process's memory may get transparent huge pages, and the
kernel's huge-page mode: for the tests that check buffers ask for huge pages (MPI's
transfers into 4 KiB pages ran at half speed or less; docs/tuning.md, "Huge pages").

The tests check eligibility (the kernel's THPeligible, set by the mode and by madvise),
which is what horovodish controls. How many huge pages actually back the range is the
kernel's choice: it depends on how much contiguous free memory the machine has at that
moment, so a check on it fails on a busy or fragmented machine."""
from __future__ import annotations

import re

from horovodish.common.huge_pages import kernel_mode

_MAPPING = re.compile(r"([0-9a-f]+)-([0-9a-f]+) ")


def eligible_kib(low: int, high: int) -> int:
    """kB of [low, high) inside mappings the kernel may back with huge pages (numpy's
    and PyTorch's madvise split a mapping, so the part holding the first byte can be an
    ineligible 4 KiB head)."""
    total = 0
    for fields in _overlapping(low, high):
        if fields.get("THPeligible") == "1":
            total += min(high, fields["end"]) - max(low, fields["start"])
    return total >> 10


def _overlapping(low: int, high: int) -> list[dict]:
    """Each mapping of /proc/self/smaps that overlaps [low, high): its start, end and
    the first word of each field."""
    found: list[dict] = []
    current: dict | None = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            mapping = _MAPPING.match(line)
            if mapping:
                start, end = int(mapping.group(1), 16), int(mapping.group(2), 16)
                current = {"start": start, "end": end} if start < high and low < end else None
                if current is not None:
                    found.append(current)
            elif current is not None and ":" in line:
                name, _, value = line.partition(":")
                words = value.split()
                current[name] = words[0] if words else ""
    return found


def thp_mode() -> str:
    """The kernel's transparent huge page mode: always, madvise or never (never where
    the kernel does not say)."""
    mode = kernel_mode()
    return "never" if mode == "unknown" else mode
