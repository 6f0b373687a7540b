"""Timeline: valid Chrome-trace JSON during and after a run, rows with the phases."""
from __future__ import annotations

from pathlib import Path

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "timeline_worker.py"


def test_timeline_from_environment(tmp_path: Path):
    path = tmp_path / "timeline.json"
    result = run_ranks(WORKER, 2, args=["env", str(path)],
                       env={"HOROVODISH_TIMELINE": str(path)})
    assert_ranks_ok(result, 2, ["torch_names_soon_in_the_file", "phases_while_running",
                                "single_tensors_by_size", "valid_after_shutdown"])


def test_dynamic_timeline_holds_only_what_ran_between_start_and_stop(tmp_path: Path):
    path = tmp_path / "dynamic.json"
    result = run_ranks(WORKER, 2, args=["dynamic", str(path)],
                       env={"HOROVODISH_TIMELINE": "DYNAMIC"})
    assert_ranks_ok(result, 2, ["only_between_start_and_stop"])
    assert path.exists()


def test_no_file_when_off(tmp_path: Path):
    path = tmp_path / "never.json"
    result = run_ranks(WORKER, 2, args=["off", str(path)])
    assert_ranks_ok(result, 2, ["runs_without_a_timeline"])
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_timeline_fails_init_on_every_rank(tmp_path: Path):
    """Rank 0 alone raised, after its runtime thread had started; the others hung."""
    path = tmp_path / "missing" / "timeline.json"
    result = run_ranks(WORKER, 2, args=["unwritable", str(path)],
                       env={"HOROVODISH_TIMELINE": str(path)}, timeout=60)
    assert_ranks_ok(result, 2, ["init_fails_on_every_rank"])
