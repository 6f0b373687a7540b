"""Sharded optimizer state (ZeRO), tests/torch/workers/zero_worker.py: the same model as
plain torch and the replicated DistributedOptimizer after 20 float64 steps on 2, 3 and 4
ranks for SGD with momentum, Adam, AdamW and Adagrad; a checkpoint saved on 2 ranks
continues identically on 3."""
from __future__ import annotations

from pathlib import Path

from multirank import assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "zero_worker.py"
CHECKS = ["sharded_matches_replicated", "stage_one_accumulation_and_clipping",
          "state_memory", "state_dicts_and_broadcast", "overlap_and_storage",
          "deferred_parameter_gather", "errors"]


def test_sharded_optimizer_on_2_and_3_ranks_with_a_checkpoint_from_2_to_3(tmp_path):
    env = {"ZERO_CHECKPOINT_DIR": str(tmp_path)}
    saved = run_ranks(WORKER, 2, args=[*CHECKS, "checkpoint_save"], env=env, timeout=240)
    assert_ranks_ok(saved, 2, [*CHECKS, "checkpoint_save"])
    # Three ranks: what depends on how shards fall (uneven ranges), not the rest again.
    uneven = ["sharded_matches_replicated", "stage_one_accumulation_and_clipping",
              "state_dicts_and_broadcast", "checkpoint_load"]
    loaded = run_ranks(WORKER, 3, args=uneven, env=env, timeout=240)
    assert_ranks_ok(loaded, 3, uneven)


def test_sharded_optimizer_on_4_ranks():
    """Four ranks on the test machine's cores: the equivalence checks only (an empty
    shard: the last bias has 3 values)."""
    checks = ["sharded_matches_replicated"]
    result = run_ranks(WORKER, 4, args=checks, env={"ZERO_BUCKET_CAPS": "0"}, timeout=240)
    assert_ranks_ok(result, 4, checks)


def test_zero_compare_example_runs():
    """examples/pytorch_zero_compare.py on a small MLP: every contender's line, and the
    sharded and replicated optimizers end on the same weights."""
    import re

    from multirank import assert_ok
    example = Path(__file__).parents[2] / "examples" / "pytorch_zero_compare.py"
    result = run_ranks(example, 2, args=["--widths", "64,96,10", "--rounds", "2",
                                         "--steps", "2", "--warmup", "1"], timeout=180)
    assert_ok(result)
    for kind in ("replicated", "sharded", "torch-zero"):
        assert re.search(rf"^{kind} +step +[\d.]+ ms .* peak memory per rank \d+, \d+ MiB$",
                         result.stdout, re.MULTILINE), result.stdout
    match = re.search(r"largest weight difference, replicated vs sharded: (\S+)",
                      result.stdout)
    assert match and float(match.group(1)) < 1e-6, result.stdout
