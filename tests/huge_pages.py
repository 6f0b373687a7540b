"""How much of a range of this process's memory transparent huge pages back, and the
kernel's huge-page mode: for the tests that check buffers get huge pages (MPI's
transfers into 4 KiB pages ran at half speed or less; docs/tuning.md, "Huge pages")."""
from __future__ import annotations

import re

from horovodish.common.huge_pages import kernel_mode


def huge_page_kib(low: int, high: int) -> int:
    """kB of huge pages backing [low, high): every part of the mappings it overlaps
    (numpy's and PyTorch's madvise split a mapping, so the part holding the first byte
    can be a 4 KiB head with none)."""
    huge, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            mapping = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
            if mapping:
                inside = int(mapping.group(1), 16) < high and low < int(mapping.group(2), 16)
            elif inside and line.startswith("AnonHugePages:"):
                huge += int(line.split()[1])
    return huge


def thp_mode() -> str:
    """The kernel's transparent huge page mode: always, madvise or never (never where
    the kernel does not say)."""
    mode = kernel_mode()
    return "never" if mode == "unknown" else mode
