"""horovodish.jax on real ranks: every collective against numpy (1 and 3 ranks), every
dtype (float64 and int64 with x64 on; uint32 and uint64 reduced and moved; PRNG keys moved),
pytrees as one entry per dtype, mismatch and jit errors, DistributedOptimizer against plain
optax on the whole batch, a rank outside a process set, elastic state (sync, commit,
restore, a retry in the same processes); the digits example on 2 ranks."""
from __future__ import annotations

from pathlib import Path

import pytest

from multirank import assert_digits_example, assert_ranks_ok, run_ranks

WORKER = Path(__file__).parent / "workers" / "jax_worker.py"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CHECKS = ["collectives", "pytrees", "errors", "training_equals_one_process",
          "outside_the_set", "x64_and_every_dtype", "elastic_state"]


@pytest.mark.parametrize("np", [1, 3])
def test_collectives_pytrees_and_training(np):
    assert_ranks_ok(run_ranks(WORKER, np, timeout=240), np, CHECKS)


def test_jax_digits_reaches_95_percent_on_2_ranks():
    assert_digits_example(run_ranks(EXAMPLES / "jax_digits.py", 2, args=["--epochs", "20"],
                                    timeout=240), 2)
