"""The benchmark runs end to end on 2 ranks, through every public path, and writes
consistent figures (its speed is the bench's business, not this test's)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from multirank import assert_ok, run_ranks

PATHS = ["core in place", "torch allreduce_", "torch allreduce", "tensorflow allreduce"]


def run_bench_module(tmp_path: Path, module: str, argv: list[str], timeout: float) -> str:
    """``python -m horovodish.bench.<module> argv`` on 2 ranks; its output (exit 0)."""
    script = tmp_path / f"run_{module}.py"
    script.write_text(f"import sys\nfrom horovodish.bench import {module}\n"
                      f"sys.argv[1:] = {argv!r}\n{module}.main()\n")
    result = run_ranks(script, 2, timeout=timeout)
    assert_ok(result)
    return result.stdout


def test_bench_writes_table_json_and_plot(tmp_path: Path):
    script = tmp_path / "run_bench.py"
    script.write_text("from horovodish.bench import main\nimport sys\nmain(sys.argv[1:])\n")
    out, png = tmp_path / "bench.json", tmp_path / "busbw.png"
    # The JAX step starts JAX's own distributed runtime: tests/jax/test_jax_bench.py.
    result = run_ranks(script, 2, args=["--json", str(out), "--plot", str(png),
                                        "--max-bytes", str(16 << 10), "--idle-rounds", "3",
                                        "--rounds", "1", "--frameworks", "torch,tensorflow",
                                        "--budget-scale", "0.1"],
                       timeout=300)
    assert_ok(result)
    assert "ratio to MPI_Allreduce" in result.stdout and "idle cost" in result.stdout
    assert "machine mode: writing shared memory" in result.stdout
    figures = json.loads(out.read_text())
    assert figures["ranks"] == 2
    assert figures["sharing"]["before"] > 0 and figures["sharing"]["after"] > 0
    # The ranks ran under horovodishrun: glibc's tunable, unless this environment set
    # its own, and torch's switch, are recorded as the ranks had them.
    expected_malloc = "1" if "glibc.malloc.hugetlb" not in os.environ.get(
        "GLIBC_TUNABLES", "") else figures["huge_pages"]["malloc"]
    assert figures["huge_pages"]["malloc"] == expected_malloc, figures["huge_pages"]
    assert figures["huge_pages"]["torch"] == os.environ.get("THP_MEM_ALLOC_ENABLE", "1")
    assert "huge pages: kernel mode" in result.stdout
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
    others = figures["collectives"]
    assert {row["op"] for row in others} == {"broadcast", "grouped allreduce of 8",
                                            "allgather", "reducescatter", "alltoall"}
    for row in others:
        assert row["bytes"] == 4 << 10 and row["mpi_s"] > 0
        # Each path's first call at the size, and MPI's, timed apart.
        # ... and MPI's out-of-place call that allocates its output, the baseline of the
        # out-of-place paths' first calls.
        assert set(row["first_call_s"]) == set(row["paths"]) | {"MPI", "MPI, fresh output"}
        assert all(v > 0 for v in row["first_call_s"].values())
        out_of_place = [path for path in row["paths"] if not path.endswith("_")]
        assert list(row["first_over_mpi_fresh"]) == out_of_place, row
        for path in out_of_place:
            assert abs(row["first_over_mpi_fresh"][path] - row["first_call_s"][path]
                       / row["first_call_s"]["MPI, fresh output"]) < 1e-9
        for path, values in row["paths"].items():
            assert abs(row["first_over_later"][path]
                       - row["first_call_s"][path] / values["seconds"]) < 1e-9
        for values in row["paths"].values():
            assert abs(values["ratio_to_mpi"] - row["mpi_s"] / values["seconds"]) < 1e-9
        assert sum(path.startswith("tf ") for path in row["paths"]) == 1, row["paths"]
        if row["op"] in ("broadcast", "grouped allreduce of 8"):
            (in_place, out_of_place, _) = row["paths"]
            assert abs(row["in_place_over_out_of_place"] - row["paths"][in_place]["seconds"]
                       / row["paths"][out_of_place]["seconds"]) < 1e-9
    assert "other collectives through torch" in result.stdout
    step = figures["training"]
    assert set(step["steps_per_s"]) == {"horovodish DistributedOptimizer",
                                        "torch DDP (gloo)", "no communication"}
    assert all(rate > 0 for rate in step["steps_per_s"].values())
    assert set(step["phases_s"]) == {"forward_backward", "wait_for_reductions", "optimizer"}
    by_rank = step["forward_backward_by_rank_s"]  # the phases' mean is theirs
    assert len(by_rank) == figures["ranks"] and all(t > 0 for t in by_rank), by_rank
    assert abs(sum(by_rank) / len(by_rank) - step["phases_s"]["forward_backward"]) < 1e-9
    many = figures["many_tensors"]
    assert many["parameter_tensors"] == 162 and "many-tensor step" in result.stdout
    ours, ddp = "horovodish DistributedOptimizer", "torch DDP (gloo)"
    for row in (many, many["sharded"]):  # replicated, and sharded against torch's ZeRO
        assert set(row["ms_per_step"]) == {ours, ddp, "no communication"}
        for key in (ours, ddp):  # per round: (step - plain step) / 162, in us
            low, high = row["added_us_per_tensor_range"][key]
            assert low <= row["added_us_per_tensor"][key] <= high
            step_low, step_high = row["ms_per_step_range"][key]
            assert step_low <= row["ms_per_step"][key] <= step_high
        low, high = row["ours_added_over_ddp_added_range"]
        assert low <= row["ours_added_over_ddp_added"] <= high
    per_call = figures["per_call"]  # against torch.distributed on gloo, up to --max-bytes
    assert [row["bytes"] for row in per_call] == [4 << 10], per_call
    for row in per_call:
        assert row["ours_s"] > 0 and row["theirs_s"] > 0
        low, high = row["ours_over_theirs_s_range"]
        assert low <= row["ours_over_theirs_s"] <= high
    assert "per call: horovodish allreduce_ against torch.distributed.all_reduce (gloo)" \
        in result.stdout
    assert png.stat().st_size > 1000
    # Rank 0's simulated negotiation: every scenario at 2 and 128 ranks, the slow ones
    # negotiated on the slow path, the steady one not, and Python work measured.
    cycles = {(row["ranks"], row["scenario"]): row for row in figures["negotiation"]["rows"]}
    assert {ranks for ranks, _ in cycles} == {2, 128}
    assert cycles[(128, "first step")]["slow_path"] and not cycles[(128, "steady")]["slow_path"]
    assert all(row["work_ms"] > 0 for row in cycles.values())
    assert cycles[(128, "first step")]["gathered_mb"] > cycles[(2, "first step")]["gathered_mb"]
    alike = cycles[(128, "first step, every list alike")]  # answered without the coordinator
    assert alike["slow_path"] and alike["gathered_mb"] == alike["bcast_mb"] == 0
    eager = cycles[(128, "steady, 4 scalars ride along")]  # the fast path with scalars
    assert not eager["slow_path"] and eager["rides_by_default"]
    assert eager["model_network_ms"] < eager["model_without_ms"]
    misses = figures["cache_misses"]  # slow-path cycles per step of real workloads
    assert misses["distributed_optimizer"][0] >= 1  # the first step negotiates
    assert misses["total_after_first_step"]["allgather_first_dims_change"] == 0
    assert misses["total_after_first_step"]["alltoall_splits_change"] == 0
    cost = misses["miss_cost"]  # a real cache miss's price, beside a hit and raw MPI
    assert cost["slow_cycles_per_uncached_call"] >= 1
    # (Times only: which is faster is the bench's to report, not a test's to assert.)
    assert cost["uncached_us"] > 0 and cost["cached_us"] > 0 and cost["mpi_us"] > 0
    # Two ranks calling alike: most misses answered without the coordinator, with data.
    assert cost["unanimous_share"] > 0.5 and 0 < cost["with_data_share"] <= cost["unanimous_share"]
    idle = figures["idle"]
    share = idle["runtime_thread_cpu_percent"]
    assert idle["rounds"] == 3 and (share != share or 0 < share < 100)  # nan: no schedstat
    assert idle["noise_floor_percent"] >= 0 and "noise floor" in result.stdout


def test_backends_bench_forces_each_backend_and_reports_ratios(tmp_path: Path):
    """python -m horovodish.bench.backends: every path and mode has a row and a ratio to
    the default (1.00 for the default itself), and each forced mode really picks that
    backend for a single tensor (else the comparison would time one backend four times)."""
    script = tmp_path / "run_backends.py"
    script.write_text(
        "import sys\n"
        "from horovodish.bench import backends\n"
        "from horovodish.common.api import lifecycle, process_state\n"
        "from horovodish.common.messages import RequestType\n"
        "sys.argv[1:] = ['--rounds', '1', '--sizes', '65536']\n"
        "lifecycle.init()\n"
        "manager = process_state.state().runtime.executor.operations\n"
        "for mode in backends.MODES:\n"
        "    with backends.forced(mode):\n"
        "        chosen = manager.choose(RequestType.ALLREDUCE, 'float32', 65536).name\n"
        "    print(f'CHOSEN {mode} {chosen}', flush=True)\n"
        "backends.main()\n")
    result = run_ranks(script, 2, timeout=300)
    assert_ok(result)
    for mode, backend in ((None, "shm"), ("shm", "shm"), ("ring", "ring"), ("mpi", "mpi")):
        assert result.stdout.count(f"CHOSEN {mode} {backend}") == 2, result.stdout
    rows = [line.split() for line in result.stdout.splitlines()
            if line.strip().startswith("65536")]
    assert {" ".join(row[1:-8]) for row in rows} == {
        "numpy (core)", "torch allreduce_", "torch allreduce"}, rows
    for row in rows:
        assert row[-7] == "(1.00)", row  # the default against itself
        assert all(float(cell) > 0 for cell in row[-8::2]), row


def test_collectives_sweep_times_every_collective_and_writes_a_record(tmp_path: Path):
    """python -m horovodish.bench.collectives: allreduce in and out of place beside the
    other collectives, each with its ratio to MPI and its first call apart, in a
    record named by the number of ranks."""
    run_bench_module(tmp_path, "collectives", ["--max-bytes", "4096", "--rounds", "1",
                                               "--record", str(tmp_path)], timeout=300)
    (path,) = tmp_path.glob("collectives-2-ranks-*.json")
    figures = json.loads(path.read_text())["figures"]
    rows = {row["op"]: row for row in figures["rows"]}
    assert set(rows) == {"allreduce", "broadcast", "grouped allreduce of 8", "allgather",
                         "reducescatter", "alltoall"}
    assert set(rows["allreduce"]["paths"]) == {"allreduce_", "allreduce"}
    for row in rows.values():
        assert row["bytes"] == 4096 and row["mpi_s"] > 0
        for name, values in row["paths"].items():
            assert abs(values["ratio_to_mpi"] - row["mpi_s"] / values["seconds"]) < 1e-9
            assert row["first_call_s"][name] > 0
        assert row["first_call_s"]["MPI, fresh output"] > 0
        assert set(row["first_over_mpi_fresh"]) == \
            {name for name in row["paths"] if not name.endswith("_")}


def test_phases_bench_accounts_for_the_whole_call(tmp_path: Path):
    """python -m horovodish.bench.phases: every phase has a figure, and the top-level
    phases add up to the measured total (the breakdown leaves nothing out)."""
    stdout = run_bench_module(tmp_path, "phases", ["--sizes", "4096,65536", "--calls", "40"],
                              timeout=300)
    rows = {line[:24].strip(): [float(v.rstrip("x")) for v in line[24:].split()]
            for line in stdout.splitlines()
            if line[:24].strip() in (*PHASE_NAMES, "total", "MPI_Allreduce")}
    assert set(rows) == {*PHASE_NAMES, "total", "MPI_Allreduce"}, stdout
    for column in range(2):
        top = sum(rows[name][column] for name in TOP_LEVEL)
        assert abs(top - rows["total"][column]) <= 0.2 + 0.01 * rows["total"][column], rows
        assert rows["total"][column] > 0 and rows["MPI_Allreduce"][column] > 0
        assert rows["backend data path"][column] <= rows["execute"][column] + 0.1


PHASE_NAMES = ("submit", "start cycle", "negotiation wait", "finish cycle", "execute",
               "backend data path", "the rest")
TOP_LEVEL = ("submit", "start cycle", "negotiation wait", "finish cycle", "the rest")


def test_eager_bench_times_each_size_both_ways(tmp_path: Path):
    """python -m horovodish.bench.eager: a row per size with MPI's, the eager and the
    ordinary time and both ratios; sizes beyond every limit are marked as the same path.
    The switch between the two runs every rank's runtime at the same point: a job that
    hung on it would time out here."""
    stdout = run_bench_module(tmp_path, "eager",
                              ["--sizes", "4096,262144,4194304", "--rounds", "2"], timeout=300)
    rows = {int(line.split()[0]): line.split()[1:] for line in stdout.splitlines()
            if line.strip() and line.split()[0].isdigit()}
    assert set(rows) == {4096, 262144, 4194304}, stdout
    for size, cells in rows.items():
        times = [float(v) for v in cells[:3]]
        assert all(t > 0 for t in times), cells
        assert cells[3].endswith("x") and cells[4].endswith("x"), cells
        assert ("the same path" in " ".join(cells)) == (size == 4194304), cells


def test_sharing_bench_times_each_setting_against_writing_alone(tmp_path: Path):
    """python -m horovodish.bench.sharing: a row per setting, each with a positive time
    and its ratio to writing alone (1.0 for alone itself); what the ratios are is the
    machine's business."""
    stdout = run_bench_module(tmp_path, "sharing", ["--bytes", "65536", "--repeats", "5"],
                              timeout=120)
    rows = [line for line in stdout.splitlines() if "x alone)" in line]
    assert [line[:38].strip() for line in rows] == [
        "alone", "after rank 1 read it", "after rank 1 read it, then 2 MiB"], stdout
    for line in rows:
        time_us, ratio = line[38:].split()[:2]
        assert float(time_us) > 0 and float(ratio.strip("(x")) > 0, line
    assert rows[0].rstrip().endswith("(1.0x alone)"), rows[0]


def test_the_bench_reads_the_malloc_tunable_among_others():
    from horovodish.bench.environment import describe, malloc_setting
    assert malloc_setting({}) == "unset"
    assert malloc_setting({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == "unset"
    assert malloc_setting({"GLIBC_TUNABLES":
                           "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"}) == "0"
    assert malloc_setting({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}) == "1"
    line = describe({"kernel": "madvise", "malloc": "unset", "torch": "1"})
    assert "malloc maps" in line and "off" in line and "madvise" in line
