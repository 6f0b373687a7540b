"""Large torch tensors get transparent huge pages: horovodish.torch turns on PyTorch's
switch for them (THP_MEM_ALLOC_ENABLE) unless the caller set it, and horovodishrun gives
it to the ranks. Without huge pages, MPI's transfers of torch memory and our copies ran
far slower than on numpy's (docs/tuning.md, "Huge pages")."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from horovodish.launcher.envvars import rank_defaults

# Prints the huge-page kB backing a 16 MiB tensor allocated after the import, then the
# switch as the process sees it.
PROBE = """
import os, re
import horovodish.torch
import torch
tensor = torch.ones(4 << 20)
low, high = tensor.data_ptr(), tensor.data_ptr() + tensor.nbytes
huge, inside = 0, False
for line in open("/proc/self/smaps"):  # madvise splits a mapping: sum every part
    mapping = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
    if mapping:
        inside = int(mapping.group(1), 16) < high and low < int(mapping.group(2), 16)
    elif inside and line.startswith("AnonHugePages:"):
        huge += int(line.split()[1])
print(huge, os.environ.get("THP_MEM_ALLOC_ENABLE"))
"""


def _probe(**env: str) -> tuple[int, str]:
    environ = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**environ, **env},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    huge, switch = out.split()
    return int(huge), switch


def _thp_mode() -> str:
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    text = path.read_text() if path.exists() else "[never]"
    return text[text.index("[") + 1:text.index("]")]


@pytest.mark.skipif(_thp_mode() == "never", reason="transparent huge pages are off here")
def test_large_tensors_get_huge_pages_unless_the_caller_says_no():
    huge, switch = _probe()
    assert switch == "1" and huge >= 2048, f"{huge} kB of huge pages with the switch {switch}"
    if _thp_mode() == "madvise":  # "always" gives huge pages whatever the switch says
        huge, switch = _probe(THP_MEM_ALLOC_ENABLE="0")
        assert switch == "0" and huge == 0, f"{huge} kB of huge pages with the switch off"


def test_the_launcher_gives_the_ranks_the_switch_unless_set():
    assert rank_defaults({})["THP_MEM_ALLOC_ENABLE"] == "1"
    assert "THP_MEM_ALLOC_ENABLE" not in rank_defaults({"THP_MEM_ALLOC_ENABLE": "0"})
