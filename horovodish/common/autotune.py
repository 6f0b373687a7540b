"""Autotune: pick the fusion threshold and cycle time that move the most bytes per second.

Runs on rank 0 only. It scores each candidate by the allreduce bytes per second measured
over a sampling window of real training, tunes one parameter at a time (fusion threshold,
then cycle time), and then keeps the best. Decisions reach the other ranks through the
coordinator's broadcast (controller.py), and every rank applies them at the same cycle, so
fusion stays identical everywhere. Parameters the user set explicitly are left alone.
"""
from __future__ import annotations

import csv
import logging
import time
from dataclasses import dataclass

log = logging.getLogger("horovodish")

MiB = 1024 * 1024
FUSION_CANDIDATES = [0, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 128 * MiB]
CYCLE_CANDIDATES_MS = [0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0]


@dataclass(frozen=True)
class Params:
    fusion_threshold: int
    cycle_time_ms: float


class Autotuner:
    def __init__(self, start: Params, tune_fusion: bool, tune_cycle: bool,
                 log_path: str | None = None, window_seconds: float = 0.25,
                 windows_per_candidate: int = 2, warmup_windows: int = 1) -> None:
        self.current = start
        self.best = start
        self.window_seconds = window_seconds
        self.windows_per_candidate = windows_per_candidate
        self._plan: list[tuple[str, list]] = []
        if tune_fusion:
            self._plan.append(("fusion_threshold", FUSION_CANDIDATES))
        if tune_cycle:
            self._plan.append(("cycle_time_ms", CYCLE_CANDIDATES_MS))
        self._candidates: list[Params] = []
        self._scores: dict[Params, list[float]] = {}
        self._warmup = warmup_windows
        self._window_start = 0.0
        self._bytes = 0
        self.samples = 0
        self.done = not self._plan
        self._log_file = open(log_path, "w", newline="") if log_path else None
        self._csv = csv.writer(self._log_file) if self._log_file else None
        if self._csv:
            self._csv.writerow(["sample", "fusion_threshold", "cycle_time_ms", "bytes",
                                "seconds", "bytes_per_second"])
        self._start_parameter()

    def _start_parameter(self) -> None:
        if not self._plan:
            self.done = True
            return
        field, values = self._plan.pop(0)
        self._candidates = [Params(**{**self.best.__dict__, field: v}) for v in values]

    def record(self, nbytes: int, now: float | None = None) -> Params | None:
        """Account one cycle's reduced bytes; returns new parameters when it switches."""
        if self.done or nbytes == 0 and self._bytes == 0:
            return None
        now = time.perf_counter() if now is None else now
        if self._bytes == 0 and self._window_start == 0.0:
            self._window_start = now
        self._bytes += nbytes
        elapsed = now - self._window_start
        if elapsed < self.window_seconds:
            return None
        rate = self._bytes / elapsed
        self._log(elapsed, rate)
        self._bytes, self._window_start = 0, now
        if self._warmup > 0:
            self._warmup -= 1
            return None
        scores = self._scores.setdefault(self.current, [])
        scores.append(rate)
        if len(scores) < self.windows_per_candidate:
            return None
        return self._next()

    def _next(self) -> Params | None:
        untried = [c for c in self._candidates if c not in self._scores]
        if untried:
            self.current = untried[0]
            self._window_start = 0.0
            return self.current
        self.best = max(self._candidates, key=lambda c: _mean(self._scores[c]))
        self._start_parameter()
        if self.done:
            log.info("autotune chose fusion threshold %d bytes, cycle time %g ms",
                     self.best.fusion_threshold, self.best.cycle_time_ms)
            if self._log_file:
                self._log_file.close()
            self.current = self.best
            return self.best
        return self._next()

    def _log(self, seconds: float, rate: float) -> None:
        self.samples += 1
        if self._csv:
            self._csv.writerow([self.samples, self.current.fusion_threshold,
                                self.current.cycle_time_ms, self._bytes, f"{seconds:.6f}",
                                f"{rate:.1f}"])
            self._log_file.flush()


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
