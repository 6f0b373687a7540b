"""The benchmark runs end to end on 2 ranks, through every public path, and writes
consistent figures (its speed is the bench's business, not this test's)."""
from __future__ import annotations

import json
from pathlib import Path

from multirank import assert_ok, run_ranks

PATHS = ["core in place", "torch allreduce_", "torch allreduce", "tensorflow allreduce"]


def test_bench_writes_table_json_and_plot(tmp_path: Path):
    script = tmp_path / "run_bench.py"
    script.write_text("from horovodish.bench import main\nimport sys\nmain(sys.argv[1:])\n")
    out, png = tmp_path / "bench.json", tmp_path / "busbw.png"
    result = run_ranks(script, 2, args=["--json", str(out), "--plot", str(png),
                                        "--max-bytes", str(16 << 10), "--idle-rounds", "3",
                                        "--rounds", "1"],
                       timeout=300)
    assert_ok(result)
    assert "ratio to MPI_Allreduce" in result.stdout and "idle cost" in result.stdout
    figures = json.loads(out.read_text())
    assert figures["ranks"] == 2
    rows = figures["allreduce"]
    assert [row["bytes"] for row in rows] == [4 << 10, 16 << 10]
    for row in rows:
        assert list(row["paths"]) == PATHS, row["paths"].keys()
        for values in row["paths"].values():
            assert values["seconds"] > 0
            assert abs(values["ratio_to_mpi"] - row["mpi_s"] / values["seconds"]) < 1e-9
    small = figures["many_small"]
    assert small["count"] == 256 and list(small["paths"]) == PATHS
    for values in small["paths"].values():
        assert abs(values["over_one_call"] - values["seconds"] / small["mpi_one_call_s"]) \
            < 1e-9
    step = figures["training"]
    assert set(step["steps_per_s"]) == {"horovodish DistributedOptimizer",
                                        "torch DDP (gloo)", "no communication"}
    assert all(rate > 0 for rate in step["steps_per_s"].values())
    assert set(step["phases_s"]) == {"forward_backward", "wait_for_reductions", "optimizer"}
    assert png.stat().st_size > 1000
    idle = figures["idle"]
    share = idle["runtime_thread_cpu_percent"]
    assert idle["rounds"] == 3 and (share != share or 0 < share < 100)  # nan: no schedstat
    assert idle["noise_floor_percent"] >= 0 and "noise floor" in result.stdout
