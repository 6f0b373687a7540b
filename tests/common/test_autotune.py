"""Autotune: online tuning leaves a bad start for its best measured candidate; the sampler
logic in isolation."""
from __future__ import annotations

import csv
from pathlib import Path

from horovodish.common.autotune import CYCLE_CANDIDATES_MS, FUSION_CANDIDATES, Autotuner, Params
from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "autotune_worker.py"


def test_autotune_from_bad_start_picks_its_best_measured_candidate_and_logs(tmp_path: Path):
    log = tmp_path / "autotune.csv"
    result = run_ranks(WORKER, 2, args=[str(log)], timeout=150,
                       env={"HOROVODISH_AUTOTUNE": "1"})
    assert_ranks_ok(result, 2, ["tuning_finishes", "the_best_measured_choice_on_every_rank"])
    rows = list(csv.DictReader(log.open()))
    assert len(rows) >= len(FUSION_CANDIDATES) + len(CYCLE_CANDIDATES_MS)
    assert {int(r["fusion_threshold"]) for r in rows} == set(FUSION_CANDIDATES)
    assert all(float(r["bytes_per_second"]) > 0 for r in rows)


def test_sampler_picks_the_best_candidate_per_parameter():
    # Throughput as a function of the parameters: best at 4 MiB and 2.5 ms.
    def rate(p: Params) -> float:
        return 1e9 / (1 + abs(p.fusion_threshold - 4 * 2**20) / 2**20) / (1 + abs(p.cycle_time_ms - 2.5))

    tuner = Autotuner(Params(0, 50.0), tune_fusion=True, tune_cycle=True, window_seconds=1.0,
                      windows_per_candidate=1, warmup_windows=0)
    now, current = 0.0, tuner.current
    for _ in range(1000):
        if tuner.done:
            break
        now += 1.0
        choice = tuner.record(int(rate(current)), now)
        if choice is not None:
            current = choice
    assert tuner.done and current == Params(4 * 2**20, 2.5)


def test_explicit_values_are_left_alone():
    tuner = Autotuner(Params(1024, 1.0), tune_fusion=False, tune_cycle=False)
    assert tuner.done and tuner.record(100, 1.0) is None
