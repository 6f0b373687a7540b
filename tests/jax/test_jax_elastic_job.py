"""A JAX elastic job under horovodishrun --min-np (tests/jax/workers/elastic_job_worker.py):
rank 1 of 3 is SIGKILLed mid-epoch, the job goes on from its last commit on the 2 ranks
left, and the final float64 parameters equal a numpy replay of the global batch schedule
to 1e-9; nothing committed is lost and every batch of every epoch runs exactly once."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from elastic_replay import assert_batches_went_on_from_the_last_commit
from multirank import run_ranks

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
    assert_batches_went_on_from_the_last_commit(result, tmp_path)
    final = np.load(tmp_path / "final.npz")
    for key, want in replay(tmp_path).items():
        np.testing.assert_allclose(final[key], want, rtol=1e-9, atol=1e-12, err_msg=key)
