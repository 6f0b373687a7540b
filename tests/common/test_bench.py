"""The benchmark runs end to end on 2 ranks and writes consistent figures."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from multirank import assert_ok, run_ranks


def test_bench_writes_table_json_and_plot(tmp_path: Path):
    script = tmp_path / "run_bench.py"
    script.write_text("from horovodish.bench import main\nimport sys\nmain(sys.argv[1:])\n")
    out, png = tmp_path / "bench.json", tmp_path / "busbw.png"
    result = run_ranks(script, 2, args=["--json", str(out), "--plot", str(png),
                                        "--max-bytes", str(1 << 20), "--idle-rounds", "3"],
                       timeout=180)
    assert_ok(result)
    assert "ratio" in result.stdout and "idle cost" in result.stdout
    figures = json.loads(out.read_text())
    assert figures["ranks"] == 2
    assert [row["bytes"] for row in figures["allreduce"]] == [4 << 10, 16 << 10, 64 << 10,
                                                              256 << 10, 1 << 20]
    for row in figures["allreduce"]:
        assert row["runtime_s"] > 0 and row["mpi_s"] > 0
        assert abs(row["ratio"] - row["mpi_s"] / row["runtime_s"]) < 1e-9
    small = figures["many_small"]
    assert small["count"] == 256
    assert small["runtime_s"] > 0 and small["torch_runtime_s"] > 0  # torch: a dev install
    assert abs(small["runtime_over_one_call"] - small["runtime_s"] / small["mpi_one_call_s"]) \
        < 1e-9
    assert "through horovodish.torch" in result.stdout
    assert png.stat().st_size > 1000
    idle = figures["idle"]
    share = idle["runtime_thread_cpu_percent"]
    assert idle["rounds"] == 3 and (share != share or 0 < share < 100)  # nan: no schedstat
    assert idle["noise_floor_percent"] >= 0 and "noise floor" in result.stdout
