"""Keras model.fit with the elastic callbacks under horovodishrun --min-np: a rank is
SIGKILLed mid-epoch, the job goes on from the last commit on the ranks that are left,
and the final weights equal a numpy replay of the global batch schedule (float64, 1e-6);
nothing committed is lost and every batch of every epoch runs exactly once."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from elastic_replay import assert_batches_went_on_from_the_last_commit
from multirank import import_worker, run_ranks

WORKERS = Path(__file__).parent / "workers"


def replay(log_dir: Path) -> list[np.ndarray]:
    """Softmax regression, SGD with momentum as Keras does it, on the global batches."""
    job = import_worker(WORKERS / "elastic_fit_worker.py")
    x, y = job.digits()
    kernel, bias = np.load(log_dir / "initial.npz").values()
    velocity = [np.zeros_like(kernel), np.zeros_like(bias)]
    for epoch in range(job.EPOCHS):
        for batch in range(job.steps_per_epoch(len(x))):
            idx = job.global_batch(epoch, batch, len(x))
            logits = x[idx] @ kernel + bias
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(len(idx)), y[idx]] -= 1
            grads = [x[idx].T @ p / len(idx), p.mean(axis=0)]
            for i, (weight, grad) in enumerate(zip((kernel, bias), grads)):
                velocity[i] = job.MOMENTUM * velocity[i] - job.LR * grad
                weight += velocity[i]
    return [kernel, bias]


def test_fit_goes_on_after_a_killed_rank(tmp_path):
    result = run_ranks(WORKERS / "elastic_fit_worker.py", 3, args=[tmp_path, 1],
                       launcher_args=["--min-np", "2"], timeout=200)
    assert_batches_went_on_from_the_last_commit(result, tmp_path)
    final = list(np.load(tmp_path / "final.npz").values())
    for got, want in zip(final, replay(tmp_path)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
