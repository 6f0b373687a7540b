"""Records and the program that renders them into the docs (horovodish/bench/records.py,
render.py): the newest record of a kind fills its marked block, and the committed docs
are what the committed records give."""
from __future__ import annotations

import json
from pathlib import Path

from horovodish.bench import records, render

REPO = Path(__file__).resolve().parents[2]


def suites(passed: int) -> dict:
    return {"horovod": "0.28.1", "suites": [
        {"suite": "parallel/test_torch.py", "ranks": 2, "passed": passed, "failed": 3,
         "skipped": 12, "hung": False, "seconds": 21.0,
         "failures": ["test_optimizer_no_named_parameters"]}]}


def test_a_record_says_what_was_measured_on_what_and_how(tmp_path: Path):
    path = records.write(tmp_path, "horovod-suites", suites(100), "python x.py")
    record = json.loads(path.read_text())
    assert record["kind"] == "horovod-suites" and record["command"] == "python x.py"
    assert record["machine"]["cores"] >= 1 and record["machine"]["versions"]["python"]
    assert record["figures"] == suites(100)
    assert records.latest(tmp_path, "horovod-suites") == record
    assert records.latest(tmp_path, "bench") is None


def test_the_newest_record_fills_its_block_and_check_sees_stale_docs(tmp_path: Path):
    folder, docs = tmp_path / "records", tmp_path / "docs"
    docs.mkdir()
    doc = docs / "api.md"
    doc.write_text("# API\n\n<!-- records:horovod-suites -->\nold\n"
                   "<!-- /records:horovod-suites -->\n\nafter\n")
    first = records.write(folder, "horovod-suites", suites(99), "cmd")
    newest = json.loads(first.read_text())
    newest["time"], newest["figures"] = "2999-01-01T00:00:00+00:00", suites(100)
    (folder / "horovod-suites-29990101T000000Z.json").write_text(json.dumps(newest))
    argv = ["--records", str(folder), "--docs", str(docs)]
    assert render.main([*argv, "--check"]) == 1
    assert render.main(argv) == 0
    text = doc.read_text()
    assert "| parallel/test_torch.py | 2 | Keras 3 | 100 | 3 | 12 | no | 21 | " \
           "test_optimizer_no_named_parameters |" in text, text
    assert "| 99 |" not in text and "old" not in text and text.endswith("\n\nafter\n")
    assert "Measured 2999-01-01" in text and "with `cmd`" in text
    assert render.main([*argv, "--check"]) == 0  # rendering again changes nothing


def test_a_gpu_run_against_ddp_renders_its_table(tmp_path: Path):
    """The figures bench_gpu.py's against_ddp writes (horovodish.bench.training's
    against_ddp rows, per_call's rows) become the GPU page's table; a failed model is
    named, not dropped."""
    ours, ddp, plain = "horovodish DistributedOptimizer", "torch DDP (nccl)", "no communication"
    row = {"ms_per_step": {ours: 40.4, ddp: 40.2, plain: 39.0},
           "added_us_per_tensor": {ours: 8.7, ddp: 7.5}, "ours_over_ddp_step": 1.005,
           "target": 1.01, "met": True}
    call = {"bytes": 4096, "ours_s": 60e-6, "theirs_s": 40e-6, "ours_over_theirs_s": 1.5,
            "ours_over_theirs_host_s": 1.8}
    figures = {"ranks": 2, "device": "a GPU", "against_ddp": {
        "resnet50_batch32": row, "resnet50_batch128": {"error": "OutOfMemoryError: x"},
        "per_call": {"rows": [call]}}}
    records.write(tmp_path, "gpu-against-ddp-2-ranks", figures, "bash run_on_gpu.sh")
    text = render.render_text("<!-- records:gpu-against-ddp-2-ranks -->\n"
                              "<!-- /records:gpu-against-ddp-2-ranks -->\n", tmp_path)
    assert "2 rank(s) on a GPU" in text, text
    assert "| resnet50_batch32 | 39.00 | 40.20 | 40.40 | 1.005 | 7.5 | 8.7 | met |" in text
    assert "| resnet50_batch128 | - | - | - | - | - | - | OutOfMemoryError: x |" in text
    assert "| many_tensors_batch32 | - | - | - | - | - | - | not measured |" in text
    assert "| 4096 | 60.0 | 40.0 | 1.50× | 1.80× |" in text, text


def test_the_collectives_sweep_renders_first_calls_against_mpi_allocating_its_output(
        tmp_path: Path):
    """Each path's ratio to MPI with its first call over its later ones; then, for the
    out-of-place paths, their first call over MPI's first call into a fresh output. A
    record from before that baseline renders without the second table."""
    row = {"op": "allgather", "bytes": 1 << 20, "mpi_s": 2e-3,
           "paths": {"allgather": {"seconds": 1e-3, "ratio_to_mpi": 2.0}},
           "first_call_s": {"allgather": 4e-3, "MPI": 3e-3, "MPI, fresh output": 8e-3},
           "first_over_later": {"allgather": 4.0, "MPI": 1.5},
           "first_over_mpi_fresh": {"allgather": 0.5}}
    records.write(tmp_path, "collectives-2-ranks", {"ranks": 2, "rounds": 3, "rows": [row]},
                  "horovodishrun -np 2 python -m horovodish.bench.collectives")
    block = "<!-- records:collectives-2-ranks -->\n<!-- /records:collectives-2-ranks -->\n"
    text = render.render_text(block, tmp_path)
    assert "| allgather: allgather | 2.00 (4.0x) |" in text, text
    assert "| MPI's own first call over its later ones (median over ops) | (1.5x) |" in text
    assert "allocates its output" in text and text.count("| allgather: allgather |") == 2, text
    assert "| allgather: allgather | 0.50 |" in text, text
    del row["first_over_mpi_fresh"]
    older = tmp_path / "older"
    records.write(older, "collectives-2-ranks", {"ranks": 2, "rounds": 3, "rows": [row]}, "x")
    text = render.render_text(block, older)
    assert text.count("| allgather: allgather |") == 1 and "allocates its output" not in text, text


def test_bench_runs_at_each_size_keep_their_kind_and_sum_up_by_rank_count(tmp_path: Path):
    """A 1-rank run is a record of its own kind (the 2-rank tables stay the reference
    run's); the history block lists every run, and the median and range of the newest
    runs (render.SUMMARY_RUNS) per rank count."""
    def figures(ranks: int, over_ddp: float, added: float) -> dict:
        return {"ranks": ranks, "training": {"over_ddp": over_ddp},
                "many_tensors": {"ours_added_over_ddp_added": added,
                                 "sharded": {"ours_added_over_ddp_added": 0.1}}}
    assert records.bench_kind(2) == "bench" and records.bench_kind(1) == "bench-1-ranks"
    assert render.SUMMARY_RUNS == 3
    for i, (ranks, over, added) in enumerate([(2, 1.1, 0.9), (2, 1.4, 0.2), (2, 1.6, 0.3),
                                               (2, 1.5, 0.1), (1, 1.2, 0.45)]):
        path = records.write(tmp_path, records.bench_kind(ranks), figures(ranks, over, added),
                             f"run {i}")
        record = json.loads(path.read_text())
        record["time"] = f"2999-01-0{i + 1}T00:00:00+00:00"  # (written in one second)
        path.unlink()
        (tmp_path / f"{record['kind']}-2999010{i + 1}T000000Z.json").write_text(
            json.dumps(record))
    assert records.latest(tmp_path, "bench")["command"] == "run 3"
    assert records.latest(tmp_path, "bench-1-ranks")["command"] == "run 4"
    assert [r["command"] for r in records.load_bench_runs(tmp_path)] == \
        ["run 0", "run 1", "run 2", "run 3", "run 4"]
    text = render.render_text("<!-- records:bench-history -->\n"
                              "<!-- /records:bench-history -->\n", tmp_path)
    assert "| 2999-01-05 00:00 | 1 | " in text and "| 1.20 | 0.45 | 0.10 | - |" in text, text
    assert "| 2999-01-01 00:00 | 2 | " in text and "| 1.10 | 0.90 |" in text  # listed, and
    # left out of the summary, which is over the newest three runs at 2 ranks
    assert "| 2 | MLP step, DDP's time / ours | 3 | 1.50 | 1.40 to 1.60 | ≥ 1.5 |" in text
    assert "| 1 | MLP step, DDP's time / ours | 1 | 1.20 | 1.20 to 1.20 | - |" in text, text
    assert "| 2 | 162 tensors: our added host time / DDP's | 3 | 0.20 | 0.10 to 0.30 | ≤ 0.6 |" \
        in text
    assert "| 1 | 162 tensors: our added host time / DDP's | 1 | 0.45 | 0.45 to 0.45 | ≤ 0.5 |" \
        in text
    assert "JAX step" not in text.split("Median and range")[1], "no JAX figure: no row"


def test_the_committed_docs_are_what_the_committed_records_give():
    assert render.main(["--check", "--records", str(REPO / "docs" / "records"),
                        "--docs", str(REPO / "docs")]) == 0
