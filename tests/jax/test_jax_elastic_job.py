"""A JAX elastic job under horovodishrun --min-np (tests/jax/workers/elastic_job_worker.py):
rank 1 of 3 is SIGKILLed mid-epoch, the job goes on from its last commit on the 2 ranks
left, and the final float64 parameters equal a numpy replay of the global batch schedule
to 1e-9; nothing committed is lost and every batch of every epoch runs exactly once."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from multirank import assert_ranks_ok, run_ranks

WORKERS = Path(__file__).parent / "workers"
sys.path.insert(0, str(WORKERS))


def replay(log_dir: Path) -> dict[str, np.ndarray]:
    """Softmax regression and SGD with momentum as optax does it (trace t = g + m t,
    update -lr t), in one process on the global batches."""
    from elastic_job_worker import (EPOCHS, LR, MOMENTUM, digits, global_batch,
                                    steps_per_epoch)
    x, y = digits()
    params = dict(np.load(log_dir / "initial.npz"))
    trace = {key: np.zeros_like(value) for key, value in params.items()}
    for epoch in range(EPOCHS):
        for batch in range(steps_per_epoch(len(x))):
            idx = global_batch(epoch, batch, len(x))
            logits = x[idx] @ params["w"] + params["b"]
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(len(idx)), y[idx]] -= 1
            grads = {"w": x[idx].T @ p / len(idx), "b": p.mean(axis=0)}
            for key in params:
                trace[key] = grads[key] + MOMENTUM * trace[key]
                params[key] = params[key] - LR * trace[key]
    return params


def test_a_killed_rank_and_the_job_goes_on_from_its_last_commit(tmp_path):
    result = run_ranks(WORKERS / "elastic_job_worker.py", 3, args=[tmp_path, 1],
                       launcher_args=["--min-np", "2"], timeout=150)
    assert_ranks_ok(result, 2, ["same_model_everywhere"])
    assert "generation 1 ended: rank 1 on localhost was killed by SIGKILL" in result.stdout
    assert "generation 2 on 2 ranks (localhost:2)" in result.stdout, result.stdout
    logs = {g: [json.loads(line) for line in (tmp_path / f"g{g}-r0.jsonl").read_text()
                .splitlines()] for g in (1, 2)}
    resume = [r for r in logs[2] if r["kind"] == "resume"]
    last_commit = [r for r in logs[1] if r["kind"] == "commit"][-1]
    assert len(resume) == 1 and resume[0]["size"] == 2
    assert (resume[0]["epoch"], resume[0]["batch"], resume[0]["seq"]) == \
        (last_commit["epoch"], last_commit["batch"], last_commit["seq"]) == (0, 10, 2)
    # Batches 11 and 12 ran and were rolled back; each batch of the schedule ran once.
    done = [(r["epoch"], r["batch"]) for r in logs[1] if r["kind"] == "step"]
    assert done[-2:] == [(0, 11), (0, 12)]
    survived = done[:10] + [(r["epoch"], r["batch"]) for r in logs[2] if r["kind"] == "step"]
    steps = max(b for _, b in survived)
    assert survived == [(e, b) for e in range(2) for b in range(1, steps + 1)], survived
    final = np.load(tmp_path / "final.npz")
    for key, want in replay(tmp_path).items():
        np.testing.assert_allclose(final[key], want, rtol=1e-9, atol=1e-12, err_msg=key)
