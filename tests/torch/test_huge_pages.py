"""Large torch tensors get transparent huge pages: horovodish.torch turns on PyTorch's
switch for them (THP_MEM_ALLOC_ENABLE) unless the caller set it, and horovodishrun gives
it to the ranks. Without huge pages, MPI's transfers of torch memory and our copies ran
far slower than on numpy's (docs/tuning.md, "Huge pages")."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from horovodish.launcher.envvars import rank_defaults
from huge_pages import thp_mode

# Prints the kB of a 16 MiB tensor the kernel may back with huge pages, allocated after
# the import, then the switch as the process sees it.
PROBE = """
import os
import horovodish.torch
import torch
from huge_pages import eligible_kib
tensor = torch.ones(4 << 20)
print(eligible_kib(tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * 4),
      os.environ.get("THP_MEM_ALLOC_ENABLE"))
"""


def _probe(**env: str) -> tuple[int, str]:
    environ = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**environ, **env},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    huge, switch = out.split()
    return int(huge), switch


OLD_TORCH = tuple(int(n) for n in torch.__version__.split(".")[:2]) < (2, 1)


@pytest.mark.skipif(thp_mode() == "never", reason="transparent huge pages are off here")
@pytest.mark.skipif(OLD_TORCH, reason=f"torch {torch.__version__} has no THP_MEM_ALLOC_ENABLE "
                                      "(it arrived in torch 2.1)")
def test_large_tensors_get_huge_pages_unless_the_caller_says_no():
    huge, switch = _probe()
    assert switch == "1" and huge >= 2048, f"{huge} kB may get huge pages with the switch {switch}"
    if thp_mode() == "madvise":  # "always" gives huge pages whatever the switch says
        huge, switch = _probe(THP_MEM_ALLOC_ENABLE="0")
        assert switch == "0" and huge == 0, f"{huge} kB may get huge pages with the switch off"


def test_the_launcher_gives_the_ranks_the_switch_unless_set():
    assert rank_defaults({})["THP_MEM_ALLOC_ENABLE"] == "1"
    assert "THP_MEM_ALLOC_ENABLE" not in rank_defaults({"THP_MEM_ALLOC_ENABLE": "0"})
