"""TensorFlow's large tensors get transparent huge pages in ranks horovodishrun starts:
it adds glibc's tunable (glibc.malloc.hugetlb=1) to GLIBC_TUNABLES, unless that names
it already. On memory without huge pages, MPI's transfers of TensorFlow tensors ran far
slower than of numpy's (a 16 MiB broadcast from a TF tensor took 1.5x the time;
docs/tuning.md, "Huge pages")."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from horovodish.launcher.envvars import rank_defaults
from huge_pages import thp_mode

# Prints the kB of a 16 MiB TensorFlow tensor the kernel may back with huge pages,
# then GLIBC_TUNABLES.
PROBE = """
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tensorflow as tf
from huge_pages import eligible_kib
tensor = tf.random.uniform([4 << 20])
low = np.asarray(tensor).ctypes.data
print("probe", eligible_kib(low, low + (16 << 20)), os.environ.get("GLIBC_TUNABLES"))
"""


def _probe_in_a_rank(**env: str) -> tuple[int, str]:
    environ = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-m", "horovodish.launcher", "-np", "1",
                          sys.executable, "-c", PROBE], env={**environ, **env},
                         capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stdout + out.stderr
    line = next(line for line in out.stdout.splitlines() if line.startswith("probe"))
    _, huge, tunables = line.split()
    return int(huge), tunables


@pytest.mark.skipif(thp_mode() != "madvise",
                    reason="huge pages follow the tunable only in the kernel's madvise mode")
def test_a_rank_tensorflow_tensor_gets_huge_pages_unless_the_caller_says_no():
    huge, tunables = _probe_in_a_rank()
    assert tunables == "glibc.malloc.hugetlb=1" and huge >= 2048, \
        f"{huge} kB may get huge pages with GLIBC_TUNABLES={tunables}"
    huge, tunables = _probe_in_a_rank(GLIBC_TUNABLES="glibc.malloc.hugetlb=0")
    assert tunables == "glibc.malloc.hugetlb=0" and huge == 0, \
        f"{huge} kB may get huge pages with GLIBC_TUNABLES={tunables}"


def test_the_tunable_joins_the_callers_others():
    assert rank_defaults({"THP_MEM_ALLOC_ENABLE": "1"}) == {
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    assert rank_defaults({"THP_MEM_ALLOC_ENABLE": "1",
                          "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == {
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}
    assert rank_defaults({"THP_MEM_ALLOC_ENABLE": "1",
                          "GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) == {}
