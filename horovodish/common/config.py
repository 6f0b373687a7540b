"""Configuration read from the environment.

Every knob is ``HOROVODISH_<NAME>``; Horovod's ``HOROVOD_<NAME>`` is accepted as a fallback
so existing job scripts keep working. A value that does not parse raises ``ValueError``
naming the variable, at ``init()``, rather than being silently ignored.
"""
from __future__ import annotations

import math

import os
from dataclasses import dataclass, field
from typing import Callable, Mapping, TypeVar

T = TypeVar("T")

LOG_LEVELS = ("trace", "debug", "info", "warning", "error")
CPU_OPERATIONS = ("mpi", "ring", "shm")
GPU_OPERATIONS = ("nccl", "mpi")

# A single tensor from this many bytes on goes to our ring (below: shared memory on one
# host, else MPI). Measured with `python -m horovodish.bench.backends` on 2 ranks: from
# 4 MiB the ring took 0.4 to 0.9 of shared memory's time (docs/tuning.md, "Backends").
DEFAULT_RING_THRESHOLD = 4 * 1024 * 1024


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected 1/0, true/false, yes/no or on/off")


def _non_negative(parse: Callable[[str], T]) -> Callable[[str], T]:
    def parse_checked(text: str) -> T:
        value = parse(text)
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise ValueError("must be a finite number")  # nan compares false with < 0
        if value < 0:  # type: ignore[operator]
            raise ValueError("must be >= 0")
        return value
    return parse_checked


def _positive(parse: Callable[[str], T]) -> Callable[[str], T]:
    non_negative = _non_negative(parse)

    def parse_checked(text: str) -> T:
        value = non_negative(text)
        if not value:
            raise ValueError("must be > 0")
        return value
    return parse_checked


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse_choice(text: str) -> str:
        value = text.strip().lower()
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return value
    return parse_choice


def _read(env: Mapping[str, str], name: str, parse: Callable[[str], T], default: T) -> T:
    """Read HOROVODISH_<name>, else HOROVOD_<name>, else the default."""
    for prefix in ("HOROVODISH_", "HOROVOD_"):
        key = prefix + name
        if key in env:
            raw = env[key]
            try:
                return parse(raw)
            except ValueError as exc:
                raise ValueError(f"{key}={raw!r} is invalid: {exc}") from None
    return default


@dataclass(frozen=True)
class Config:
    """The runtime's tunables; see docs/configuration.md for each one."""

    fusion_threshold: int = 128 * 1024 * 1024
    cycle_time_ms: float = 1.0
    cache_capacity: int = 1024
    cpu_operations: str | None = None
    gpu_operations: str | None = None
    gpu_allreduce: str | None = None
    ring_threshold: int = DEFAULT_RING_THRESHOLD
    # Bytes a rank may receive when small steady allreduces ride on the negotiation
    # (negotiation/eager_plan.py); 0: never.
    eager_limit: int = 128 << 10
    timeline: str | None = None
    timeline_mark_cycles: bool = False
    stall_check_disable: bool = False
    stall_check_time: float = 60.0
    stall_shutdown_time: float = 0.0
    autotune: bool = False
    autotune_log: str | None = None
    log_level: str = "warning"
    dynamic_process_sets: bool = False
    caller_runs: bool = True
    # Across hosts: True/False force the two-level allreduce (allgather) on or off;
    # None lets the backend choose by topology and size (docs/multihost.md).
    hierarchical_allreduce: bool | None = None
    hierarchical_allgather: bool | None = None
    # Seconds without a heartbeat from a neighbouring host before the job ends (0: never).
    heartbeat_timeout: float = 30.0
    # Seconds every rank has to reach the job's PMI server under a launcher that is not
    # MPI's own (common/world); the same for the ranks to meet in init().
    start_timeout: float = 60.0
    # Names of the variables the user set explicitly; autotune leaves those alone.
    explicit: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Config":
        env = os.environ if env is None else env
        non_negative_int = _non_negative(int)
        non_negative_float = _non_negative(float)
        explicit = frozenset(
            key.split("_", 1)[1] for key in env
            if key.startswith(("HOROVODISH_", "HOROVOD_"))
        )
        timeline = _read(env, "TIMELINE", str, "") or None
        return cls(
            fusion_threshold=_read(env, "FUSION_THRESHOLD", non_negative_int, cls.fusion_threshold),
            cycle_time_ms=_read(env, "CYCLE_TIME", non_negative_float, cls.cycle_time_ms),
            cache_capacity=_read(env, "CACHE_CAPACITY", non_negative_int, cls.cache_capacity),
            cpu_operations=_read(env, "CPU_OPERATIONS", _choice(CPU_OPERATIONS), None),
            gpu_operations=_read(env, "GPU_OPERATIONS", _choice(GPU_OPERATIONS), None),
            # Horovod's older knob, for allreduce alone (GPU_OPERATIONS covers every op).
            gpu_allreduce=_read(env, "GPU_ALLREDUCE", _choice(GPU_OPERATIONS), None),
            ring_threshold=_read(env, "RING_THRESHOLD", non_negative_int, DEFAULT_RING_THRESHOLD),
            eager_limit=_read(env, "EAGER_LIMIT", non_negative_int, cls.eager_limit),
            timeline=timeline,
            timeline_mark_cycles=_read(env, "TIMELINE_MARK_CYCLES", _parse_bool, False),
            stall_check_disable=_read(env, "STALL_CHECK_DISABLE", _parse_bool, False),
            stall_check_time=_read(env, "STALL_CHECK_TIME_SECONDS", non_negative_float, 60.0),
            stall_shutdown_time=_read(env, "STALL_SHUTDOWN_TIME_SECONDS", non_negative_float, 0.0),
            autotune=_read(env, "AUTOTUNE", _parse_bool, False),
            autotune_log=_read(env, "AUTOTUNE_LOG", str, "") or None,
            log_level=_read(env, "LOG_LEVEL", _choice(LOG_LEVELS), "warning"),
            dynamic_process_sets=_read(env, "DYNAMIC_PROCESS_SETS", _parse_bool, False),
            caller_runs=_read(env, "CALLER_RUNS", _parse_bool, True),
            hierarchical_allreduce=_read(env, "HIERARCHICAL_ALLREDUCE", _parse_bool, None),
            hierarchical_allgather=_read(env, "HIERARCHICAL_ALLGATHER", _parse_bool, None),
            heartbeat_timeout=_read(env, "HEARTBEAT_TIMEOUT", non_negative_float, 30.0),
            start_timeout=_read(env, "START_TIMEOUT", _positive(float), cls.start_timeout),
            explicit=explicit,
        )
