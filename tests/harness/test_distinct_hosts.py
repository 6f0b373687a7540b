"""tests/gpu/distinct_hosts.py gives every rank an NCCL_HOSTID of its own (what lets
several NCCL ranks share one GPU) and runs the script with its arguments."""
from __future__ import annotations

import re
from pathlib import Path

from multirank import assert_ok, run_ranks

WRAPPER = Path(__file__).resolve().parents[1] / "gpu" / "distinct_hosts.py"


def test_each_rank_gets_its_own_host_id(tmp_path: Path):
    script = tmp_path / "show.py"
    script.write_text("import os, sys\nfrom mpi4py import MPI\n"
                      "sys.stdout.write(f\"RANK {MPI.COMM_WORLD.rank} HOSTID "
                      "{os.environ['NCCL_HOSTID']} ARGS {sys.argv[1:]}\\n\")\n")
    result = run_ranks(WRAPPER, 3, args=[script, "a", "b"], timeout=60)
    assert_ok(result)
    seen = dict(re.findall(r"RANK (\d) HOSTID (\S+) ARGS \['a', 'b'\]", result.stdout))
    assert sorted(seen) == ["0", "1", "2"], result.stdout
    assert len(set(seen.values())) == 3, seen
