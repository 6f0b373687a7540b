"""A job started without glibc's huge-page tunable (plain mpirun) is told on rank 0 how
to get it; one started by horovodishrun, which sets it, is not (horovodish/common/
huge_pages.py says why it matters)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from horovodish.common.huge_pages import kernel_mode, missing_tunable_hint
from horovodish.launcher.mpirun import find_mpirun
from horovodish.launcher.process import kill_tree

from multirank import assert_ok, run_ranks  # noqa: E402

INIT = "from horovodish.common import api\napi.init()\napi.shutdown()\n"
HINT = "the ranks run without GLIBC_TUNABLES=glibc.malloc.hugetlb=1"


def test_the_hint_names_the_tunable_unless_it_is_set_or_useless():
    hint = missing_tunable_hint({}, "madvise")
    assert hint and hint.startswith(HINT) and "glibc.malloc.hugetlb=0" in hint
    assert missing_tunable_hint({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "madvise")
    for environ, mode in (({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, "madvise"),
                          ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise"),
                          ({}, "always"), ({}, "never"), ({}, "unknown")):
        assert missing_tunable_hint(environ, mode) is None, (environ, mode)


@pytest.mark.skipif(kernel_mode() != "madvise",
                    reason="huge pages here do not depend on the tunable: nothing to hint")
def test_plain_mpirun_gets_the_hint_on_rank_0_and_horovodishrun_does_not(tmp_path: Path):
    script = tmp_path / "init.py"
    script.write_text(INIT)
    mpirun = find_mpirun()
    assert mpirun, "no mpirun next to the interpreter or on PATH"
    env = {key: value for key, value in os.environ.items() if key != "GLIBC_TUNABLES"}
    proc = subprocess.Popen([mpirun, "-np", "2", sys.executable, str(script)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        raise
    assert proc.returncode == 0, out
    assert out.count(HINT) == 1 and f"[horovodish rank 0] WARNING: {HINT}" in out, out

    launched = run_ranks(script, 2, env={"GLIBC_TUNABLES": ""})
    assert_ok(launched)
    assert HINT not in launched.stdout, launched.stdout
