"""The bench's JAX step (horovodish/bench/jax_training.py) runs on 2 ranks, JAX's own
multi-process collectives started beside horovodish, on a small MLP; its figures are
consistent and render from a record (its speed is the bench's business, not this
test's)."""
from __future__ import annotations

import json
from pathlib import Path

from multirank import assert_ok, run_ranks

from horovodish.bench import records, render

CONTENDERS = {"horovodish DistributedOptimizer", "jax.distributed (gloo) pmean",
              "no communication"}
SCRIPT = """import json, sys
from mpi4py import MPI
from horovodish.common import api
from horovodish.bench.jax_training import available, jax_training_step
api.init()
assert available()
figures = jax_training_step(MPI.COMM_WORLD, widths=[64, 32, 10], batch=16, rounds=2,
                            budget=0.05)
if MPI.COMM_WORLD.Get_rank() == 0:
    open(sys.argv[1], "w").write(json.dumps(figures))
api.shutdown()
"""


def test_the_jax_step_runs_and_renders(tmp_path: Path):
    script, out = tmp_path / "jax_step.py", tmp_path / "jax_step.json"
    script.write_text(SCRIPT)
    assert_ok(run_ranks(script, 2, args=[out], timeout=120))
    step = json.loads(out.read_text())
    assert step["widths"] == [64, 32, 10] and step["batch_per_rank"] == 16
    assert set(step["steps_per_s"]) == CONTENDERS
    assert all(rate > 0 for rate in step["steps_per_s"].values())
    low, high = step["over_jax_range"]
    assert 0 < low <= step["over_jax"] <= high
    assert step["ours_over_bound"] > 0 and step["jax_over_bound"] > 0
    folder = tmp_path / "records"
    records.write(folder, "bench", {"ranks": 2, "jax_training": step},
                  "horovodishrun -np 2 python -m horovodish.bench")
    doc = render.render_text("<!-- records:bench-jax -->\n<!-- /records:bench-jax -->\n", folder)
    assert f"horovodish / jax.distributed: {step['over_jax']:.2f}×" in doc, doc
    for name, rate in step["steps_per_s"].items():
        assert f"| {name} | {rate:.1f} |" in doc, doc
    assert "JAX training step, MLP 64-32-10" in render.render_text(
        "<!-- records:bench -->\n<!-- /records:bench -->\n", folder)
